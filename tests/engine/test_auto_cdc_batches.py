"""AUTO CDC over what real feeds bring: timestamp and composite sequences (nulls in them refused), array
sequences with truncates, MAP columns in SCD 2, tables written by others (no ``__START_AT``), and a first batch
that fails in a folder the user owns."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from engine import AppTransaction, AutoCdcSpec, RowsSource, find_applied_batch, run_auto_cdc
from engine.errors import MergeCancelledError, SourceError
from tests.engine.test_auto_cdc import table_rows

UTC = dt.UTC


def cdc(target: Path, rows: list[dict[str, Any]], schema: str, **kwargs: Any) -> AutoCdcSpec:
    options: dict[str, Any] = {"keys": ("id",), "sequence_by": ("ts",)}
    options.update(kwargs)
    return AutoCdcSpec(target=str(target), source=RowsSource(rows=rows, schema=schema), **options)


def at(hour: int) -> dt.datetime:
    return dt.datetime(2026, 1, 1, hour, tzinfo=UTC)


TIMESTAMPED = "id BIGINT, ts TIMESTAMP, op STRING, v STRING"


def test_a_timestamp_sequence_keeps_scd1_with_tombstones(spark: SparkSession, tmp_path: Path) -> None:
    target = tmp_path / "t"
    kwargs = {"apply_as_deletes": "op = 'D'", "except_column_list": ("op",)}
    run_auto_cdc(
        spark, cdc(target, [{"id": 1, "ts": "2026-01-01T01:00:00Z", "op": "U", "v": "a"}], TIMESTAMPED, **kwargs)
    )
    run_auto_cdc(
        spark, cdc(target, [{"id": 1, "ts": "2026-01-01T03:00:00Z", "op": "D", "v": None}], TIMESTAMPED, **kwargs)
    )
    # Older than the delete: the tombstone keeps it out.
    late = [
        {"id": 1, "ts": "2026-01-01T02:00:00Z", "op": "U", "v": "late"},
        {"id": 2, "ts": "2026-01-01T05:00:00Z", "op": "U", "v": "b"},
    ]
    run_auto_cdc(spark, cdc(target, late, TIMESTAMPED, **kwargs))
    assert table_rows(target, ["id", "ts", "v", "__START_AT"]) == [(2, at(5), "b", at(5))]
    tombstones = DeltaTable(str(target / "_auto_cdc_tombstones")).to_pyarrow_table().to_pylist()
    assert tombstones == [{"id": 1, "__DELETE_AT": at(3)}]


def test_a_timestamp_sequence_keeps_scd2_history(spark: SparkSession, tmp_path: Path) -> None:
    target = tmp_path / "t"
    rows = [{"id": 1, "ts": f"2026-01-01T0{h}:00:00Z", "op": "U", "v": v} for h, v in ((1, "a"), (4, "c"))]
    run_auto_cdc(spark, cdc(target, rows, TIMESTAMPED, except_column_list=("op",), stored_as_scd_type=2))
    late = [{"id": 1, "ts": "2026-01-01T02:00:00Z", "op": "U", "v": "b"}]
    run_auto_cdc(spark, cdc(target, late, TIMESTAMPED, except_column_list=("op",), stored_as_scd_type=2))
    assert table_rows(target, ["id", "v", "__START_AT", "__END_AT"]) == [
        (1, "a", at(1), at(2)),
        (1, "b", at(2), at(4)),
        (1, "c", at(4), None),
    ]


@pytest.mark.parametrize("scd_type", [1, 2])
def test_a_null_in_any_sequence_column_fails_the_batch(spark: SparkSession, tmp_path: Path, scd_type: int) -> None:
    target = tmp_path / "t"
    schema = "id BIGINT, ts BIGINT, lsn BIGINT, v STRING"
    spec = cdc(
        target, [{"id": 1, "ts": 1, "lsn": 1, "v": "a"}], schema, sequence_by=("ts", "lsn"), stored_as_scd_type=scd_type
    )
    run_auto_cdc(spark, spec)
    version = DeltaTable(str(target)).version()
    bad = cdc(
        target,
        [{"id": 1, "ts": 10, "lsn": None, "v": "b"}],
        schema,
        sequence_by=("ts", "lsn"),
        stored_as_scd_type=scd_type,
    )
    with pytest.raises(SourceError) as caught:
        run_auto_cdc(spark, bad)
    assert caught.value.field == "sequence_by" and "null sequence" in str(caught.value)
    assert DeltaTable(str(target)).version() == version


def test_an_array_sequence_takes_a_truncate(spark: SparkSession, tmp_path: Path) -> None:
    target = tmp_path / "t"
    schema = "id BIGINT, ts BIGINT, lsn BIGINT, op STRING, v STRING"
    kwargs = {"sequence_by": ("array(ts, lsn)",), "apply_as_truncates": "op = 'T'", "except_column_list": ("op",)}
    first = [{"id": 1, "ts": 1, "lsn": 1, "op": "U", "v": "a"}, {"id": 2, "ts": 3, "lsn": 1, "op": "U", "v": "b"}]
    run_auto_cdc(spark, cdc(target, first, schema, **kwargs))
    result = run_auto_cdc(spark, cdc(target, [{"id": None, "ts": 2, "lsn": 7, "op": "T", "v": None}], schema, **kwargs))
    assert result.result["num_deleted_rows"] == 1
    assert table_rows(target, ["id", "v"]) == [(2, "b")]


def test_scd2_versions_a_map_column(spark: SparkSession, tmp_path: Path) -> None:
    target = tmp_path / "t"
    schema = "id BIGINT, ts BIGINT, m MAP<STRING, STRING>"
    rows = [
        {"id": 1, "ts": 1, "m": {"k": "a"}},
        {"id": 1, "ts": 2, "m": {"k": "a"}},
        {"id": 1, "ts": 3, "m": {"k": "b"}},
    ]
    run_auto_cdc(spark, cdc(target, rows, schema, stored_as_scd_type=2, except_column_list=("ts",)))
    later = [{"id": 1, "ts": 4, "m": {"k": "b"}}]
    run_auto_cdc(spark, cdc(target, later, schema, stored_as_scd_type=2, except_column_list=("ts",)))
    # An unchanged map continues its version; a changed one starts the next.
    assert table_rows(target, ["id", "__START_AT", "__END_AT"]) == [(1, 1, 3), (1, 3, None)]


def test_scd1_updates_and_deletes_rows_written_without_a_start(spark: SparkSession, tmp_path: Path) -> None:
    """A table backfilled by another writer, its ``__START_AT`` null: those rows are older than any event."""
    target = tmp_path / "t"
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("__START_AT", pa.int64())])
    write_deltalake(
        str(target), pa.table({"id": [1, 2, 3], "v": ["x", "y", "z"], "__START_AT": [None, None, None]}, schema=schema)
    )
    rows = [{"id": 1, "ts": 5, "op": "U", "v": "new"}, {"id": 2, "ts": 5, "op": "D", "v": None}]
    spec = cdc(
        target,
        rows,
        "id BIGINT, ts BIGINT, op STRING, v STRING",
        apply_as_deletes="op = 'D'",
        except_column_list=("op", "ts"),
    )
    result = run_auto_cdc(spark, spec)
    assert result.result["num_updated_rows"] == 1 and result.result["num_deleted_rows"] == 1
    assert table_rows(target, ["id", "v", "__START_AT"]) == [(1, "new", 5), (3, "z", None)]


def test_a_failed_first_batch_leaves_a_folder_it_did_not_make_as_it_was(spark: SparkSession, tmp_path: Path) -> None:
    target = tmp_path / "owned"
    target.mkdir()
    (target / "README.txt").write_text("the owner's file")

    def cancel(phase: str) -> None:
        raise MergeCancelledError("cancelled while it ran")

    spec = cdc(target, [{"id": 1, "ts": 1}], "id BIGINT, ts BIGINT")
    with pytest.raises(MergeCancelledError):
        run_auto_cdc(spark, spec, on_progress=cancel)
    assert sorted(p.name for p in target.iterdir()) == ["README.txt"]
    assert (target / "README.txt").read_text() == "the owner's file"

    fresh = tmp_path / "fresh"
    with pytest.raises(MergeCancelledError):
        run_auto_cdc(spark, cdc(fresh, [{"id": 1, "ts": 1}], "id BIGINT, ts BIGINT"), on_progress=cancel)
    assert not fresh.exists()


def test_scd2_keeps_the_history_of_a_table_written_before(spark: SparkSession, tmp_path: Path) -> None:
    """A key deleted at 5 in a table the service did not write (no events table): a later event starts a new
    version after the gap, and a late one splits the old version without bringing the key back."""
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("__START_AT", pa.int64()), ("__END_AT", pa.int64())])
    expected = {7: [(1, "a", 1, 5), (1, "c", 7, None)], 3: [(1, "a", 1, 3), (1, "b", 3, 5)]}
    for seq, rows in expected.items():
        target = tmp_path / f"t{seq}"
        write_deltalake(
            str(target), pa.table({"id": [1], "v": ["a"], "__START_AT": [1], "__END_AT": [5]}, schema=schema)
        )
        event = [{"id": 1, "ts": seq, "v": "c" if seq == 7 else "b"}]
        spec = cdc(target, event, "id BIGINT, ts BIGINT, v STRING", stored_as_scd_type=2, except_column_list=("ts",))
        run_auto_cdc(spark, spec)
        assert table_rows(target, ["id", "v", "__START_AT", "__END_AT"]) == rows


@pytest.mark.parametrize("scd_type", [1, 2])
def test_a_new_source_column_is_added_to_the_target(spark: SparkSession, tmp_path: Path, scd_type: int) -> None:
    """As Databricks' AUTO CDC evolves its target: rows already there read the new column as null."""
    target = tmp_path / "t"
    kwargs: dict[str, Any] = {"stored_as_scd_type": scd_type, "except_column_list": ("ts",)}
    run_auto_cdc(
        spark,
        cdc(
            target,
            [{"id": 1, "ts": 1, "v": "a"}, {"id": 2, "ts": 1, "v": "z"}],
            "id BIGINT, ts BIGINT, v STRING",
            **kwargs,
        ),
    )
    wider = "id BIGINT, ts BIGINT, v STRING, w STRING"
    run_auto_cdc(spark, cdc(target, [{"id": 1, "ts": 2, "v": "b", "w": "x"}], wider, **kwargs))
    names = [f.name for f in DeltaTable(str(target)).schema().fields]
    assert names[-1] == "w" and "w" in names
    if scd_type == 1:
        assert table_rows(target, ["id", "v", "w"]) == [(1, "b", "x"), (2, "z", None)]
    else:
        assert table_rows(target, ["id", "v", "w", "__START_AT", "__END_AT"]) == [
            (1, "a", None, 1, 2),
            (1, "b", "x", 2, None),
            (2, "z", None, 1, None),
        ]
        # The events table took the column too: the same batch again changes nothing.
        again = run_auto_cdc(spark, cdc(target, [{"id": 1, "ts": 2, "v": "b", "w": "x"}], wider, **kwargs))
        assert again.result["num_affected_rows"] == 0


