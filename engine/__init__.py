"""The MERGE engine: Delta Lake's MergeIntoCommand design, with all data work on Spark through Spark Connect.

The service uses only what this module exports.
"""

from engine.command import run_merge
from engine.expressions import validate_spec
from engine.result import ALL_METRICS, COMMIT_METRICS, AppTransaction, MergeResult, Phase
from engine.source import rows_to_arrow
from engine.spark import connect
from engine.spec import (
    DeleteAction,
    InsertAction,
    MergeClause,
    MergeSpec,
    QuerySource,
    RowsSource,
    TableSource,
    UpdateAction,
)
from engine.sql import parse_merge_sql

__all__ = [
    "ALL_METRICS",
    "COMMIT_METRICS",
    "AppTransaction",
    "DeleteAction",
    "InsertAction",
    "MergeClause",
    "MergeResult",
    "MergeSpec",
    "Phase",
    "QuerySource",
    "RowsSource",
    "TableSource",
    "UpdateAction",
    "connect",
    "parse_merge_sql",
    "rows_to_arrow",
    "run_merge",
    "validate_spec",
]
