"""AUTO CDC against its reference model (tests/engine/auto_cdc_model.py): random change feeds, split into batches
and shuffled across them, applied through the engine on Spark and read back with delta-rs.

``AUTO_CDC_EXAMPLES`` sets how many feeds each property tries (the long run in docs/auto-cdc.md uses hundreds)."""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from engine import AutoCdcSpec, RowsSource, run_auto_cdc
from engine.errors import MergeServiceEngineError, MergeSpecError, SourceError
from tests.engine.auto_cdc_model import Event, Model

EXAMPLES = int(os.environ.get("AUTO_CDC_EXAMPLES", "2"))
SCHEMA = "id BIGINT, seq BIGINT, op STRING, a STRING, b BIGINT"
VALUES = ("a", "b")


def batch_rows(events: Sequence[Event]) -> list[dict[str, Any]]:
    return [
        {
            "id": e.key,
            "seq": e.seq,
            "op": "T" if e.truncate else "D" if e.delete else "U",
            "a": e.values[0],
            "b": e.values[1],
        }
        for e in events
    ]


def spec_for(target: Path, events: Sequence[Event], **kwargs: Any) -> AutoCdcSpec:
    options: dict[str, Any] = {
        "keys": ("id",),
        "sequence_by": ("seq",),
        "apply_as_deletes": "op = 'D'",
        "except_column_list": ("op", "seq"),
    }
    options.update(kwargs)
    return AutoCdcSpec(target=str(target), source=RowsSource(rows=batch_rows(events), schema=SCHEMA), **options)


