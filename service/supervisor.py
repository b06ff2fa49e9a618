"""The supervisor of several API processes: uvicorn's, saying why a process it replaces went away.

uvicorn logs only "Child process [N] died", whether the process exited, was killed (the kernel's OOM killer
sends SIGKILL) or merely did not answer the supervisor's health ping in time, which a process still importing
the app on a loaded machine can miss: it is then killed and replaced. Here each replacement names its cause,
a process gets ``HEALTH_PING_SECONDS`` to answer, not uvicorn's 5, and one that dies while it is pinged is
replaced at once, not when the ping's time is up."""

from __future__ import annotations

import pickle
import signal
import time

import structlog
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess, Process

log = structlog.get_logger("merge-service.supervisor")
HEALTH_PING_SECONDS = 30
LIVENESS_SECONDS = 0.5
"""How often a process that has not yet answered its health ping is asked whether it is still alive."""


def exit_reason(exitcode: int | None, *, hung: bool, ping_seconds: float) -> str:
    """Why a process went away: ``hung`` when it was still running but did not answer the health ping."""
    if hung:
        return f"did not answer the supervisor's health ping within {ping_seconds:g} s, so it was killed"
    if exitcode is None:
        return "ended with an unknown status"
    if exitcode < 0:
        name = signal.Signals(-exitcode).name
        why = " (the kernel's out-of-memory killer sends it)" if -exitcode == signal.SIGKILL else ""
        return f"was killed by {name}{why}"
    if exitcode == STARTUP_FAILURE:
        return "failed to start (its log above says why)"
    return f"exited with status {exitcode}"


class ApiSupervisor(Multiprocess):
    """Restarts an API process that dies, as uvicorn does, and logs the cause."""

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set():
            return
        timeout = self.config.timeout_worker_healthcheck
        for idx, process in enumerate(self.processes):
            if process.process.is_alive() and answers_ping(process, timeout):
                continue
            # Asked after the ping: a process that died while it was pinged did not hang, and its exit says why.
            hung = process.process.is_alive()
            if hung:
                process.kill()
            process.join()
            reason = exit_reason(process.exitcode, hung=hung, ping_seconds=timeout)
            if process.exitcode == STARTUP_FAILURE:
                log.error("API process failed to start; stopping", pid=process.pid, reason=reason)
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            log.error("API process died; starting another", pid=process.pid, reason=reason)
            replacement = Process(self.config, self.sockets)
            replacement.start()
            self.processes[idx] = replacement


def answers_ping(process: Process, timeout: float) -> bool:
    """uvicorn's health ping, given up as soon as the process is gone: a dead process never answers, and waiting
    out the whole ``timeout`` for it would leave its place empty that long."""
    deadline = time.monotonic() + timeout
    try:
        process.parent_conn.send(b"ping")
        while True:
            if process.parent_conn.poll(min(LIVENESS_SECONDS, max(deadline - time.monotonic(), 0))):
                process.parent_conn.recv()
                return True
            if not process.process.is_alive() or time.monotonic() >= deadline:
                return False
    except (OSError, EOFError, pickle.UnpicklingError):
        return False