ADDRESSED = "id BIGINT, ts BIGINT, addr STRUCT<city: STRING, zip: STRUCT<code: STRING, plus: STRING>>"


def address(city: str | None, code: str | None, plus: str | None = None) -> dict[str, Any]:
    return {"city": city, "zip": {"code": code, "plus": plus}}


@pytest.mark.parametrize("scd_type", [1, 2])
def test_null_updates_reach_nested_fields(spark: SparkSession, tmp_path: Path, scd_type: int) -> None:
    """Databricks: ignore_null_updates "also applies to nested columns with a value of null", within one batch and
    across batches; a null struct keeps the whole struct."""
    target = tmp_path / "t"
    kwargs: dict[str, Any] = {
        "stored_as_scd_type": scd_type,
        "ignore_null_updates": True,
        "except_column_list": ("ts",),
    }
    first = [
        {"id": 1, "ts": 1, "addr": address("Paris", "75001", "a")},
        {"id": 1, "ts": 2, "addr": address(None, "75002")},  # city and zip.plus kept
        {"id": 2, "ts": 1, "addr": None},
    ]
    run_auto_cdc(spark, cdc(target, first, ADDRESSED, **kwargs))
    later = [
        {"id": 1, "ts": 3, "addr": {"city": "Lyon", "zip": None}},  # the whole zip kept
        {"id": 2, "ts": 2, "addr": address(None, "13001")},  # no old struct: the new one as it is
    ]
    run_auto_cdc(spark, cdc(target, later, ADDRESSED, **kwargs))
    current = [
        (i, a)
        for i, a, *rest in table_rows(target, ["id", "addr", "__START_AT"] + (["__END_AT"] if scd_type == 2 else []))
        if scd_type == 1 or rest[-1] is None
    ]
    assert sorted(current, key=repr) == sorted(
        [(1, address("Lyon", "75002", "a")), (2, address(None, "13001"))], key=repr
    )
    if scd_type == 2:
        history = [(i, a, s) for i, a, s, _ in table_rows(target, ["id", "addr", "__START_AT", "__END_AT"]) if i == 1]
        assert sorted(history, key=lambda r: r[2]) == [
            (1, address("Paris", "75001", "a"), 1),
            (1, address("Paris", "75002", "a"), 2),
            (1, address("Lyon", "75002", "a"), 3),
        ]


