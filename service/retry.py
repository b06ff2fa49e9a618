"""The retry policy: which failures are transient, and how long a job waits before its next attempt."""

from __future__ import annotations

import random

import engine.errors as engine_errors
from service.errors import DatabaseUnavailableError, LeaseLostError
from service.settings import Settings


def is_retryable(exc: BaseException) -> bool:
    """Transient failures only: what the engine marks retryable, a lost lease, the job database away, Spark
    Connect unreachable."""
    if isinstance(exc, LeaseLostError | DatabaseUnavailableError):
        # The commit waits for the job database to confirm the lease: without it the merge stopped before its
        # commit, and the next attempt (which looks for the job's txn first) is safe once the database is back.
        return True
    if isinstance(exc, engine_errors.MergeServiceEngineError):
        return bool(exc.retryable)
    # pyspark's own connection errors, if one escapes the engine unwrapped.
    if type(exc).__module__.startswith("pyspark.errors") or type(exc).__name__.startswith("SparkConnect"):
        text = str(exc)
        return any(s in text for s in ("UNAVAILABLE", "Connection refused", "failed to connect", "Deadline"))
    return False


def backoff_seconds(attempt: int, settings: Settings, rng: random.Random | None = None) -> float:
    """Exponential backoff with equal jitter: half the capped delay fixed, half random."""
    cap = min(settings.backoff_max_seconds, settings.backoff_base_seconds * 2 ** max(0, attempt - 1))
    return cap / 2 + (rng or random).uniform(0, cap / 2)