def table_rows(path: Path, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    """The target as delta-rs reads it, deletion vectors applied."""
    names = ", ".join(f'"{c}"' for c in columns)
    reader = QueryBuilder().register("t", DeltaTable(str(path))).execute(f"SELECT {names} FROM t")
    table = pa.table(reader.read_all())
    values = [table.column(c).to_pylist() for c in columns]
    return sorted(zip(*values, strict=True), key=repr)


def apply_batches(spark: SparkSession, target: Path, batches: Sequence[Sequence[Event]], **kwargs: Any) -> None:
    for batch in batches:
        run_auto_cdc(spark, spec_for(target, batch, **kwargs))


def output_columns(scd_type: int) -> list[str]:
    return ["id", *VALUES, "__START_AT"] + (["__END_AT"] if scd_type == 2 else [])


@st.composite
def feeds(draw: st.DrawFn, *, shuffle: bool, truncates: bool = False) -> tuple[list[Event], list[list[Event]]]:
    """A feed over up to 30 keys, each key's events its own change feed (unique sequences, a delete now and then),
    split into batches in sequence order; with ``shuffle``, some events move to a later or earlier batch (out of
    order within a window of one batch). Keys are independent, so one feed checks many keys' histories per batch."""
    count = draw(st.integers(1, 120))
    keys = draw(st.integers(1, 30))
    events = [
        Event(
            key=draw(st.integers(0, keys - 1)),
            seq=seq,
            delete=draw(st.booleans().map(lambda b: b and draw(st.integers(0, 3)) == 0)),
            values=(draw(st.sampled_from(["x", "y", None])), draw(st.sampled_from([1, 2, None]))),
        )
        for seq in draw(st.permutations(range(1, count + 1)))
    ]
    if truncates:
        events = [
            Event(None, e.seq, False, e.values, truncate=True) if draw(st.integers(0, 30)) == 0 else e for e in events
        ]
    events.sort(key=lambda e: e.seq)
    cuts = sorted(draw(st.sets(st.integers(1, max(1, count - 1)), max_size=4)))
    bounds = [0, *[c for c in cuts if c < count], count]
    batches = [events[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    if shuffle and len(batches) > 1:
        rng = random.Random(draw(st.integers(0, 2**16)))
        for i in range(len(batches) - 1):
            for event in list(batches[i]):
                if rng.random() < 0.3:
                    batches[i].remove(event)
                    batches[i + 1].append(event)
            for event in list(batches[i + 1]):
                if rng.random() < 0.15 and event not in batches[i]:
                    batches[i + 1].remove(event)
                    batches[i].append(event)
        batches = [b for b in batches if b]
    return events, batches


def _create_target(path: Path, scd_type: int, layout: str) -> None:
    """A target created beforehand: with deletion vectors on (updates and deletes are written as deletion vectors),
    or partitioned by a value column (an update may move a row across partitions)."""
    if layout == "plain":
        return  # the first batch creates it
    fields = [("id", pa.int64()), ("a", pa.string()), ("b", pa.int64()), ("__START_AT", pa.int64())]
    if scd_type == 2:
        fields.append(("__END_AT", pa.int64()))
    schema = pa.schema([pa.field(n, t, nullable=n != "__START_AT") for n, t in fields])
    if layout == "deletion-vectors":
        write_deltalake(
            str(path), pa.Table.from_batches([], schema=schema), configuration={"delta.enableDeletionVectors": "true"}
        )
    else:
        write_deltalake(str(path), pa.Table.from_batches([], schema=schema), partition_by=["a"])


PROPERTY = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("scd_type", [1, 2])
@pytest.mark.parametrize("layout", ["plain", "deletion-vectors", "partitioned"])
@PROPERTY
@given(feed=feeds(shuffle=True))
def test_any_split_and_shuffle_ends_as_the_feed_in_order(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, scd_type: int, layout: str, feed: Any
) -> None:
    events, batches = feed
    target = tmp_path_factory.mktemp("cdc") / "t"
    _create_target(target, scd_type, layout)
    apply_batches(spark, target, batches, stored_as_scd_type=scd_type)
    expected = Model(VALUES, scd_type=scd_type).apply(events).table()
    assert table_rows(target, output_columns(scd_type)) == expected


@PROPERTY
@given(feed=feeds(shuffle=False))
def test_scd1_null_updates_kept_in_order(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, feed: Any
) -> None:
    """ignore_null_updates on one column: a null there keeps the value, in any split of an in-order feed (SCD 1
    keeps no events, so a late event cannot lend its values to the newer ones: docs/auto-cdc.md)."""
    events, batches = feed
    target = tmp_path_factory.mktemp("cdc") / "t"
    apply_batches(spark, target, batches, ignore_null_updates_column_list=("a",))
    expected = Model(VALUES, null_kept=frozenset({"a"})).apply(events).table()
    assert table_rows(target, output_columns(1)) == expected


@PROPERTY
@given(feed=feeds(shuffle=True))
def test_scd2_null_updates_and_tracked_columns_with_late_events(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, feed: Any
) -> None:
    """SCD 2 with nulls keeping values and history tracked on one column, events shuffled across batches: the
    history is recomputed from every event, so it ends as the feed in order; versions never overlap."""
    events, batches = feed
    target = tmp_path_factory.mktemp("cdc") / "t"
    apply_batches(
        spark,
        target,
        batches,
        stored_as_scd_type=2,
        ignore_null_updates_column_list=("b",),
        track_history_column_list=("a",),
    )
    expected = Model(VALUES, scd_type=2, null_kept=frozenset({"b"}), tracked=("a",)).apply(events).table()
    actual = table_rows(target, output_columns(2))
    assert actual == expected
    for key in {row[0] for row in actual}:
        versions = sorted((r[3], r[4]) for r in actual if r[0] == key)
        for (start, end), (next_start, _) in itertools.pairwise(versions):
            assert end is not None and start < end <= next_start  # contiguous or gapped by a delete, never overlapping
        assert all(end is None or start < end for start, end in versions)


@pytest.mark.parametrize("layout", ["plain", "deletion-vectors"])
@PROPERTY
@given(feed=feeds(shuffle=True, truncates=True))
def test_scd1_truncates_with_late_events(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, layout: str, feed: Any
) -> None:
    """apply_as_truncates: a truncate removes every row older than it, and no event older than it comes back later."""
    events, batches = feed
    target = tmp_path_factory.mktemp("cdc") / "t"
    _create_target(target, 1, layout)
    apply_batches(spark, target, batches, apply_as_truncates="op = 'T'")
    assert table_rows(target, output_columns(1)) == Model(VALUES).apply(events).table()


def test_scd1_end_to_end_semantics(spark: SparkSession, tmp_path: Path) -> None:
    """Duplicate keys in a batch, a late update after a delete (no resurrection), a late older update (ignored),
    a same-sequence delete and upsert (the upsert wins), and the target created by the first batch."""
    target = tmp_path / "t"
    first = [Event(1, 10, False, ("a", 1)), Event(1, 11, False, ("b", 2)), Event(2, 5, False, ("c", 3))]
    run_auto_cdc(spark, spec_for(target, first))
    assert table_rows(target, output_columns(1)) == [(1, "b", 2, 11), (2, "c", 3, 5)]
    second = [Event(2, 20, True, (None, None)), Event(1, 9, False, ("old", 0))]
    result = run_auto_cdc(spark, spec_for(target, second))
    assert result.result["num_deleted_rows"] == 1 and result.result["num_updated_rows"] == 0
    third = [Event(2, 15, False, ("late", 9)), Event(3, 7, True, (None, None)), Event(3, 7, False, ("tie", 1))]
    run_auto_cdc(spark, spec_for(target, third))
    assert table_rows(target, output_columns(1)) == [(1, "b", 2, 11), (3, "tie", 1, 7)]
    tombstones = DeltaTable(str(target / "_auto_cdc_tombstones")).to_pyarrow_table().to_pylist()
    assert tombstones == [{"id": 2, "__DELETE_AT": 20}]


def test_scd2_late_update_splits_a_version(spark: SparkSession, tmp_path: Path) -> None:
    target = tmp_path / "t"
    run_auto_cdc(
        spark, spec_for(target, [Event(1, 10, False, ("a", 1)), Event(1, 30, False, ("c", 1))], stored_as_scd_type=2)
    )
    run_auto_cdc(
        spark, spec_for(target, [Event(1, 20, False, ("b", 1)), Event(1, 40, True, (None, None))], stored_as_scd_type=2)
    )
    assert table_rows(target, output_columns(2)) == [
        (1, "a", 1, 10, 20),
        (1, "b", 1, 20, 30),
        (1, "c", 1, 30, 40),
    ]


def test_dry_run_changes_nothing(spark: SparkSession, tmp_path: Path) -> None:
    target = tmp_path / "t"
    run_auto_cdc(spark, spec_for(target, [Event(1, 1, False, ("a", 1))]))
    version = DeltaTable(str(target)).version()
    result = run_auto_cdc(spark, spec_for(target, [Event(1, 2, True, (None, None))]), dry_run=True)
    assert result.result["num_deleted_rows"] == 1 and result.table_version is None
    assert DeltaTable(str(target)).version() == version
    assert table_rows(target, output_columns(1)) == [(1, "a", 1, 1)]


@pytest.mark.parametrize(
    ("kwargs", "rows", "field"),
    [
        ({"keys": ("nope",)}, [{"id": 1, "seq": 1}], "keys"),
        ({"sequence_by": ("nope",)}, [{"id": 1, "seq": 1}], "sequence_by"),
        ({"sequence_by": ("map('a', seq)",)}, [{"id": 1, "seq": 1}], "sequence_by"),
        ({}, [{"id": 1, "seq": None}], "sequence_by"),
        ({}, [{"id": None, "seq": 1}], "keys"),
        ({"apply_as_deletes": "seq"}, [{"id": 1, "seq": 1}], "apply_as_deletes"),
        ({"column_list": ("seq",)}, [{"id": 1, "seq": 1}], "column_list"),
        ({"sequence_by": ("reflect('java.lang.System', 'exit', 1)",)}, [{"id": 1, "seq": 1}], "sequence_by"),
    ],
)
def test_bad_batches_fail_by_field_and_change_nothing(
    spark: SparkSession, tmp_path: Path, kwargs: dict[str, Any], rows: list[dict[str, Any]], field: str
) -> None:
    target = tmp_path / "t"
    options: dict[str, Any] = {"keys": ("id",), "sequence_by": ("seq",)}
    options.update(kwargs)
    spec = AutoCdcSpec(target=str(target), source=RowsSource(rows=rows, schema="id BIGINT, seq BIGINT"), **options)
    with pytest.raises(MergeServiceEngineError) as caught:
        run_auto_cdc(spark, spec)
    assert isinstance(caught.value, (MergeSpecError, SourceError))
    assert caught.value.field == field, str(caught.value)
    assert not target.exists()
