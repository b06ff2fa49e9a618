"""Columns named as the merge's own working columns were named, as Delta names its own, and as Spark names a file's
metadata: each is a user's column like any other, in every way a merge writes. Only the one internal prefix is
refused, before anything is read."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine import DeleteAction, InsertAction, MergeClause, UpdateAction, run_merge
from engine.delta.internal_columns import INTERNAL_PREFIX
from engine.errors import MergeSpecError
from tests.engine.delta.dv_tables import enable_deletion_vectors, read_with_deltalake
from tests.engine.harness import find_plan, join_plan, make_spec, write_table
from tests.oracle.tables import latest_version, log_actions

KEY = "_key_0_"
"""The join key, named as the merge's key columns once were."""
NAMES = [
    # The merge's working columns before they took the internal prefix.
    "_source_row_present_",
    "_target_row_present_",
    "_row_dropped_",
    "_merge_action_",
    "_condition_",
    "_matched_condition_0_",
    "_target_row_index_",
    "_source_row_index",
    "_cdc_row_kind_",
    "_preimage_0_",
    "_data_row_key_",
    "_source_rows_with_key_",
    "_deleted_row_indexes_",
    "_deleted_pairs_",
    "_source_keys_bitmap_",
    "_probe_key_",
    "_element_0_",
    "_touched_file_",
    "_file_hash_",
    "_row_indexes_",
    "_repeated_matches_",
    "_target_file_number_",
    "_target_rows_",
    "_target_row_count_",
    "_matched_keys_",
    "_target_",
    "_source_keys_",
    "_file_name_",
    "_row_index_",
    "_file_path_",
    "_row_id_",
    "_row_commit_version_",
    "__delta_local_path",
    "__delta_base_row_id",
    "__delta_dv_file",
    "__delta_dv_row",
    "__delta_dv_bitmap",
    # Delta's partition of change rows in its writes, and Spark's hidden file metadata column.
    "__is_cdc",
    "_metadata",
]
KINDS = ["plain", "partitioned", "change data feed", "deletion vectors"]
PLANS: dict[str, Callable[[], AbstractContextManager[Any]]] = {
    "single pass": lambda: find_plan("single_pass"),
    "target rows, shuffled": lambda: _both(find_plan("target_rows"), join_plan(broadcast=False)),
    "source keys, held key bitmap": lambda: _both(
        find_plan("source_keys"), join_plan(broadcast=True, key_bitmap="held")
    ),
    "source keys, semi join": lambda: _both(find_plan("source_keys"), join_plan(broadcast=True, key_bitmap="semi")),
}
"""The ways the merge finds and joins its rows, each with its own working columns."""


def _both(*plans: AbstractContextManager[Any]) -> ExitStack:
    stack = ExitStack()
    for plan in plans:
        stack.enter_context(plan)
    return stack


def _table(keys: list[int], scale: int) -> pa.Table:
    return pa.table({KEY: keys, **{n: [k * scale + i for k in keys] for i, n in enumerate(NAMES)}})


def _row(key: int, scale: int) -> dict[str, int]:
    return {KEY: key, **{n: key * scale + i for i, n in enumerate(NAMES)}}


