"""Merges given as SQL text on copies of one table Delta created: the target and source from their DDL and
``VALUES`` rows, the MERGE statement for either copy, and the rows as Delta reads them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from tests.oracle.differential import delta_made_copies
from tests.oracle.tables import table_ref


@dataclass(frozen=True)
class SqlCopies:
    ours: Path
    theirs: Path
    statement: str
    """The MERGE statement, ``{target}`` standing for the table."""

    def merge_sql(self, target: Path) -> str:
        return self.statement.format(target=table_ref(target))


def sql_copies(
    delta_spark: SparkSession,
    tmp: Path,
    target: tuple[str, str],
    source: tuple[str, str],
    clauses: str,
    *,
    schema_evolution: bool = False,
) -> SqlCopies:
    """Two copies of a target Delta made (``(DDL, VALUES rows)``), a source beside them, and the MERGE of that source
    into either copy on ``t.id = s.id`` with ``clauses``."""
    ours, theirs, source_path = delta_made_copies(
        delta_spark, tmp, target[0], source, then_sql=[f"INSERT INTO {{table}} VALUES {target[1]}"]
    )
    statement = (
        f"MERGE {'WITH SCHEMA EVOLUTION ' if schema_evolution else ''}INTO {{target}} AS t "
        f"USING {table_ref(source_path)} AS s ON t.id = s.id {clauses}"
    )
    return SqlCopies(ours.path, theirs.path, statement)


def sql_rows(delta_spark: SparkSession, path: Path) -> list[tuple[Any, ...]]:
    """The table's rows as Delta reads them, in a stable order."""
    return sorted((tuple(r) for r in delta_spark.sql(f"SELECT * FROM {table_ref(path)}").collect()), key=str)
