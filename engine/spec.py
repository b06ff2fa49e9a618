"""The merge spec: typed clauses and sources, validated by Delta's rules before anything touches Spark.

Names follow Delta's ``DeltaMergeInto``: MATCHED, NOT MATCHED (by target) and NOT MATCHED BY SOURCE clauses,
each with an optional condition. Expressions stay Spark SQL text; they are parsed (``engine.expressions``) and
resolved against the tables when the merge runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from engine.errors import MergeSpecError
from engine.source_options import DeltaRead, delta_read

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ClauseType = Literal["matched", "notMatched", "notMatchedBySource"]
"""Delta's ``clauseType`` names; they appear in precomputed condition columns and commit parameters."""


@dataclass(frozen=True)
class UpdateAction:
    """UPDATE SET col = expr, ... (``set``), or UPDATE SET * when ``star``."""

    set: Mapping[str, str] = field(default_factory=dict)
    star: bool = False
    name: str = "update"


@dataclass(frozen=True)
class DeleteAction:
    name: str = "delete"


@dataclass(frozen=True)
class InsertAction:
    """INSERT (cols) VALUES (exprs) as a mapping, or INSERT * when ``star``."""

    values: Mapping[str, str] = field(default_factory=dict)
    star: bool = False
    name: str = "insert"


Action = UpdateAction | DeleteAction | InsertAction


@dataclass(frozen=True)
class MergeClause:
    clause_type: ClauseType
    action: Action
    condition: str | None = None

    @property
    def action_type(self) -> str:
        """Delta's ``actionType`` in a commit's parameters (``MergePredicate``: the clause type in lower case):
        update, delete or insert, a star clause's too."""
        return "delete" if isinstance(self.action, DeleteAction) else self.action.name

    @property
    def action_name(self) -> str:
        """The action as this service names it: update, updateAll, delete, insert, insertAll."""
        if isinstance(self.action, DeleteAction):
            return "delete"
        base = self.action.name
        return base + "All" if self.action.star else base

    def describe(self) -> str:
        """How errors name the clause: ``WHEN MATCHED [AND cond] THEN UPDATE`` style."""
        head = {
            "matched": "WHEN MATCHED",
            "notMatched": "WHEN NOT MATCHED",
            "notMatchedBySource": "WHEN NOT MATCHED BY SOURCE",
        }[self.clause_type]
        cond = f" AND {self.condition}" if self.condition else ""
        action = {
            "update": "UPDATE SET ...",
            "updateAll": "UPDATE SET *",
            "delete": "DELETE",
            "insert": "INSERT ...",
            "insertAll": "INSERT *",
        }[self.action_name]
        return f"{head}{cond} THEN {action}"


@dataclass(frozen=True)
class TableSource:
    """Data under a lake root: a Delta table or files Spark reads directly."""

    format: Literal["delta", "parquet", "json", "csv"]
    path: str
    options: Mapping[str, str] = field(default_factory=dict)

    def delta_read(self, where: str = "source.options") -> DeltaRead:
        """What a Delta source's options ask for (``engine.source_options``): rows at a version, or changes."""
        return delta_read(self.options, where) if self.format == "delta" else DeltaRead()

    def time_travel(self, where: str = "source.options") -> tuple[int | None, str | None]:
        """The version, or the timestamp, a Delta source's rows are read at (neither: its latest version)."""
        read = self.delta_read(where)
        return read.version, read.timestamp

    @property
    def reads_snapshot(self) -> bool:
        """Whether the source's rows are one snapshot of a Delta table (whose log then tells their count and
        bounds), not files or a Change Data Feed."""
        return self.format == "delta" and self.delta_read().change_feed is None


@dataclass(frozen=True)
class RowsSource:
    """Inline rows; ``schema`` is a Spark DDL string, or None to infer types."""

    rows: Sequence[Mapping[str, Any]]
    schema: str | None = None


@dataclass(frozen=True)
class QuerySource:
    """A SELECT over other sources (from SQL text: ``USING (SELECT ... FROM delta.`path`)``).

    ``relations`` maps each placeholder view name used in ``query`` to the source it reads."""

    query: str
    relations: Mapping[str, TableSource] = field(default_factory=dict)


