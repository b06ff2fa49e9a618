"""A worker process for the crash, order and restart tests: the real Worker and job store, with a runner that
keeps each table's commits in a ledger file and honours a Delta-style ``txn`` (app id, version) the way the
engine does, so exactly-once can be checked across real processes killed with SIGKILL.

Environment: the ``MERGE_SERVICE_*`` settings, ``LEDGER_DIR``, ``CRASH_AT`` (JSON: target -> phase at which
the first attempt of a job on that target stops dead, waiting to be killed), ``STEP_SECONDS`` (time per phase).
With ``RUNNER=engine`` the real engine runs the merges (Spark at ``MERGE_SERVICE_SPARK_REMOTE``) and the same
crash points apply, ``after_commit`` being after the Delta log entry is written and before the job row is
updated: the harness for crash and order tests against real tables. Either runner holds a lock file per table
while an attempt runs and notes in ``LEDGER_DIR/violations`` any attempt that found it held.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.jobs import ClaimedJob
from service.logs import configure_logging
from service.runner import EngineRunner, TxnId
from service.settings import Settings
from service.worker import Worker
from tests.service.stand_in import StandInRunner, WrappedRunner

PHASES = ("preparing_source", "finding_touched_files", "writing", "committing")


@dataclass
class Result:
    table_version: int | None
    result: dict[str, int] = field(default_factory=lambda: {"num_affected_rows": 1})
    metrics: dict[str, int] = field(default_factory=lambda: {"numSourceRows": 1})
    already_applied: bool = False


def table_name(target_key: str) -> str:
    return target_key.strip("/").replace("/", "_")


def read_ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class LedgerRunner(StandInRunner):
    def __init__(self, directory: Path, crash_at: dict[str, str], step: float) -> None:
        self.dir = directory
        self.crash_at = crash_at
        self.step = step

    def _maybe_crash(self, job: ClaimedJob, phase: str) -> None:
        stop_dead(self.dir, job, phase, self.crash_at)

    def run(self, job: ClaimedJob, *, txn: TxnId, on_progress: Callable[[str], None], tag: str) -> Result:
        name = table_name(job.target_key)
        with alone_on_table(self.dir, job):
            for phase in PHASES:
                on_progress(phase)
                self._maybe_crash(job, phase)
                time.sleep(self.step)
            with open(self.dir / f"{name}.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                ledger_path = self.dir / f"{name}.ledger"
                entries = read_ledger(ledger_path)
                for version, entry in enumerate(entries):
                    if entry["app_id"] == txn.app_id and entry["txn"] == txn.version:
                        return Result(table_version=version, already_applied=True)
                if entries and entries[-1]["txn"] > txn.version:
                    violation(self.dir, f"{job.lease.job_id} (seq {txn.version}) ran after seq {entries[-1]['txn']}")
                with open(ledger_path, "a") as ledger:
                    ledger.write(
                        json.dumps(
                            {
                                "app_id": txn.app_id,
                                "txn": txn.version,
                                "job": job.lease.job_id,
                                "attempt": job.lease.attempt,
                            }
                        )
                        + "\n"
                    )
                    ledger.flush()
                    os.fsync(ledger.fileno())
                version = len(entries)
            self._maybe_crash(job, "after_commit")
            return Result(table_version=version)


def violation(directory: Path, text: str) -> None:
    with open(directory / "violations", "a") as f:
        f.write(text + "\n")


@contextmanager
def alone_on_table(directory: Path, job: ClaimedJob) -> Iterator[None]:
    """Hold the target's lock file while an attempt runs; finding it held means two jobs of one table ran at once
    (a process killed with SIGKILL lets go of it as it dies)."""
    with open(directory / f"{table_name(job.target_key)}.running", "a") as running:
        try:
            fcntl.flock(running, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            violation(directory, f"two jobs ran at once on {job.target_key} ({job.lease.job_id} among them)")
        yield


def stop_dead(directory: Path, job: ClaimedJob, phase: str, crash_at: dict[str, str]) -> None:
    """At the chosen point of a job's first attempt: leave a marker and wait to be killed."""
    if job.lease.attempt == 1 and crash_at.get(job.target_key) == phase:
        (directory / f"{job.lease.job_id}.{phase}").touch()
        while True:
            time.sleep(60)


class CrashingEngineRunner(WrappedRunner):
    """The real engine, stopping dead at a chosen phase (or right after its commit) on a job's first attempt, and
    noting a second job of one table running at once in ``violations``."""

    def __init__(self, inner: EngineRunner, directory: Path, crash_at: dict[str, str]) -> None:
        super().__init__(inner)
        self.dir = directory
        self.crash_at = crash_at

    def run(self, job: ClaimedJob, *, txn: TxnId, on_progress: Callable[[str], None], tag: str) -> Any:
        def progress(phase: str) -> None:
            on_progress(phase)
            stop_dead(self.dir, job, phase, self.crash_at)

        with alone_on_table(self.dir, job):
            result = self.inner.run(job, txn=txn, on_progress=progress, tag=tag)
            stop_dead(self.dir, job, "after_commit", self.crash_at)
        return result

    def warm_up(self) -> None:
        self.inner.warm_up()


def main() -> None:
    settings = Settings()
    configure_logging("WARNING")
    directory = Path(os.environ["LEDGER_DIR"])
    crash_at = json.loads(os.environ.get("CRASH_AT", "{}"))
    runner: LedgerRunner | CrashingEngineRunner
    if os.environ.get("RUNNER") == "engine":
        runner = CrashingEngineRunner(EngineRunner(settings), directory, crash_at)
    else:
        runner = LedgerRunner(directory, crash_at, float(os.environ.get("STEP_SECONDS", "0")))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    worker = Worker(settings, runner=runner)
    worker.start()
    stop.wait()
    worker.stop(timeout=float(os.environ.get("STOP_TIMEOUT", "0.5")))


if __name__ == "__main__":
    main()
