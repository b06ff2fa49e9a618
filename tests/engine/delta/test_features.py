"""The protocol gate: tables whose rules we would break are refused, naming the feature; the rest pass."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from engine.delta import Protocol, Transaction, check_can_modify, check_supported, load_snapshot
from engine.delta.deletion_vectors import inline_descriptor
from engine.delta.features import check_protocol_and_metadata
from engine.errors import AppendOnlyTableError, UnsupportedTableFeatureError

from .util import write_log_entry


def _schema(**field_metadata: Any) -> str:
    return json.dumps(
        {
            "type": "struct",
            "fields": [
                {"name": "id", "type": "long", "nullable": True, "metadata": field_metadata},
                {"name": "v", "type": "string", "nullable": True, "metadata": {}},
            ],
        }
    )


def _hand_made(
    lake: Path,
    protocol: dict[str, Any],
    *,
    configuration: dict[str, str] | None = None,
    schema: str | None = None,
    extra: list[dict[str, Any]] | None = None,
) -> str:
    path = lake / f"t-{uuid.uuid4().hex[:8]}"
    write_log_entry(
        path,
        0,
        [
            {"commitInfo": {"operation": "CREATE TABLE"}},
            {"protocol": protocol},
            {
                "metaData": {
                    "id": str(uuid.uuid4()),
                    "format": {"provider": "parquet", "options": {}},
                    "schemaString": schema or _schema(),
                    "partitionColumns": [],
                    "configuration": configuration or {},
                    "createdTime": 0,
                }
            },
            *(extra or []),
        ],
    )
    return str(path)


def _refused(path: str, feature: str) -> None:
    with pytest.raises(UnsupportedTableFeatureError, match=feature):
        snapshot = load_snapshot(path)
        check_supported(snapshot)


def _features(*names: str, reader: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": list(reader), "writerFeatures": list(names)}


DATA = pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})


def test_tables_deltalake_makes(lake: Path) -> None:
    plain = str(lake / "plain")
    write_deltalake(plain, DATA)
    check_supported(load_snapshot(plain))
    cdf = str(lake / "cdf")
    write_deltalake(cdf, DATA, configuration={"delta.enableChangeDataFeed": "true"})
    check_supported(load_snapshot(cdf))
    ntz = str(lake / "ntz")
    write_deltalake(ntz, pa.table({"at": pa.array([0], pa.timestamp("us"))}))
    snapshot = load_snapshot(ntz)
    assert "timestampNtz" in (snapshot.protocol.writer_features or ())
    check_supported(snapshot)

    dv = str(lake / "dv")
    write_deltalake(dv, DATA, configuration={"delta.enableDeletionVectors": "true"})
    snapshot = load_snapshot(dv)
    assert "deletionVectors" in (snapshot.protocol.writer_features or ())
    check_supported(snapshot)
    mapping = str(lake / "mapping")
    write_deltalake(mapping, DATA, configuration={"delta.columnMapping.mode": "name"})
    check_supported(load_snapshot(mapping))  # column mapping is implemented (test_column_mapping)
    checked = str(lake / "checked")
    write_deltalake(checked, DATA)
    DeltaTable(checked).alter.add_constraint({"positive": "id > 0"})
    check_supported(load_snapshot(checked))  # every write enforces it (test_write, test_merge_rules)


def test_append_only(lake: Path) -> None:
    path = str(lake / "append-only")
    write_deltalake(path, DATA, configuration={"delta.appendOnly": "true"})
    snapshot = load_snapshot(path)
    check_supported(snapshot)
    with pytest.raises(AppendOnlyTableError, match="append-only"):
        check_can_modify(snapshot)


@pytest.mark.parametrize(
    "feature",
    [
        "rowTracking",
        "domainMetadata",
        "inCommitTimestamp",
        "clustering",
        "icebergCompatV2",
        "vacuumProtocolCheck",
        "v2Checkpoint",
        "typeWidening",
        "someFutureFeature",
    ],
)
def test_features_we_do_not_implement(lake: Path, feature: str) -> None:
    readers = (feature,) if feature in ("v2Checkpoint", "typeWidening", "vacuumProtocolCheck") else ()
    _refused(_hand_made(lake, _features("appendOnly", feature, reader=readers)), feature)


def test_variant_type_is_refused_only_when_a_column_is_a_variant(lake: Path) -> None:
    """deltalake enables variantType on the tables it creates with table features, VARIANT column or not."""
    features = _features("variantType", reader=("variantType",))
    check_supported(load_snapshot(_hand_made(lake, features)))
    schema = json.dumps(
        {"type": "struct", "fields": [{"name": "v", "type": "variant", "nullable": True, "metadata": {}}]}
    )
    _refused(_hand_made(lake, features, schema=schema), "variantType")


def test_legacy_protocols_imply_features_only_used_ones_refused(lake: Path) -> None:
    for writer in (2, 3, 4, 5, 6):
        check_supported(load_snapshot(_hand_made(lake, {"minReaderVersion": 1, "minWriterVersion": writer})))
    check_supported(
        load_snapshot(
            _hand_made(
                lake, {"minReaderVersion": 2, "minWriterVersion": 5}, configuration={"delta.columnMapping.mode": "none"}
            )
        )
    )
    check_supported(
        load_snapshot(
            _hand_made(
                lake,
                {"minReaderVersion": 1, "minWriterVersion": 2},
                schema=_schema(**{"delta.invariants": '{"expression": {"expression": "id > 0"}}'}),
            )
        )
    )
    check_supported(
        load_snapshot(
            _hand_made(
                lake,
                {"minReaderVersion": 1, "minWriterVersion": 3},
                configuration={"delta.constraints.small": "id < 10"},
            )
        )
    )
    # Row rules that cannot be enforced are refused rather than skipped.
    _refused(
        _hand_made(
            lake,
            {"minReaderVersion": 1, "minWriterVersion": 2},
            schema=_schema(**{"delta.invariants": '{"rule": "id > 0"}'}),
        ),
        "invariant this engine",
    )
    _refused(
        _hand_made(
            lake,
            {"minReaderVersion": 1, "minWriterVersion": 2},
            schema=_schema(**{"__CHAR_VARCHAR_TYPE_STRING": "array<varchar(3)>"}),
        ),
        "CHAR/VARCHAR",
    )
    check_supported(
        load_snapshot(
            _hand_made(
                lake,
                {"minReaderVersion": 1, "minWriterVersion": 4},
                schema=_schema(**{"delta.generationExpression": "1"}),
            )
        )
    )
    _refused(
        _hand_made(
            lake,
            {"minReaderVersion": 1, "minWriterVersion": 6},
            schema=_schema(
                **{"delta.identity.start": 1, "delta.identity.step": 1, "delta.identity.allowExplicitInsert": False}
            ),
        ),
        "identityColumns",
    )
    with pytest.raises(UnsupportedTableFeatureError, match="reader version 4"):
        check_protocol_and_metadata(Protocol(4, 7, (), ()), load_snapshot(_hand_made(lake, _features())).metadata)


def test_table_features_accepted_while_unused(lake: Path) -> None:
    path = _hand_made(
        lake,
        _features(
            "appendOnly",
            "invariants",
            "checkConstraints",
            "generatedColumns",
            "identityColumns",
            "changeDataFeed",
            "columnMapping",
            "deletionVectors",
            "timestampNtz",
            reader=("columnMapping", "deletionVectors", "timestampNtz"),
        ),
        configuration={"delta.enableDeletionVectors": "false"},
    )
    snapshot = load_snapshot(path)
    check_supported(snapshot)
    Transaction(snapshot)  # a transaction checks the gate too


def test_deletion_vectors_on_files_are_read(lake: Path) -> None:
    path = _hand_made(
        lake,
        _features("deletionVectors", reader=("deletionVectors",)),
        extra=[
            {
                "add": {
                    "path": "part-0.parquet",
                    "partitionValues": {},
                    "size": 10,
                    "modificationTime": 0,
                    "dataChange": True,
                    "stats": '{"numRecords":2}',
                    "deletionVector": inline_descriptor([1]).to_json(),
                }
            }
        ],
    )
    pa.parquet.write_table(DATA, str(Path(path) / "part-0.parquet"))
    snapshot = load_snapshot(path)
    check_supported(snapshot)  # the scans drop the deleted rows (test_deletion_vectors.py)
    assert snapshot.files[0].num_live_records == 1
