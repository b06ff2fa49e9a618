"""The protocol gate: tables whose rules we would break are refused, naming the feature; the rest pass."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from engine.delta import Protocol, Transaction, check_can_modify, check_readable, check_supported, load_snapshot
from engine.delta.deletion_vectors import inline_descriptor
from engine.delta.feature_table import FEATURES, READER_WRITER, Support, markdown
from engine.delta.feature_upgrade import add_features
from engine.delta.features import check_protocol_and_metadata, main
from engine.errors import AppendOnlyTableError, UnsupportedTableFeatureError

from .util import hand_made_add, write_log_entry


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
        "icebergCompatV2",
        "catalogManaged",
        "catalogOwned-preview",
        "variantShredding",
        "someFutureFeature",
    ],
)
def test_features_we_do_not_implement(lake: Path, feature: str) -> None:
    row = next((f for f in FEATURES if f.name == feature), None)
    readers = (feature,) if row is not None and row.kind == READER_WRITER else ()
    _refused(_hand_made(lake, _features("appendOnly", feature, reader=readers)), feature)


def test_a_refusal_gives_the_reason() -> None:
    path_protocol = Protocol(3, 7, ("catalogManaged", "vacuumProtocolCheck"), ("catalogManaged", "vacuumProtocolCheck"))
    with pytest.raises(UnsupportedTableFeatureError) as refused:
        check_protocol_and_metadata(path_protocol, _metadata())
    assert "'catalogManaged'" in str(refused.value)
    assert "commits must go through its catalog" in str(refused.value)


def _metadata(**configuration: str) -> Any:
    from engine.delta import Metadata

    return Metadata(id=str(uuid.uuid4()), schema_string=_schema(), configuration=configuration)


def test_vacuum_protocol_check_is_accepted(lake: Path) -> None:
    """It concerns VACUUM only (PROTOCOL.md "VACUUM Protocol Check"), which the engine never runs."""
    features = _features("vacuumProtocolCheck", "checkpointProtection", reader=("vacuumProtocolCheck",))
    snapshot = load_snapshot(_hand_made(lake, features))
    check_supported(snapshot)
    Transaction(snapshot)


def test_writer_features_never_stop_a_read(lake: Path) -> None:
    """A reader implements ``readerFeatures`` only: a source table with a writer feature the engine does not know
    is read, not merged into."""
    path = _hand_made(
        lake,
        _features("rowTracking", "domainMetadata", "someFutureWriterFeature"),
        configuration={"delta.enableRowTracking": "true"},
    )
    snapshot = load_snapshot(path)
    check_readable(snapshot)
    with pytest.raises(UnsupportedTableFeatureError, match="someFutureWriterFeature"):
        check_supported(snapshot)
    with pytest.raises(UnsupportedTableFeatureError, match=r"'someFuture'.*cannot read"):
        check_readable(load_snapshot(_hand_made(lake, _features("someFuture", reader=("someFuture",)))))
    with pytest.raises(UnsupportedTableFeatureError, match=r"'catalogManaged'.*cannot read"):
        check_readable(load_snapshot(_hand_made(lake, _features("catalogManaged", reader=("catalogManaged",)))))
    coordinated = load_snapshot(_hand_made(lake, _features("coordinatedCommits-preview")))
    with pytest.raises(UnsupportedTableFeatureError, match=r"coordinatedCommits-preview.*cannot read"):
        check_readable(coordinated)


def test_the_feature_table_names_each_feature_once_with_a_reason() -> None:
    names = [f.name for f in FEATURES]
    assert len(names) == len(set(names))
    for f in FEATURES:
        assert f.notes.strip()
        # A feature merged into is read; one refused for reading is refused for merging.
        assert not (f.merge is Support.YES and f.read is not Support.YES), f.name
        assert not (f.read is Support.NO and f.merge is not Support.NO), f.name


def test_docs_matrix_is_generated_from_the_feature_table(capsys: pytest.CaptureFixture[str]) -> None:
    docs = Path(__file__).resolve().parents[3] / "docs" / "features.md"
    assert docs.read_text() == markdown(), "docs/features.md is stale: python -m engine.delta.features --markdown"
    assert main(["--markdown"]) == 0
    assert capsys.readouterr().out == markdown()


def test_a_table_with_variant_columns_is_merged(lake: Path) -> None:
    """Spark writes VARIANT unshredded under the engine's session settings, as variantType requires."""
    features = _features("variantType", reader=("variantType",))
    schema = json.dumps(
        {"type": "struct", "fields": [{"name": "v", "type": "variant", "nullable": True, "metadata": {}}]}
    )
    check_supported(load_snapshot(_hand_made(lake, features, schema=schema)))


def _legacy(writer: int, reader: int = 1) -> dict[str, Any]:
    return {"minReaderVersion": reader, "minWriterVersion": writer}


@pytest.mark.parametrize(
    ("protocol", "table"),
    [
        *((_legacy(writer), {}) for writer in (2, 3, 4, 5, 6)),
        (_legacy(5, reader=2), {"configuration": {"delta.columnMapping.mode": "none"}}),
        (_legacy(2), {"schema": _schema(**{"delta.invariants": '{"expression": {"expression": "id > 0"}}'})}),
        (_legacy(3), {"configuration": {"delta.constraints.small": "id < 10"}}),
        (_legacy(4), {"schema": _schema(**{"delta.generationExpression": "1"})}),
        # Identity columns are generated by every write (test_features_identity.py).
        (
            _legacy(6),
            {
                "schema": _schema(
                    **{"delta.identity.start": 1, "delta.identity.step": 1, "delta.identity.allowExplicitInsert": False}
                )
            },
        ),
    ],
)
def test_legacy_protocols_are_accepted_where_the_engine_honours_what_the_table_uses(
    lake: Path, protocol: dict[str, Any], table: dict[str, Any]
) -> None:
    """A legacy protocol implies every feature of its versions; those the table does not use are no reason to
    refuse it, and the row rules it uses are enforced."""
    check_supported(load_snapshot(_hand_made(lake, protocol, **table)))


