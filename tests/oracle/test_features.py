"""Tables Delta on Spark writes with a table feature, merged by the engine: the rows Delta reads afterwards are the
rows Delta's own MERGE gives on a copy of the same table, and Delta then runs MERGE, DELETE and OPTIMIZE on the
engine's result. The committed actions are checked against PROTOCOL.md's writer requirements for the feature."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from engine import MergeClause, MergeResult, run_merge
from engine.delta import load_snapshot
from tests.engine.harness import clause, make_spec, write_table
from tests.oracle.differential import merge_sql
from tests.oracle.tables import latest_version, make_delta_table, table_ref


def delta_rows(delta_spark: SparkSession, path: Path, columns: str = "*") -> list[tuple[Any, ...]]:
    got = delta_spark.sql(f"SELECT {columns} FROM {table_ref(path)}").collect()
    return sorted((tuple(r) for r in got), key=lambda r: tuple((v is not None, str(v)) for v in r))


def merge_both(
    spark: SparkSession,
    delta_spark: SparkSession,
    tmp: Path,
    target: Path,
    source: pa.Table,
    on: str,
    clauses: Sequence[MergeClause],
    **spec: Any,
) -> MergeResult:
    """The engine's merge into ``target`` and Delta's into a copy; both tables read by Delta must agree."""
    theirs = tmp / f"{target.name}-delta"
    shutil.copytree(target, theirs)
    source_path = write_table(tmp / f"{target.name}-source", source)
    result = run_merge(spark, make_spec(target, source_path, on, clauses, **spec))
    delta_spark.sql(merge_sql(theirs, source_path, on, clauses)).collect()
    assert delta_rows(delta_spark, target) == delta_rows(delta_spark, theirs)
    return result


def delta_writes_on(delta_spark: SparkSession, path: Path, key: str = "id") -> None:
    """Delta's own MERGE, DELETE and OPTIMIZE succeed on a table the engine wrote."""
    ref = table_ref(path)
    first = delta_spark.sql(f"SELECT * FROM {ref} LIMIT 1").collect()
    assert first, "the table is empty"
    delta_spark.sql(
        f"MERGE INTO {ref} t USING (SELECT * FROM {ref} LIMIT 1) s ON t.{key} = s.{key} WHEN MATCHED THEN UPDATE SET *"
    ).collect()
    delta_spark.sql(f"DELETE FROM {ref} WHERE {key} = {first[0][key]!r}").collect()
    delta_spark.sql(f"OPTIMIZE {ref}").collect()
    delta_spark.sql(f"SELECT count(*) FROM {ref}").collect()


# --- v2Checkpoint -------------------------------------------------------------------------------------------------


def _drop_commits_before(path: Path, version: int) -> None:
    """Delta's metadata cleanup: commits older than a checkpoint go, so readers must start from the checkpoint."""
    for commit in (path / "_delta_log").glob("*.json"):
        if commit.stem.isdigit() and int(commit.stem) < version:
            commit.unlink()
    for crc in (path / "_delta_log").glob("*.crc"):
        crc.unlink()


def test_v2_checkpoint_with_sidecars_and_deletion_vectors(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """A table whose newest checkpoint is UUID-named, its file actions in sidecars, and whose older commits are
    gone: the deletion vectors the snapshot needs are only in the sidecars."""
    path = make_delta_table(
        delta_spark,
        tmp_path / "v2",
        "id BIGINT, v STRING",
        properties={
            "delta.checkpointPolicy": "v2",
            "delta.checkpointInterval": "3",
            "delta.enableDeletionVectors": "true",
        },
        then_sql=[
            "INSERT INTO {table} SELECT id, concat('v', id) FROM range(0, 20, 1, 1)",
            "DELETE FROM {table} WHERE id IN (3, 4)",
            "INSERT INTO {table} SELECT id, concat('w', id) FROM range(20, 25, 1, 1)",
        ],
    )
    log = path / "_delta_log"
    checkpoints = sorted(p.name for p in log.iterdir() if ".checkpoint." in p.name and not p.name.startswith("."))
    assert checkpoints and all(len(n.split(".")) == 4 for n in checkpoints), checkpoints  # n.checkpoint.<uuid>.json
    assert list((log / "_sidecars").glob("*.parquet"))
    newest = int(checkpoints[-1][:20])
    _drop_commits_before(path, newest)

    snapshot = load_snapshot(path)
    assert sum(1 for f in snapshot.files if f.deletion_vector is not None) == 1
    source = pa.table({"id": pa.array([2, 3, 5, 30], pa.int64()), "v": ["x2", "x3", "x5", "x30"]})
    result = merge_both(
        spark,
        delta_spark,
        tmp_path,
        path,
        source,
        "t.id = s.id",
        [clause("matched", "update_all"), clause("notMatched", "insert_all")],
    )
    assert result.result["num_updated_rows"] == 2
    assert result.result["num_inserted_rows"] == 2  # 3 was deleted by the vector: it is inserted again
    delta_writes_on(delta_spark, path)


def test_checkpoints_the_engine_writes_on_a_v2_table_follow_the_v2_spec(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """PROTOCOL.md "Checkpoints": with v2Checkpoint, no multi-part checkpoints; a V2-spec checkpoint holds a
    ``checkpointMetadata`` action. Delta reads the table from the engine's checkpoint alone."""
    path = make_delta_table(
        delta_spark,
        tmp_path / "v2w",
        "id BIGINT, v STRING",
        [(1, "a"), (2, "b")],
        properties={"delta.checkpointPolicy": "v2", "delta.checkpointInterval": "2"},
    )
    assert latest_version(path) == 1
    source = write_table(tmp_path / "src", pa.table({"id": pa.array([2, 3], pa.int64()), "v": ["B", "c"]}))
    result = run_merge(
        spark,
        make_spec(path, source, "t.id = s.id", [clause("matched", "update_all"), clause("notMatched", "insert_all")]),
    )
    assert result.table_version == 2
    written = [p for p in (path / "_delta_log").iterdir() if p.name.startswith(f"{2:020d}.checkpoint")]
    assert len(written) == 1, written
    (checkpoint,) = written
    table = pq.read_table(checkpoint)
    assert [m["version"] for m in table.column("checkpointMetadata").to_pylist() if m] == [2]
    _drop_commits_before(path, 2)
    assert delta_rows(delta_spark, path) == [(1, "a"), (2, "B"), (3, "c")]
    delta_writes_on(delta_spark, path)
