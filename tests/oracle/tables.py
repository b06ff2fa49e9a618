"""Tables written by Delta on Spark with the features a test asks for, and what their logs hold.

``make_delta_table(delta_spark, path, "id BIGINT, v STRING", rows, properties={"delta.enableDeletionVectors":
"true"}, then_sql=["DELETE FROM {table} WHERE id = 2"])`` gives a table whose deletion vector Delta itself wrote;
``{table}`` in each statement stands for the table (``delta.`<path>```).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession


def table_ref(path: Path | str) -> str:
    return f"delta.`{path}`"


def make_delta_table(
    spark: SparkSession,
    path: Path | str,
    ddl: str,
    rows: Iterable[Sequence[Any]] = (),
    *,
    properties: Mapping[str, str] | None = None,
    partitioned_by: Sequence[str] = (),
    then_sql: Sequence[str] = (),
) -> Path:
    """Create the table with Delta's CREATE TABLE (so Delta picks the protocol the properties need), append
    ``rows`` in one commit, then run ``then_sql`` in order: DELETE/UPDATE/MERGE for deletion vectors, ALTER
    TABLE for renamed or dropped columns under column mapping, and so on."""
    ref = table_ref(path)
    sql = f"CREATE TABLE {ref} ({ddl}) USING delta"
    if partitioned_by:
        sql += f" PARTITIONED BY ({', '.join(partitioned_by)})"
    if properties:
        sql += " TBLPROPERTIES (" + ", ".join(f"'{k}' = '{v}'" for k, v in properties.items()) + ")"
    spark.sql(sql)
    data = [tuple(r) for r in rows]
    if data:
        columns = spark.read.format("delta").load(str(path)).columns
        spark.createDataFrame(data, schema=ddl).toDF(*columns).write.format("delta").mode("append").save(str(path))
    for statement in then_sql:
        spark.sql(statement.format(table=ref))
    return Path(path)


def log_actions(path: Path | str, version: int | None = None) -> list[dict[str, Any]]:
    """The actions of one commit of the table's log (``version``), or of every JSON commit in order."""
    log = Path(path) / "_delta_log"
    commits = [log / f"{version:020d}.json"] if version is not None else sorted(log.glob("*.json"))
    return [json.loads(line) for commit in commits for line in commit.read_text().splitlines() if line.strip()]


def commit_info(path: Path | str, version: int) -> dict[str, Any]:
    return next(a["commitInfo"] for a in log_actions(path, version) if "commitInfo" in a)


def latest_version(path: Path | str) -> int:
    """The newest commit's version (V2 checkpoints' ``<version>.checkpoint.<uuid>.json`` files are not commits)."""
    return max(int(p.stem) for p in (Path(path) / "_delta_log").glob("*.json") if p.stem.isdigit())
