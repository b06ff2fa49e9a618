"""The MERGE engine: Delta Lake's MergeIntoCommand design, with all data work on Spark through Spark Connect.

The service uses only what this module exports.

Each export is imported on first use: a process that needs only the spec or the Delta layer does not load
Spark Connect's client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.exports import lazy_exports

if TYPE_CHECKING:
    from engine.applied import find_applied
    from engine.auto_cdc.applied import find_applied_batch, half_applied_batch
    from engine.auto_cdc.run import run_auto_cdc, validate_auto_cdc
    from engine.auto_cdc.spec import AutoCdcSpec
    from engine.command import run_merge
    from engine.delta_connect import run_delta_merge
    from engine.inline_rows import rows_to_arrow
    from engine.result import ALL_METRICS, COMMIT_METRICS, AppTransaction, MergeResult, Phase
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
    from engine.validation import check_no_internal_columns, validate_spec
    from engine.warm_start import warm_up

_EXPORTS = {
    "find_applied": "engine.applied",
    "AutoCdcSpec": "engine.auto_cdc.spec",
    "find_applied_batch": "engine.auto_cdc.applied",
    "half_applied_batch": "engine.auto_cdc.applied",
    "run_auto_cdc": "engine.auto_cdc.run",
    "validate_auto_cdc": "engine.auto_cdc.run",
    "run_merge": "engine.command",
    "run_delta_merge": "engine.delta_connect",
    "validate_spec": "engine.validation",
    "check_no_internal_columns": "engine.validation",
    "ALL_METRICS": "engine.result",
    "COMMIT_METRICS": "engine.result",
    "AppTransaction": "engine.result",
    "MergeResult": "engine.result",
    "Phase": "engine.result",
    "rows_to_arrow": "engine.inline_rows",
    "connect": "engine.spark",
    "DeleteAction": "engine.spec",
    "InsertAction": "engine.spec",
    "MergeClause": "engine.spec",
    "MergeSpec": "engine.spec",
    "QuerySource": "engine.spec",
    "RowsSource": "engine.spec",
    "TableSource": "engine.spec",
    "UpdateAction": "engine.spec",
    "parse_merge_sql": "engine.sql",
    "warm_up": "engine.warm_start",
}

__all__ = [
    "ALL_METRICS",
    "COMMIT_METRICS",
    "AppTransaction",
    "AutoCdcSpec",
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
    "check_no_internal_columns",
    "connect",
    "find_applied",
    "find_applied_batch",
    "half_applied_batch",
    "parse_merge_sql",
    "rows_to_arrow",
    "run_auto_cdc",
    "run_delta_merge",
    "run_merge",
    "validate_auto_cdc",
    "validate_spec",
    "warm_up",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)
