"""The service's one family of errors. Routers turn them into problem documents; the worker decides by kind."""

from __future__ import annotations

import engine.errors as engine_errors


class ServiceError(Exception):
    """Root of every error the service raises on purpose."""


class JobNotFoundError(ServiceError):
    SHOWN = 64
    """How much of an unknown id the message repeats: an id is 26 characters, and a request may send any length."""

    def __init__(self, job_id: str) -> None:
        shown = job_id if len(job_id) <= self.SHOWN else f"{job_id[: self.SHOWN]}... ({len(job_id)} characters)"
        super().__init__(f"No merge job has the id {shown!r}.")
        self.job_id = job_id


class IdempotencyConflictError(ServiceError):
    def __init__(self, key: str, job_id: str) -> None:
        super().__init__(
            f"The Idempotency-Key {key!r} was already used for job {job_id} with a different request body."
        )
        self.key = key
        self.job_id = job_id


class InvalidTransitionError(ServiceError):
    """A state change the job's life cycle does not allow (e.g. finishing a job that is not running)."""


class LeaseLostError(ServiceError):
    """This worker's claim on the job ended (expired and taken over, or the job changed under it). Whatever it
    was doing must stop without touching the table or the row."""

    retryable = True
    title = "Worker lease lost"


class TxnTakenError(ServiceError):
    """The table holds the job's ``txn`` though no attempt of the job began a commit: the number came from
    another job database (one reset or restored, or another deployment's under the same app id)."""

    title = "Transaction number already taken"

    def __init__(self, app_id: str, version: int) -> None:
        super().__init__(
            f"The table already holds txn version {version} (or a later one) of the app id {app_id!r}, and no "
            "attempt of this job wrote it: another job database issued the same sequence numbers under this app "
            "id (a new or restored database, or another deployment's). The merge did not run and the table is "
            "unchanged; give this deployment an app id of its own (MERGE_SERVICE_APP_ID) and submit it again."
        )


class CancelRequestedError(ServiceError):
    """Raised from a safe point when the job's cancellation was requested."""

    title = "Merge cancelled"


class DatabaseUnavailableError(ServiceError):
    """The job database could not be reached or did not answer in time."""


class InvalidCursorError(ServiceError):
    pass


class RequestValidationProblem(ServiceError):
    """A submission that cannot be valid; ``field`` names the part of the body at fault."""

    def __init__(self, field: str, message: str, *, title: str = "Invalid merge") -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        self.title = title


class InvalidParameterProblem(RequestValidationProblem):
    """A query parameter that has the API's shape but cannot be valid (a table filter outside the lake); ``field``
    is ``query <name>``."""


class BatchAwaitsSparkError(engine_errors.AutoCdcIncompleteError):
    """An AUTO CDC batch's target took its commit but its state table has not, and Spark is away: only a run on
    Spark can finish it. The job is retried until Spark returns, past the attempt limit: failing it would leave the
    target changed and the table's next batch reading a state that lacks this one."""

    def __init__(self, target: str, why: str) -> None:
        super().__init__(
            f"The target {target} took this batch but its state table did not, and Spark is away ({why}). The job "
            "is retried until Spark returns, to finish the state table; the table's later batches wait for it."
        )
