"""Tables the Delta layer's tests share, all made by deltalake (the reference implementation here)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

UTC = dt.UTC


def typed_rows(start: int, count: int) -> pa.Table:
    """Rows with every type the engine meets, NULLs in every column, strings longer than 32 characters."""
    ids = list(range(start, start + count))

    def maybe(i: int, value: object) -> object:
        return None if i % 7 == 3 else value

    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "i32": pa.array([maybe(i, i * 3 - 50) for i in ids], pa.int32()),
            "amount": pa.array([maybe(i, Decimal(i * 125) / 100) for i in ids], pa.decimal128(12, 2)),
            "ratio": pa.array([maybe(i, i / 8 - 3.0) for i in ids], pa.float64()),
            "name": pa.array([maybe(i, f"name-{i:04d}" + ("x" * 40 if i % 5 == 0 else "") + " é✓") for i in ids]),
            "day": pa.array([maybe(i, dt.date(2020, 1, 1) + dt.timedelta(days=i)) for i in ids], pa.date32()),
            "at": pa.array(
                [
                    maybe(i, dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=i * 3601, microseconds=i * 7))
                    for i in ids
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "flag": pa.array([maybe(i, i % 2 == 0) for i in ids], pa.bool_()),
            "info": pa.array(
                [maybe(i, {"k": i, "label": f"l{i % 3}"}) for i in ids],
                pa.struct([("k", pa.int64()), ("label", pa.string())]),
            ),
            "region": pa.array([None if i % 11 == 0 else ["eu", "us", "apac"][i % 3] for i in ids]),
        }
    )


@pytest.fixture
def typed_table(lake: Path) -> Path:
    """A deltalake table partitioned by region, after appends, a merge, a delete and a checkpoint."""
    from deltalake import DeltaTable, write_deltalake

    path = lake / "typed"
    write_deltalake(str(path), typed_rows(0, 40), partition_by=["region"])
    write_deltalake(str(path), typed_rows(40, 20), mode="append")
    table = DeltaTable(str(path))
    source = typed_rows(50, 20)
    (
        table.merge(source, predicate="t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    table = DeltaTable(str(path))
    table.create_checkpoint()
    table.delete("id % 9 = 4")
    write_deltalake(str(path), typed_rows(100, 5), mode="append")
    return path
