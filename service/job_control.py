"""One running attempt as its threads share it: the heartbeats that renew its lease, the engine's safe points
that check the lease and the cancel flag, and interrupting Spark when the attempt must stop."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import structlog

from service.errors import CancelRequestedError, DatabaseUnavailableError, LeaseLostError
from service.jobs import Lease, Phase
from service.manager import JobManager
from service.runner import MergeRunner
from service.timeline import SEGMENTS, Timeline

log = structlog.get_logger(__name__)


class JobControl:
    """The cross-thread state of one running attempt: heartbeats, cancel and lease checks at safe points."""

    def __init__(
        self,
        manager: JobManager,
        lease: Lease,
        runner: MergeRunner,
        tag: str,
        interval: float,
        context: Mapping[str, Any],
    ) -> None:
        self.manager = manager
        self.lease = lease
        self.runner = runner
        self.tag = tag
        self.interval = interval
        self.context = dict(context)
        self.cancel_requested = False
        self.lease_lost = False
        self.commit_started = False
        self.commit_interruptible = False
        """The engine finds out after an interrupted commit whether it landed (``engines.commit_interruptible``)."""
        self.shutting_down = False
        self.timeline: Timeline | None = None
        """Where the attempt's time goes; the engine's phases are marked as they are reported."""
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._heartbeats, name=f"heartbeat-{lease.job_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=self.interval + 5)

    def abandon(self) -> None:
        """Stop renewing the lease of an attempt the stopping worker no longer waits for, so that it lapses and
        another worker takes the job even while this process lingers."""
        self._done.set()

    def on_progress(self, phase: str) -> None:
        """The engine's safe points. Raising here stops the merge; at ``committing`` it is the last chance. The
        job's time counts the phase from this call, but only once the phase is entered: a merge stopped here never
        spent time in it."""
        entered_at = datetime.now(UTC)
        with self._lock:
            if self.lease_lost:
                raise LeaseLostError(f"Job {self.lease.job_id} attempt {self.lease.attempt}: lease lost.")
            if self.cancel_requested:
                raise CancelRequestedError("cancel requested")
            if self.shutting_down:
                raise LeaseLostError("the worker is shutting down")
            try:
                cancel = self.manager.set_phase(self.lease, Phase(phase))
            except LeaseLostError:
                self.lease_lost = True
                raise
            except DatabaseUnavailableError as exc:
                # Before the commit a phase is progress to show: the attempt goes on while its lease lasts, as
                # its heartbeats do. The commit itself waits for the job database to confirm the lease.
                if phase == Phase.COMMITTING.value:
                    raise
                log.warning("could not record the phase; the job database is unavailable", phase=phase, error=repr(exc))
                cancel = False
            if cancel:
                self.cancel_requested = True
                raise CancelRequestedError("cancel requested")
            # The engine redoes a merge whose commit lost a race from a fresh snapshot: any phase after
            # "committing" means that commit ended without landing, and the attempt may be interrupted again.
            self.commit_started = phase == Phase.COMMITTING.value
        if self.timeline is not None and phase in SEGMENTS:
            self.timeline.mark(phase, entered_at)
        log.info("job phase", phase=phase)

    def interrupt(self, why: str) -> None:
        with self._lock:
            if self.commit_started and not self.commit_interruptible:
                return
            if why == "cancel":
                self.cancel_requested = True
            elif why == "shutdown":
                self.shutting_down = True
            else:
                self.lease_lost = True
        try:
            self.runner.interrupt(self.tag)
        except Exception as exc:
            log.warning("interrupting Spark operations failed", error=repr(exc))

    def _heartbeats(self) -> None:
        with structlog.contextvars.bound_contextvars(**self.context):
            while not self._done.wait(self.interval):
                try:
                    cancel = self.manager.heartbeat(self.lease)
                except LeaseLostError:
                    log.warning("lease lost; stopping the attempt")
                    self.interrupt("lease")
                    return
                except Exception as exc:  # the database is away: keep trying while the lease lasts
                    log.warning("heartbeat failed; will retry", error=repr(exc))
                    continue
                if cancel and not self.cancel_requested:
                    log.info("cancel requested; interrupting")
                    self.interrupt("cancel")
