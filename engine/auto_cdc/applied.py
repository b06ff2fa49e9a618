"""An AUTO CDC batch whose ``txn`` the tables already hold: its result read back from the log alone, as a merge's
is (``engine.applied``)."""

from __future__ import annotations

from engine.applied import applied_result, holding
from engine.auto_cdc.spec import AutoCdcSpec
from engine.result import AppTransaction, MergeResult


def find_applied_batch(spec: AutoCdcSpec, txn: AppTransaction, *, all_metrics: bool = True) -> MergeResult | None:
    """The result of the batch's target merge when an earlier attempt finished the batch under ``txn``; None when
    it did not. A batch is finished once its state table, merged after the target, holds the ``txn`` too."""
    if holding(spec.state, spec.lake_roots, txn) is None:
        return None
    target = holding(spec.target, spec.lake_roots, txn)
    return None if target is None else applied_result(target, txn, all_metrics=all_metrics)


def half_applied_batch(spec: AutoCdcSpec, txn: AppTransaction) -> bool:
    """Whether the batch's target took its commit under ``txn`` but its state table has not: only a run of the
    batch (on Spark) can finish it."""
    if holding(spec.state, spec.lake_roots, txn) is not None:
        return False
    return holding(spec.target, spec.lake_roots, txn) is not None
