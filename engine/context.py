"""MergeContext: what the merge's executors share: the session, the spec resolved against the snapshot, the
source, the candidate files, and what one phase learns for the next."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from engine import delta
from engine.delta import AddFile, Snapshot
from engine.merge_condition import KeyedOn
from engine.resolved import ResolvedMerge
from engine.spark import Observation
from engine.spec import MergeSpec

if TYPE_CHECKING:
    from engine.key_bitmap import KeyBitmap


@dataclass
class MergeContext:
    """What both executors need: the session, the spec resolved against the snapshot, and the source."""

    spark: SparkSession
    spec: MergeSpec
    snapshot: Snapshot
    resolved: ResolvedMerge
    source: DataFrame
    candidate_files: Sequence[AddFile]
    """Live files left after data skipping."""
    write_id: str
    """The folder of the merge's data files, under the table root."""
    metrics: dict[str, int]
    cdc_enabled: bool = False
    deduplicate_cdf_deletes: bool = False
    """Set by findTouchedFiles: several source rows matched one target row under the delete-only exemption."""
    multiple_match_delete_overcount: int = 0
    """Set by findTouchedFiles under the same exemption: the extra matches, each of which deletes its target row
    again, that Delta subtracts from numTargetRowsMatchedDeleted."""
    key_exprs: Sequence[str] = ()
    """Source-side expressions of the ON equalities, to name colliding keys in the multiple-match error."""
    touched_files: list[AddFile] = field(default_factory=list)
    source_rows_estimate: int | None = None
    """Source rows known before any Spark job (inline rows, a Delta source's statistics); None if unknown."""
    source_splits: int | None = None
    """The row groups of a large Delta source with few files (``engine.streamed_source``); None if not read."""
    matched_source_keys: tuple[DataFrame, KeyedOn] | None = None
    """The source keys some target row matched (cached by findTouchedFiles), as ``_key_<i>_`` columns."""
    source_key_ranges: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """The source's (min, max) for ON's key equalities, by target column (lower case), where data skipping
    computed them."""
    touched_files_known: bool = False
    """The single pass found the touched files (and no multiple match) but had to give up its write."""
    key_bitmap: KeyBitmap | None = None
    write_deletion_vectors: bool = False
    """Merge-on-read: updated and deleted target rows are marked in deletion vectors; no row is copied."""
    row_tracking_columns: tuple[str, str] | None = None
    """The table's materialized row id and row commit version columns when its row tracking is enabled: the
    rewrite preserves the stable row ids of updated and copied rows, and the commit versions of copied ones."""

    @property
    def source_rows(self) -> int | None:
        """The source's rows as counted by a Spark job (findTouchedFiles), else as estimated before any. The
        metrics start at 0, so a 0 count falls back to the estimate: a plan chosen on a count not yet taken
        would take every source for an empty one."""
        return self.metrics.get("numSourceRows") or self.source_rows_estimate

    @property
    def output_names(self) -> list[str]:
        return [f.name for f in self.resolved.output_fields]

    def target_df(
        self,
        files: Sequence[AddFile],
        *,
        file_columns: bool = True,
        row_tracking: bool = False,
        prefilter: Callable[[DataFrame], DataFrame] | None = None,
    ) -> DataFrame:
        """``prefilter``: a filter that only drops rows, applied before deletion vectors meet them."""
        return delta.scan_files(
            self.spark, self.snapshot, files, file_columns=file_columns, row_tracking=row_tracking, prefilter=prefilter
        )

    def release(self) -> None:
        """Free what the merge cached on the Spark server."""
        if self.matched_source_keys is not None:
            self.matched_source_keys[0].unpersist()
            self.matched_source_keys = None


def source_with_count(ctx: MergeContext, obs: Observation) -> DataFrame:
    return observe(ctx.source, obs, F.count(F.lit(1)).alias("numSourceRows"))


def observed_source_rows(ctx: MergeContext, obs: Observation) -> int:
    """The source rows ``obs`` counted. Spark folds an ON with a NULL conjunct to false and prunes the join's
    source side, its observation with it: the source is then counted on its own."""
    observed = obs.get
    return int(observed.get("numSourceRows") or 0) if observed else ctx.source.count()


def observe(df: DataFrame, observation: Observation, *metrics: Column) -> DataFrame:
    """``df.observe(observation, *metrics)``: pyspark's type hints name only the classic Observation, while a
    Spark Connect DataFrame takes Connect's."""
    return df.observe(observation, *metrics)  # type: ignore[arg-type]