@dataclass(frozen=True)
class FrameSource:
    """A source the engine itself builds in Spark (an AUTO CDC batch's compiled events); never from a request.

    ``build(spark, views)`` answers the DataFrame, appending any temporary view it creates to ``views`` for the
    merge to drop when it ends. It runs again for each attempt, so it reads the tables as they are then."""

    build: Callable[[SparkSession, list[str]], DataFrame] = field(compare=False)
    description: str = "a compiled source"


Source = TableSource | RowsSource | QuerySource | FrameSource

DeletionVectorsMode = Literal["auto", "off"]


@dataclass(frozen=True)
class MergeSpec:
    target: str
    source: Source
    on: str
    matched: tuple[MergeClause, ...] = ()
    not_matched: tuple[MergeClause, ...] = ()
    not_matched_by_source: tuple[MergeClause, ...] = ()
    target_alias: str = "target"
    source_alias: str = "source"
    schema_evolution: bool = False
    lake_roots: tuple[str, ...] = ()
    """Directories beyond each table's own from which files may be read (a log may name files by absolute
    path, as shallow clones do); empty: only the tables' and sources' own directories."""
    deletion_vectors: DeletionVectorsMode = "auto"
    """Delta's ``spark.databricks.delta.merge.deletionVectors.persistent``: ``auto`` marks updated and deleted
    rows in deletion vectors where the table allows them (the deletionVectors feature and
    ``delta.enableDeletionVectors``); ``off`` rewrites the touched files."""

    @property
    def clauses(self) -> tuple[MergeClause, ...]:
        return self.matched + self.not_matched + self.not_matched_by_source

    @property
    def is_insert_only(self) -> bool:
        return not self.matched and not self.not_matched_by_source and bool(self.not_matched)

    @property
    def is_matched_only(self) -> bool:
        return not self.not_matched and not self.not_matched_by_source and bool(self.matched)

    @property
    def is_delete_only(self) -> bool:
        """Every clause is ``WHEN MATCHED [AND cond] THEN DELETE``."""
        return self.is_matched_only and all(isinstance(c.action, DeleteAction) for c in self.matched)

    def validate(self) -> MergeSpec:
        """Delta's clause rules (DeltaMergeInto / ResolveDeltaMergeInto), with Delta's wording."""
        if not self.clauses:
            raise MergeSpecError("There must be at least one WHEN clause in a MERGE statement.")
        for group, label in (
            (self.matched, "MATCHED"),
            (self.not_matched, "NOT MATCHED"),
            (self.not_matched_by_source, "NOT MATCHED BY SOURCE"),
        ):
            for clause in group[:-1]:
                if clause.condition is None:
                    raise MergeSpecError(
                        f"When there are more than one {label} clauses in a MERGE statement, "
                        f"only the last {label} clause can omit the condition."
                    )
        allowed = {
            "matched": (UpdateAction, DeleteAction),
            "notMatched": (InsertAction,),
            "notMatchedBySource": (UpdateAction, DeleteAction),
        }
        for clause in self.clauses:
            if not isinstance(clause.action, allowed[clause.clause_type]):
                raise MergeSpecError(f"{clause.action_name} is not allowed in {clause.describe()}.")
            if clause.clause_type == "notMatchedBySource" and clause.action_name == "updateAll":
                raise MergeSpecError("UPDATE SET * is not allowed in WHEN NOT MATCHED BY SOURCE clauses.")
            if clause.condition is not None and not clause.condition.strip():
                raise MergeSpecError(f"Empty condition in {clause.describe()}.")
        if isinstance(self.source, TableSource):
            self.source.delta_read()
        elif isinstance(self.source, QuerySource):
            for relation in self.source.relations.values():
                relation.delta_read("source.query")
        if self.target_alias.lower() == self.source_alias.lower():
            raise MergeSpecError(f"The target and source aliases must differ (both are {self.target_alias!r}).")
        if self.deletion_vectors not in ("auto", "off"):
            raise MergeSpecError(f"deletion_vectors is 'auto' or 'off', not {self.deletion_vectors!r}.")
        if not self.on.strip():
            raise MergeSpecError("The merge condition (ON) is empty.")
        return self