@pytest.mark.parametrize(
    ("protocol", "field_metadata", "refusal"),
    [
        # Row rules that cannot be enforced are refused rather than skipped.
        (_legacy(2), {"delta.invariants": '{"rule": "id > 0"}'}, "invariant this engine"),
        (_legacy(2), {"__CHAR_VARCHAR_TYPE_STRING": "array<varchar(n)>"}, "CHAR/VARCHAR type this engine cannot"),
    ],
)
def test_legacy_protocols_are_refused_where_the_table_uses_what_the_engine_cannot_honour(
    lake: Path, protocol: dict[str, Any], field_metadata: dict[str, Any], refusal: str
) -> None:
    _refused(_hand_made(lake, protocol, schema=_schema(**field_metadata)), refusal)


def test_a_reader_version_past_the_known_ones_is_refused(lake: Path) -> None:
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
            hand_made_add({"numRecords": 2}, deletionVector=inline_descriptor([1]).to_json()),
        ],
    )
    pa.parquet.write_table(DATA, str(Path(path) / "part-0.parquet"))
    snapshot = load_snapshot(path)
    check_supported(snapshot)  # the scans drop the deleted rows (test_deletion_vectors.py)
    assert snapshot.files[0].num_live_records == 1


@pytest.mark.parametrize(
    ("configuration", "schema_field", "feature"),
    [
        ({"delta.enableChangeDataFeed": "true"}, None, "changeDataFeed"),
        ({"delta.appendOnly": "true"}, None, "appendOnly"),
        ({"delta.enableDeletionVectors": "true"}, None, "deletionVectors"),
        ({"delta.enableIcebergCompatV3": "true"}, None, "icebergCompatV3"),
        ({"delta.constraints.positive": "id > 0"}, None, "checkConstraints"),
        ({}, {"delta.generationExpression": "id + 1"}, "generatedColumns"),
    ],
)
def test_a_feature_the_metadata_enables_but_the_protocol_does_not_list_is_refused(
    lake: Path, configuration: dict[str, str], schema_field: dict[str, Any] | None, feature: str
) -> None:
    """Delta's assertTableFeaturesMatchMetadata: a table-features protocol must list what the metadata enables,
    or Delta refuses to load the table (DELTA_FEATURES_PROTOCOL_METADATA_MISMATCH); reading and merging both."""
    schema = _schema(**schema_field) if schema_field else None
    path = _hand_made(lake, _features("domainMetadata"), configuration=configuration, schema=schema)
    snapshot = load_snapshot(path)
    for check in (check_supported, check_readable):
        with pytest.raises(UnsupportedTableFeatureError, match=rf"'{feature}'.*DELTA_FEATURES_PROTOCOL_METADATA"):
            check(snapshot)
    reader = (feature,) if feature == "deletionVectors" else ()
    listed = load_snapshot(
        _hand_made(
            lake, _features("domainMetadata", feature, reader=reader), configuration=configuration, schema=schema
        )
    )
    assert feature not in str(_refusal(listed))


def _refusal(snapshot: Any) -> str:
    try:
        check_readable(snapshot)
    except UnsupportedTableFeatureError as exc:
        return str(exc)
    return ""


def test_legacy_protocols_imply_what_the_metadata_enables(lake: Path) -> None:
    """Writer version 4 carries changeDataFeed without a list: nothing is missing there."""
    path = _hand_made(lake, _legacy(4), configuration={"delta.enableChangeDataFeed": "true"})
    check_supported(load_snapshot(path))


def test_preview_names_serve_and_a_column_named_like_a_type_is_not_that_type(lake: Path) -> None:
    widening = _hand_made(
        lake,
        _features("typeWidening-preview", reader=("typeWidening-preview",)),
        configuration={"delta.enableTypeWidening": "true"},
    )
    check_readable(load_snapshot(widening))
    named = json.dumps(
        {"type": "struct", "fields": [{"name": "timestamp_ntz", "type": "long", "nullable": True, "metadata": {}}]}
    )
    check_supported(load_snapshot(_hand_made(lake, _features("domainMetadata"), schema=named)))
    ntz = json.dumps(
        {
            "type": "struct",
            "fields": [
                {"name": "id", "type": "long", "nullable": True, "metadata": {}},
                {
                    "name": "ts",
                    "type": {"type": "array", "elementType": "timestamp_ntz", "containsNull": True},
                    "nullable": True,
                    "metadata": {},
                },
            ],
        }
    )
    with pytest.raises(UnsupportedTableFeatureError, match="timestampNtz"):
        check_readable(load_snapshot(_hand_made(lake, _features("domainMetadata"), schema=ntz)))


def test_add_features_lists_what_the_metadata_enables(lake: Path) -> None:
    """deltalake's add_feature lists only what it is given; add_features keeps the table one Delta loads."""
    path = lake / "cdf"
    write_deltalake(str(path), DATA, configuration={"delta.enableChangeDataFeed": "true"})
    add_features(path, ["deletionVectors"])
    protocol = DeltaTable(str(path)).protocol()
    assert {"changeDataFeed", "deletionVectors"} <= set(protocol.writer_features or ())
    check_supported(load_snapshot(str(path)))
