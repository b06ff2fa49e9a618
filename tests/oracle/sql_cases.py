"""Merges given as SQL text on copies of one table Delta created: the target and source from their DDL and
``VALUES`` rows, the MERGE statement for either copy, and the rows as Delta reads them."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from tests.oracle.tables import make_delta_table, table_ref


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
    ours = tmp / "ours"
    make_delta_table(delta_spark, ours, target[0], then_sql=[f"INSERT INTO {{table}} VALUES {target[1]}"])
    source_path = make_delta_table(
        delta_spark, tmp / "source", source[0], then_sql=[f"INSERT INTO {{table}} VALUES {source[1]}"]
    )
    theirs = tmp / "theirs"
    shutil.copytree(ours, theirs)
    statement = (
        f"MERGE {'WITH SCHEMA EVOLUTION ' if schema_evolution else ''}INTO {{target}} AS t "
        f"USING {table_ref(source_path)} AS s ON t.id = s.id {clauses}"
    )
    return SqlCopies(ours, theirs, statement)


def sql_rows(delta_spark: SparkSession, path: Path) -> list[tuple[Any, ...]]:
    """The table's rows as Delta reads them, in a stable order."""
    return sorted((tuple(r) for r in delta_spark.sql(f"SELECT * FROM {table_ref(path)}").collect()), key=str)
