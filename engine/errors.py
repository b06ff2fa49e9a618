"""The engine's one family of errors.

Callers (the job service) decide what to do by kind: ``retryable`` errors are transient (a lost commit race,
Spark unreachable); every other error is final and leaves the table unchanged. ``title`` is the short, stable
summary a problem document shows; the message is the specific detail.
"""

from __future__ import annotations

import re


class MergeServiceEngineError(Exception):
    """Root of every error the engine raises on purpose."""

    title = "Merge failed"
    retryable = False

    def __init__(self, *args: object, field: str | None = None) -> None:
        super().__init__(*args)
        self.field = field
        """Where in the merge the fault is, as the message names it first (``field: ...``): a field of the spec
        (``on``, ``when_matched[0].set.v``, ``source.query``, ``schema``) or the part of a SQL statement
        (``sql``, ``MERGE INTO``); None when the message names none. Callers read it here, never out of the
        message."""


# --- the spec and its resolution ---------------------------------------------------------------------------


class MergeSpecError(MergeServiceEngineError):
    """The merge cannot be valid: clause order, missing clauses, a malformed expression, bad SQL text."""

    title = "Invalid merge"


class MergeResolutionError(MergeSpecError):
    """A name or type does not resolve against the tables: unknown column, out-of-scope reference."""

    title = "Merge does not resolve"


class SchemaMismatchError(MergeSpecError):
    """Source and target schemas cannot be reconciled (e.g. incompatible types under schema evolution)."""

    title = "Schema mismatch"


class SourceError(MergeServiceEngineError):
    """The source cannot be read or converted (a missing path, a value that does not fit its column)."""

    title = "Invalid source"


class SourceRowError(SourceError):
    """An inline row value does not convert to its declared type."""

    title = "Invalid source row"

    def __init__(self, message: str, *, row: int, column: str, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.row = row
        self.column = column


# --- running the merge ---------------------------------------------------------------------------------------


class MultipleMatchError(MergeServiceEngineError):
    """Several source rows matched one target row (Delta's DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW)."""

    title = "Multiple source rows matched the same target row"


class DataCastError(MergeServiceEngineError):
    """A value does not fit the type it is cast to under ANSI rules: a target column's (store assignment), or the
    type an expression compares or computes it in."""

    title = "Value does not fit its type"


class MergeExecutionError(MergeServiceEngineError):
    """Spark failed the merge for a reason that is in the data or the query, not transient."""

    title = "Merge execution failed"


class MergeCancelledError(MergeServiceEngineError):
    """The caller asked to stop before the commit started."""

    title = "Merge cancelled"


class SparkUnavailableError(MergeServiceEngineError):
    """Spark Connect could not be reached or lost the session."""

    title = "Spark is unavailable"
    retryable = True


class StorageWriteError(MergeServiceEngineError):
    """The lake's storage could not be written: Spark's tasks failed with a system error (SQLSTATE class 58), or
    the engine's own writes (a deletion vector's file, the log) failed in a way that may pass (a full disk, a lost
    mount). Nothing was committed, and the storage may recover, so the merge is retried."""

    title = "Storage write failed"
    retryable = True


class AutoCdcIncompleteError(MergeServiceEngineError):
    """An AUTO CDC batch's target merge committed but its state table's merge did not: the job is run again, which
    finds the target's commit by its ``txn`` and finishes the state table."""

    title = "AUTO CDC batch half applied"
    retryable = True


# --- the Delta table layer -----------------------------------------------------------------------------------


class DeltaError(MergeServiceEngineError):
    """Root of the Delta table layer's errors."""

    title = "Delta table error"


class TableNotFoundError(DeltaError):
    title = "Table not found"


class UnsupportedTableFeatureError(DeltaError):
    """The table needs a reader or writer feature the engine does not implement."""

    title = "Unsupported table feature"


class AppendOnlyTableError(DeltaError):
    title = "Table is append-only"


class InvariantViolationError(DeltaError):
    """A row the merge would write breaks a rule the table declares: NOT NULL, a CHECK constraint, a column
    invariant or a CHAR/VARCHAR length (Delta's DeltaInvariantViolationException)."""

    title = "Table constraint violated"


class CommitFailedError(DeltaError):
    """The commit definitely did not land (nothing was written to the log)."""

    title = "Commit failed"


class CommitStorageError(CommitFailedError, StorageWriteError):
    """The log could not be written or read for a reason in the storage (a full disk, a lost mount) while
    committing: nothing was committed, and the storage may recover, so the merge is retried."""

    title = StorageWriteError.title
    retryable = True


class ConcurrentModificationError(CommitFailedError):
    """A commit that won the race conflicts with ours (Delta's WriteSerializable rules). Retry from a fresh
    snapshot."""

    title = "Concurrent modification"
    retryable = True


class ConcurrentAppendError(ConcurrentModificationError):
    title = "Concurrent append"


class ConcurrentDeleteReadError(ConcurrentModificationError):
    title = "Concurrent delete of a file read"


class ConcurrentDeleteDeleteError(ConcurrentModificationError):
    title = "Concurrent delete of a file removed"


class MetadataChangedError(ConcurrentModificationError):
    title = "Table metadata changed"


class ProtocolChangedError(ConcurrentModificationError):
    title = "Table protocol changed"


class ConcurrentTransactionError(ConcurrentModificationError):
    title = "Concurrent transaction with the same application id"


class CommitStateUnknownError(DeltaError):
    """The log write may or may not have landed (pyiceberg's distinction). Callers re-read the table before
    deciding; the txn action makes that safe."""

    title = "Commit state unknown"
    retryable = True


# --- reading Spark Connect's errors ---------------------------------------------------------------------------

_GRPC_CODE = re.compile(r"status = StatusCode\.(\w+)")
_GRPC_DETAILS = re.compile(r'details = "(.*?)"\s*$', re.MULTILINE)


def grpc_status(exc: BaseException) -> tuple[str, str] | None:
    """The gRPC status (code name, details) behind an error out of Spark Connect: from the ``grpc.RpcError`` in
    its chain of causes, else from the text grpc prints for one (``status = StatusCode.UNAVAILABLE``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        code, details = getattr(current, "code", None), getattr(current, "details", None)
        if callable(code) and callable(details):
            try:
                status, text = code(), details()
            except Exception:
                status, text = None, None
            if status is not None:
                return str(getattr(status, "name", status)), str(text or "")
        current = current.__cause__ or current.__context__
    text = str(exc)
    found = _GRPC_CODE.search(text)
    if found is None:
        return None
    details_found = _GRPC_DETAILS.search(text)
    return found.group(1), details_found.group(1) if details_found else ""


def raised_message(text: str, marker: str) -> str:
    """The message an error raised on purpose (``[MARKER] ...``), out of the text of Spark's error: Spark wraps
    it in its own class, state and stack trace, which say nothing to the caller."""
    message = text[text.index(marker) - 1 :]
    end = re.search(r"\s*SQLSTATE: \w+|\n\s*\n|\nJVM stacktrace:", message)
    return message[: end.start()] if end else message


def spark_error_message(exc: BaseException, limit: int = 1000) -> str:
    """One readable line for an error out of Spark Connect. A transport failure prints as grpc's multi-line
    repr, whose first line (``<_MultiThreadedRendezvous of RPC that terminated with:``) says nothing: its status
    code and details do. Spark's own errors keep their first line (``[CONDITION] message``)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if not first or first.startswith("<_") or "of RPC that terminated with" in first:
        status = grpc_status(exc)
        if status is not None:
            code, details = status
            first = f"{code}: {details}" if details else code
        elif not first:
            first = type(exc).__name__
    return first[:limit]
