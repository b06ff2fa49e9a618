"""Merges given as SQL text on copies of one table Delta created: the target and source from their DDL and
``VALUES`` rows, the MERGE statement for either copy, and the rows as Delta reads them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from engine import parse_merge_sql, run_merge
from tests.oracle.differential import delta_made_copies
from tests.oracle.tables import latest_version, table_ref


@dataclass(frozen=True)
class SqlCopies:
    ours: Path
    theirs: Path
    statement: str
    """The MERGE statement, ``{target}`` standing for the table."""

    def merge_sql(self, target: Path) -> str:
        return self.statement.format(target=table_ref(target))

    def merged_alike(self, spark: SparkSession, delta_spark: SparkSession) -> None:
        """Merge ours with the engine and theirs with Delta; both then hold the same rows."""
        run_merge(spark, parse_merge_sql(self.merge_sql(self.ours)))
        delta_spark.sql(self.merge_sql(self.theirs)).collect()
        assert sql_rows(delta_spark, self.ours) == sql_rows(delta_spark, self.theirs)

    def refused_alike(
        self,
        spark: SparkSession,
        delta_spark: SparkSession,
        error: type[Exception],
        match: str,
        delta_match: str | None = None,
    ) -> tuple[str, str]:
        """Both merges fail, ours with ``error`` matching ``match``, Delta's matching ``delta_match`` (else
        ``match``), and neither table moves from the version it started at; the two messages, ours first."""
        start = latest_version(self.ours)
        with pytest.raises(error, match=match) as ours_error:
            run_merge(spark, parse_merge_sql(self.merge_sql(self.ours)))
        with pytest.raises(PySparkException, match=delta_match or match) as theirs_error:
            delta_spark.sql(self.merge_sql(self.theirs)).collect()
        assert latest_version(self.ours) == latest_version(self.theirs) == start
        return str(ours_error.value), str(theirs_error.value)


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
