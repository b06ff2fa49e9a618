"""What resolution decides: each clause's condition and values, and the merge's output schema, ready for
output generation and the write."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from pyspark.sql import Column
from pyspark.sql.types import StructField

from engine.merge_condition import MergeCondition
from engine.spec import DeleteAction, MergeClause
from engine.target_reads import target_columns_read


@dataclass
class ResolvedClause:
    """A clause ready for output generation: its condition and one value per target output column."""

    clause: MergeClause
    index: int
    condition: Column | None
    condition_sql: str | None
    values: list[Column] | None = None
    """One per output column for updates and inserts; None for deletes."""

    @property
    def kind(self) -> str:
        """Delta's clause kinds; also the prefix of the precomputed condition column."""
        name = self.clause.action_name.removesuffix("All")
        return name if self.clause.clause_type != "notMatchedBySource" else f"{name}NotMatchedBySource"

    @property
    def is_delete(self) -> bool:
        return isinstance(self.clause.action, DeleteAction)


@dataclass
class ResolvedMerge:
    on: Column
    on_sql: str
    on_condition: MergeCondition
    """ON as the merge parsed it, for data skipping and the join plans."""
    output_fields: list[StructField]
    """The table schema after the merge: the target's columns, then new columns from schema evolution."""
    new_columns: list[str]
    target_values: dict[str, str] = field(default_factory=dict)
    """For columns whose type schema evolution changed (lower-case name): the target's value in the new type, as
    SQL (fields a struct gained NULL; a widened type cast)."""
    matched: list[ResolvedClause] = field(default_factory=list)
    not_matched: list[ResolvedClause] = field(default_factory=list)
    not_matched_by_source: list[ResolvedClause] = field(default_factory=list)
    identity_generated: list[str] = field(default_factory=list)
    """Identity columns some INSERT generates values for: the commit raises their high-water marks."""
    clause_sql: tuple[str, ...] = ()
    """Every clause's condition and values as Spark is given them."""
    target_names: tuple[str, ...] = ()
    target_alias: str = "t"
    source_alias: str = "s"

    @cached_property
    def target_columns_read(self) -> frozenset[str] | None:
        """The target's columns ON, the conditions and the values may read (None: all): what a write that never
        writes a copied or deleted target row needs of the target. Worked out only when such a write asks (ON's
        tree is read, not its text again)."""
        return target_columns_read(
            [self.on_condition.tree, *self.clause_sql],
            self.target_names,
            target_alias=self.target_alias,
            source_alias=self.source_alias,
        )

    @property
    def schema_changed(self) -> bool:
        return bool(self.new_columns or self.target_values)
