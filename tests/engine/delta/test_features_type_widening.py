"""Type widening: which changes schema evolution applies (Delta's TypeWidening rules), and snapshots of widened
tables: accepted by the gate, their widened columns' old-typed statistics left out of data skipping."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from pyspark.sql import types as T

from engine.delta import Metadata, Protocol, check_supported, load_snapshot
from engine.delta.type_widening import is_schema_evolution_widening, type_widening_enabled, widened_field

from .util import hand_made_add, write_log_entry


@pytest.mark.parametrize(
    ("frm", "to", "widens"),
    [
        (T.ByteType(), T.ShortType(), True),
        (T.ShortType(), T.IntegerType(), True),
        (T.IntegerType(), T.LongType(), True),
        (T.ByteType(), T.LongType(), True),
        (T.LongType(), T.IntegerType(), False),
        (T.FloatType(), T.DoubleType(), True),
        (T.IntegerType(), T.DoubleType(), False),  # a supported change, but not one schema evolution applies
        (T.DateType(), T.TimestampNTZType(), True),
        (T.DateType(), T.TimestampType(), False),
        (T.DecimalType(5, 2), T.DecimalType(10, 4), True),
        (T.DecimalType(5, 2), T.DecimalType(6, 3), True),
        (T.DecimalType(5, 2), T.DecimalType(6, 4), False),  # fewer integral digits
        (T.DecimalType(5, 2), T.DecimalType(5, 2), False),
        (T.IntegerType(), T.DecimalType(20, 0), False),
        (T.StringType(), T.LongType(), False),
    ],
)
def test_schema_evolution_widenings(frm: T.DataType, to: T.DataType, widens: bool) -> None:
    assert is_schema_evolution_widening(frm, to) is widens


def test_widened_field_records_each_change() -> None:
    field = T.StructField("n", T.ShortType(), True, {"comment": "kept"})
    once = widened_field(field, T.IntegerType())
    twice = widened_field(once, T.LongType())
    assert twice.dataType == T.LongType()
    assert twice.metadata == {
        "comment": "kept",
        "delta.typeChanges": [
            {"fromType": "short", "toType": "integer"},
            {"fromType": "integer", "toType": "long"},
        ],
    }


def test_type_widening_needs_the_feature_and_the_property() -> None:
    features = Protocol(3, 7, ("typeWidening",), ("typeWidening",))
    on = Metadata(id="x", schema_string="{}", configuration={"delta.enableTypeWidening": "true"})
    assert type_widening_enabled(features, on)
    assert not type_widening_enabled(Protocol(1, 2), on)
    assert not type_widening_enabled(features, Metadata(id="x", schema_string="{}"))


def test_widened_tables_are_merged_without_their_old_statistics(lake: Path) -> None:
    path = lake / f"widened-{uuid.uuid4().hex[:6]}"
    schema = {
        "type": "struct",
        "fields": [
            {
                "name": "id",
                "type": "long",
                "nullable": True,
                "metadata": {"delta.typeChanges": [{"fromType": "integer", "toType": "long"}]},
            },
            {"name": "d", "type": "timestamp_ntz", "nullable": True, "metadata": {}},
        ],
    }
    schema["fields"][1]["metadata"] = {"delta.typeChanges": [{"fromType": "date", "toType": "timestamp_ntz"}]}
    stats = {"numRecords": 2, "minValues": {"id": 1, "d": "2020-01-01"}, "maxValues": {"id": 2, "d": "2020-01-02"}}
    write_log_entry(
        path,
        0,
        [
            {"commitInfo": {"operation": "CHANGE COLUMN"}},
            {
                "protocol": {
                    "minReaderVersion": 3,
                    "minWriterVersion": 7,
                    "readerFeatures": ["typeWidening", "timestampNtz"],
                    "writerFeatures": ["typeWidening", "timestampNtz"],
                }
            },
            {
                "metaData": {
                    "id": str(uuid.uuid4()),
                    "format": {"provider": "parquet", "options": {}},
                    "schemaString": json.dumps(schema),
                    "partitionColumns": [],
                    "configuration": {"delta.enableTypeWidening": "true"},
                    "createdTime": 0,
                }
            },
            hand_made_add(stats),
        ],
    )
    snapshot = load_snapshot(path)
    check_supported(snapshot)
    (add,) = snapshot.files
    assert add.stats is not None and add.stats.num_records == 2
    assert add.stats.min_values == {} and add.stats.max_values == {}