def _target(tmp_path: Path, kind: str) -> Path:
    configuration = {"delta.enableChangeDataFeed": "true"} if kind == "change data feed" else None
    partition_by = ["_file_path_"] if kind == "partitioned" else None
    target = write_table(
        tmp_path / "target", _table([1, 2, 3, 4], 100), partition_by=partition_by, configuration=configuration
    )
    if kind == "deletion vectors":
        enable_deletion_vectors(target)
    return target


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("kind", KINDS)
def test_columns_named_as_internal_ones_merge_as_any_other(
    spark: SparkSession, tmp_path: Path, kind: str, plan: str
) -> None:
    target = _target(tmp_path, kind)
    source = write_table(tmp_path / "source", _table([2, 3, 5], 1000))
    merge = make_spec(
        target,
        source,
        f"t.{KEY} = s.{KEY}",
        (
            MergeClause("matched", DeleteAction(), condition=f"s.{KEY} = 3"),
            MergeClause("matched", UpdateAction(star=True)),
            MergeClause("notMatched", InsertAction(star=True)),
            MergeClause("notMatchedBySource", UpdateAction(set={"_row_dropped_": "-1"}), condition=f"t.{KEY} = 4"),
        ),
    )
    with PLANS[plan]():
        result = run_merge(spark, merge).result
    assert [result[k] for k in ("num_deleted_rows", "num_updated_rows", "num_inserted_rows")] == [1, 2, 1]
    assert read_with_deltalake(target, order_by=KEY).to_pylist() == [
        _row(1, 100),
        _row(2, 1000),
        {**_row(4, 100), "_row_dropped_": -1},
        _row(5, 1000),
    ]
    adds = [a["add"] for a in log_actions(target, latest_version(target)) if "add" in a]
    assert any(a.get("deletionVector") for a in adds) == (kind == "deletion vectors")
    if kind == "deletion vectors":
        # The next merge reads the rows the vectors keep, each with its file and row index.
        again = make_spec(
            target,
            source,
            f"t.{KEY} = s.{KEY}",
            (MergeClause("matched", UpdateAction(set={"_metadata": "t._metadata + 1"})),),
        )
        with PLANS[plan]():
            assert run_merge(spark, again).result["num_updated_rows"] == 2
        bumped = [_row(1, 100), _row(2, 1000), {**_row(4, 100), "_row_dropped_": -1}, _row(5, 1000)]
        for row in bumped[1::2]:
            row["_metadata"] += 1
        assert read_with_deltalake(target, order_by=KEY).to_pylist() == bumped
    if kind == "change data feed":
        changes = pa.table(DeltaTable(str(target)).load_cdf(starting_version=latest_version(target)).read_all())
        got = sorted((row["_change_type"], row[KEY], row["__is_cdc"], row["_metadata"]) for row in changes.to_pylist())
        last, metadata = NAMES.index("__is_cdc"), NAMES.index("_metadata")
        assert got == sorted(
            [
                ("delete", 3, 300 + last, 300 + metadata),
                ("update_preimage", 2, 200 + last, 200 + metadata),
                ("update_postimage", 2, 2000 + last, 2000 + metadata),
                ("update_preimage", 4, 400 + last, 400 + metadata),
                ("update_postimage", 4, 400 + last, 400 + metadata),
                ("insert", 5, 5000 + last, 5000 + metadata),
            ]
        )


@pytest.mark.parametrize("kind", KINDS)
def test_an_insert_only_merge_keeps_columns_named_as_internal_ones(
    spark: SparkSession, tmp_path: Path, kind: str
) -> None:
    target = _target(tmp_path, kind)
    source = write_table(tmp_path / "source", _table([3, 6], 1000))
    merge = make_spec(target, source, f"t.{KEY} = s.{KEY}", (MergeClause("notMatched", InsertAction(star=True)),))
    assert run_merge(spark, merge).result["num_inserted_rows"] == 1
    assert read_with_deltalake(target, order_by=KEY).to_pylist() == [
        *(_row(k, 100) for k in (1, 2, 3, 4)),
        _row(6, 1000),
    ]


@pytest.mark.parametrize("side", ["target", "source"])
def test_a_column_under_the_internal_prefix_is_refused_and_the_table_is_unchanged(
    spark: SparkSession, tmp_path: Path, side: str
) -> None:
    name = INTERNAL_PREFIX.upper() + "row_dropped"
    taken = pa.table({"id": [1, 2], name: [10, 20]})
    plain = pa.table({"id": [1, 2], "v": [10, 20]})
    target = write_table(tmp_path / "target", taken if side == "target" else plain)
    source = write_table(tmp_path / "source", taken if side == "source" else plain)
    version = latest_version(target)
    merge = make_spec(target, source, "t.id = s.id", (MergeClause("matched", DeleteAction()),))
    with pytest.raises(MergeSpecError, match=rf"^{side}: column `{name}` is under the prefix") as caught:
        run_merge(spark, merge)
    assert caught.value.field == side
    assert latest_version(target) == version
