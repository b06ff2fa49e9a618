"""A Python client for the merge job API (``docs/client.md``): sync ``MergeClient``, async ``AsyncMergeClient``,
typed errors carrying the problem JSON, and a merge builder shaped like Delta's ``DeltaMergeBuilder``.

Needs only httpx: it imports nothing of the server (no engine, pyspark, sqlalchemy or fastapi), so an
integration can use it on its own.
"""

from service.client.builder import MergeBuilder, merge, rows_source, table_source
from service.client.errors import (
    ConflictError,
    FieldError,
    JobCancelledError,
    JobFailedError,
    MergeServiceError,
    NotFoundError,
    RateLimitedError,
    RefusedError,
    UnauthorizedError,
    UnavailableError,
    WaitTimeoutError,
)
from service.client.http import DEFAULT_URL, AsyncJobHandle, AsyncMergeClient, JobHandle, MergeClient, RetryPolicy
from service.client.jobs import Job
from service.client.signatures import CallbackSignatureError, verify_callback

__all__ = [
    "DEFAULT_URL",
    "AsyncJobHandle",
    "AsyncMergeClient",
    "CallbackSignatureError",
    "ConflictError",
    "FieldError",
    "Job",
    "JobCancelledError",
    "JobFailedError",
    "JobHandle",
    "MergeBuilder",
    "MergeClient",
    "MergeServiceError",
    "NotFoundError",
    "RateLimitedError",
    "RefusedError",
    "RetryPolicy",
    "UnauthorizedError",
    "UnavailableError",
    "WaitTimeoutError",
    "merge",
    "rows_source",
    "table_source",
    "verify_callback",
]