def test_a_batch_is_found_applied_once_both_tables_hold_its_txn(spark: SparkSession, tmp_path: Path) -> None:
    """``find_applied_batch`` reads the log alone: a batch whose target took it but whose state table did not (an
    attempt ended between the two merges) is not applied yet, and the retry that finishes it returns the target's
    merge as committed."""
    target = tmp_path / "t"
    rows = [{"id": 1, "ts": 1, "v": "a"}, {"id": 2, "ts": 1, "v": "b"}]
    spec = cdc(target, rows, "id BIGINT, ts BIGINT, v STRING", stored_as_scd_type=2)
    txn = AppTransaction("merge-service-test", 3)
    assert find_applied_batch(spec, txn) is None
    first = run_auto_cdc(spark, spec, txn=txn)
    found = find_applied_batch(spec, txn)
    assert found is not None and found.already_applied
    assert (found.table_version, found.result) == (first.table_version, first.result)
    assert find_applied_batch(spec, AppTransaction("merge-service-test", 4)) is None

    state = DeltaTable(spec.state)
    assert state.transaction_version("merge-service-test") == 3
    os.remove(os.path.join(spec.state, "_delta_log", f"{state.version():020d}.json"))  # the state merge undone
    assert find_applied_batch(spec, txn) is None
    again = run_auto_cdc(spark, spec, txn=txn)
    assert again.already_applied and (again.table_version, again.result) == (first.table_version, first.result)
    assert DeltaTable(spec.state).transaction_version("merge-service-test") == 3
    assert find_applied_batch(spec, txn) == again
