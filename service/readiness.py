"""/readyz's question to the job database, asked off the request thread pool and with a deadline.

A database that stops answering (a stalled server, a dropped network) would hold every thread that asks it; asked
from the request pool, enough /readyz callers (no token needed) would take all its threads and stall the whole
API. So one thread of its own asks, callers that arrive while a question is out wait for that same answer, and
each caller waits at most the deadline: then the answer is "did not answer within N s" (503), however long the
question itself stays stuck.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from service.errors import DatabaseUnavailableError


class JobDatabase(Protocol):
    def ping(self) -> None: ...

    def schema_at_head(self) -> bool: ...


Checks = dict[str, str]


class DatabaseReadiness:
    """The job database's readiness checks (``database``, ``schema``), one question at a time."""

    def __init__(self, database: JobDatabase, timeout_seconds: float) -> None:
        self.database = database
        self.timeout = timeout_seconds
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="readyz-database")
        self._lock = threading.Lock()
        self._asking: Future[Checks] | None = None

    def _ask(self) -> Checks:
        checks: Checks = {}
        try:
            self.database.ping()
            checks["database"] = "ok"
            checks["schema"] = "ok" if self.database.schema_at_head() else "not at the newest migration"
        except DatabaseUnavailableError as exc:
            checks["database"] = str(exc)
        return checks

    def _question(self) -> Future[Checks]:
        with self._lock:
            if self._asking is None or self._asking.done():
                self._asking = self._executor.submit(self._ask)
            return self._asking

    async def checks(self) -> Checks:
        """The answer to the question out at the call (or a new one), or the deadline's."""
        question = asyncio.wrap_future(self._question())
        try:
            return dict(await asyncio.wait_for(asyncio.shield(question), self.timeout))
        except TimeoutError:
            return {"database": f"The job database did not answer within {self.timeout:g} s"}

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
