"""How a run is measured besides its wall time: peak memory of a process or of the Spark JVM, CPU seconds, and
the machine's load (other processes slow every peer)."""

from __future__ import annotations

import os
import threading
import traceback
from contextlib import suppress
from typing import Any


def peak_rss_bytes() -> int:
    """This process's own peak RSS (VmHWM). Unlike ru_maxrss it is not inherited from the process that spawned us."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def merge_error(exc: BaseException) -> dict[str, Any]:
    """A peer's answer for a merge that raised, called in its ``except``: the error, its traceback and the peak
    RSS the merge reached, as the report prints them for every peer alike."""
    return {
        "status": "error",
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": traceback.format_exc(),
        "peak_rss": peak_rss_bytes(),
    }


def tree_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process and its children (the Spark server JVM), or None."""
    if pid is None:
        return None
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for proc in procs:
        with suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


class PeakSampler:
    """Peak RSS of a process tree (the Spark JVM) while a block runs, sampled every 50 ms. The tree is listed
    once, at the start: listing it walks every process on the machine, CPU taken from the merge measured."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._procs: list[Any] = []

    def _rss(self) -> int:
        import psutil

        total = 0
        for proc in self._procs:
            with suppress(psutil.Error):
                total += proc.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            self._stop.wait(0.05)

    def __enter__(self) -> PeakSampler:
        if self.pid is not None:
            import psutil

            with suppress(psutil.Error):
                root = psutil.Process(self.pid)
                self._procs = [root, *root.children(recursive=True)]
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())
