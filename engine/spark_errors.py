"""Spark's errors translated into the engine's, by kind: data that does not fit, names that do not resolve,
cancellation, transport."""

from __future__ import annotations

from pyspark.errors import PySparkException

from engine.errors import (
    DataCastError,
    MergeCancelledError,
    MergeExecutionError,
    MergeResolutionError,
    MergeServiceEngineError,
    SparkUnavailableError,
    StorageWriteError,
    raised_message,
    spark_error_message,
)
from engine.store_assignment import CAST_OVERFLOW_MARKER


def translate_spark_error(exc: PySparkException) -> MergeServiceEngineError:
    """Spark's errors by kind: data that does not fit, names that do not resolve, cancellation, transport."""
    condition = ""
    for getter in ("getCondition", "getErrorClass"):
        fn = getattr(exc, getter, None)
        if fn is not None:
            try:
                condition = fn() or ""
            except Exception:
                condition = ""
            if condition:
                break
    text = str(exc).strip()
    first = spark_error_message(exc)
    if "OPERATION_CANCELED" in condition or "OPERATION_CANCELED" in text[:300]:
        return MergeCancelledError("The merge was cancelled while Spark was running it.")
    if CAST_OVERFLOW_MARKER in first:
        raised = raised_message(first, CAST_OVERFLOW_MARKER)
        return DataCastError(f"A value does not fit the type it is cast, compared or assigned to (ANSI): {raised}")
    if any(
        k in condition
        for k in (
            "CAST_OVERFLOW",
            "CAST_INVALID_INPUT",
            "NUMERIC_VALUE_OUT_OF_RANGE",
            "ARITHMETIC_OVERFLOW",
            "NUMERIC_OUT_OF_SUPPORTED_RANGE",
            "DATETIME_OVERFLOW",
        )
    ):
        return DataCastError(f"A value does not fit the type it is cast, compared or assigned to (ANSI): {first}")
    if condition.startswith(("UNRESOLVED_", "AMBIGUOUS_", "DATATYPE_MISMATCH", "INVALID_", "WRONG_NUM_ARGS")):
        return MergeResolutionError(first)
    if _is_storage_failure(exc, condition, text):
        cause = " (No space left on device)" if "No space left on device" in text else ""
        return StorageWriteError(f"Spark could not write the table's files{cause}: {first}")
    name = type(exc).__name__
    if name in ("SparkConnectGrpcException", "RetriesExceeded") and any(
        k in text for k in ("UNAVAILABLE", "Connection refused", "failed to connect", "Socket closed", "DEADLINE")
    ):
        return SparkUnavailableError(f"Spark Connect failed: {first}")
    if name == "AnalysisException":
        return MergeResolutionError(first)
    return MergeExecutionError(first)


def _is_storage_failure(exc: PySparkException, condition: str, text: str) -> bool:
    """A write that failed in the storage, not in the data: Spark's TASK_WRITE_FAILED or any SQLSTATE of class
    58 (system errors), or the operating system's own words for a full disk."""
    state = ""
    getter = getattr(exc, "getSqlState", None)
    if getter is not None:
        try:
            state = getter() or ""
        except Exception:
            state = ""
    return condition.startswith("TASK_WRITE_FAILED") or state.startswith("58") or "No space left on device" in text
