"""Every table feature Delta names, and what this layer does with a table that has it: one row per feature.

The protocol gate (``features``) reads these rows and nothing else, and ``docs/features.md`` is generated from
them (``python -m engine.delta.features --markdown``), so the docs' matrix and the code cannot disagree.

``read`` is whether a snapshot of such a table may be read (a merge's source, or a merge's target before it
writes); ``merge`` whether a merge may commit to it. PROTOCOL.md "Table Features": a reader must implement every
feature in ``readerFeatures``; a writer every feature in ``readerFeatures`` and ``writerFeatures``. A writer-only
feature therefore never stops a read, unless reading without its rules gives wrong rows (``read`` says so).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum


class Support(Enum):
    YES = "yes"
    UNUSED = "while unused"
    """Accepted while the table does not use it (checked against its metadata): a protocol may list a feature,
    or a legacy protocol version imply it, that no column or property uses."""
    NO = "no"


READER_WRITER = "reader+writer"
WRITER = "writer"


@dataclass(frozen=True)
class TableFeature:
    name: str
    kind: str
    """``reader+writer`` (in ``readerFeatures`` and ``writerFeatures``) or ``writer`` (``writerFeatures`` only)."""
    read: Support
    merge: Support
    notes: str


_Y, _U, _N = Support.YES, Support.UNUSED, Support.NO

FEATURES: tuple[TableFeature, ...] = (
    TableFeature("appendOnly", WRITER, _Y, _Y, "With `delta.appendOnly = true` only inserts are allowed."),
    TableFeature("invariants", WRITER, _Y, _Y, "Column invariants are checked on every written row."),
    TableFeature("checkConstraints", WRITER, _Y, _Y, "CHECK constraints are checked on every written row."),
    TableFeature("changeDataFeed", WRITER, _Y, _Y, "Change data files are written with every merge."),
    TableFeature(
        "generatedColumns", WRITER, _Y, _Y, "Generated values are computed for inserts and updates, and checked."
    ),
    TableFeature("allowColumnDefaults", WRITER, _Y, _Y, "An INSERT that names no value takes the column's default."),
    TableFeature(
        "columnMapping",
        READER_WRITER,
        _Y,
        _Y,
        "Modes `name` and `id`: files are read and written by physical name (and Parquet field id), the log keyed by "
        "physical name; schema evolution assigns new names and ids and raises `delta.columnMapping.maxColumnId`.",
    ),
    TableFeature(
        "identityColumns",
        WRITER,
        _Y,
        _Y,
        "INSERTs without a value generate one above `delta.identity.highWaterMark`, which the commit raises; "
        "explicit values only with `delta.identity.allowExplicitInsert`; updates of the column are refused.",
    ),
    TableFeature(
        "deletionVectors",
        READER_WRITER,
        _Y,
        _Y,
        "Scans drop deleted rows; merges write new vectors where `delta.enableDeletionVectors` is true.",
    ),
    TableFeature(
        "rowTracking",
        WRITER,
        _Y,
        _Y,
        "New files get `baseRowId` and `defaultRowCommitVersion` above the `delta.rowTracking` high-water mark; "
        "updated rows keep their row id (materialized columns) and take the commit's version, as Delta's MERGE does.",
    ),
    TableFeature(
        "domainMetadata",
        WRITER,
        _Y,
        _Y,
        "Domains are kept; two concurrent commits that set the same domain conflict.",
    ),
    TableFeature(
        "clustering",
        WRITER,
        _Y,
        _Y,
        "The `delta.clustering` domain is kept; merged files carry statistics on the clustering columns but are not "
        "clustered on write, as with Delta's MERGE (OPTIMIZE clusters them).",
    ),
    TableFeature(
        "inCommitTimestamp",
        WRITER,
        _Y,
        _Y,
        "When enabled, every commit's commitInfo comes first and carries a monotonic `inCommitTimestamp`.",
    ),
    TableFeature("timestampNtz", READER_WRITER, _Y, _Y, "TIMESTAMP_NTZ columns are read and written."),
    TableFeature(
        "v2Checkpoint",
        READER_WRITER,
        _Y,
        _Y,
        "UUID-named checkpoints and their sidecars are read; checkpoints the engine writes follow the V2 spec.",
    ),
    TableFeature(
        "vacuumProtocolCheck",
        READER_WRITER,
        _Y,
        _Y,
        "Concerns VACUUM only, which this engine does not run.",
    ),
    TableFeature(
        "typeWidening",
        READER_WRITER,
        _Y,
        _Y,
        "Files of the narrower type are read as the wider one; schema evolution widens columns as Delta's does "
        "(with `delta.enableTypeWidening`), recording `delta.typeChanges`.",
    ),
    TableFeature(
        "typeWidening-preview",
        READER_WRITER,
        _Y,
        _Y,
        "The preview name of typeWidening; the same rules.",
    ),
    TableFeature(
        "variantType",
        READER_WRITER,
        _Y,
        _Y,
        "VARIANT columns are read and written unshredded (their `metadata` and `value` binaries), as the feature "
        "requires; they have no statistics. Schema evolution does not add a VARIANT column to a table without "
        "the feature.",
    ),
    TableFeature("variantType-preview", READER_WRITER, _Y, _Y, "The preview name of variantType; the same rules."),
    TableFeature(
        "variantShredding",
        READER_WRITER,
        _N,
        _N,
        "Refused: shredded VARIANT values are not read or written.",
    ),
    TableFeature("variantShredding-preview", READER_WRITER, _N, _N, "The preview name of variantShredding."),
    TableFeature(
        "catalogManaged",
        READER_WRITER,
        _N,
        _N,
        "Refused: a catalog-managed table's commits must go through its catalog, and this engine commits to the "
        "file system.",
    ),
    TableFeature(
        "catalogOwned-preview", READER_WRITER, _N, _N, "The preview name of catalogManaged; refused the same way."
    ),
    TableFeature(
        "coordinatedCommits-preview",
        WRITER,
        _N,
        _N,
        "Refused: commits go through a commit coordinator, and the newest ones may not be in `_delta_log` yet.",
    ),
    TableFeature(
        "icebergCompatV1", WRITER, _Y, _N, "Refused: needs column mapping and Iceberg's rules on every write."
    ),
    TableFeature(
        "icebergCompatV2", WRITER, _Y, _N, "Refused: needs column mapping and Iceberg's rules on every write."
    ),
    TableFeature(
        "icebergCompatV3",
        WRITER,
        _Y,
        _N,
        "Refused: needs column mapping, row tracking and Iceberg's rules on every write.",
    ),
    TableFeature("icebergWriterCompatV1", WRITER, _Y, _N, "Refused: needs icebergCompatV2's rules on every write."),
    TableFeature("icebergWriterCompatV3", WRITER, _Y, _N, "Refused: needs icebergCompatV3's rules on every write."),
    TableFeature(
        "materializePartitionColumns",
        WRITER,
        _Y,
        _N,
        "Refused: data files would have to hold the partition columns too.",
    ),
    TableFeature(
        "checkpointProtection",
        WRITER,
        _Y,
        _Y,
        "Concerns removing old checkpoints and commits, which this engine never does.",
    ),
    TableFeature(
        "collations",
        WRITER,
        _Y,
        _U,
        "Refused once a column has a collation: comparisons in the merge would not follow it.",
    ),
    TableFeature("collations-preview", WRITER, _Y, _U, "The preview name of collations; the same rules."),
    TableFeature(
        "geospatial", READER_WRITER, _N, _N, "Refused: GEOMETRY and GEOGRAPHY columns are not read or written."
    ),
    TableFeature("geospatial-dev", READER_WRITER, _N, _N, "The development name of geospatial."),
    TableFeature(
        "redirectReaderWriter-preview",
        READER_WRITER,
        _N,
        _N,
        "Refused: the table redirects readers and writers to another location.",
    ),
    TableFeature(
        "redirectWriterOnly-preview", WRITER, _Y, _N, "Refused: the table redirects writers to another location."
    ),
)

BY_NAME: Mapping[str, TableFeature] = {f.name: f for f in FEATURES}


def feature(name: str) -> TableFeature | None:
    """The row of a feature Delta names, or None for a name this engine has never heard of."""
    return BY_NAME.get(name)


def markdown() -> str:
    """docs/features.md: the matrix, generated from ``FEATURES``."""
    lines = [
        "# Table features",
        "",
        "Generated from `engine/delta/feature_table.py` by `python -m engine.delta.features --markdown`; a test",
        "fails when the two differ.",
        "",
        "What the engine does with a table that has each table feature Delta names (PROTOCOL.md",
        '"Valid Feature Names in Table Features", and the features Delta on Spark knows). **read**: a snapshot',
        "of the table may be read (a merge's source, or its target); **merge**: a merge may commit to it.",
        "*while unused*: accepted while no column or property of the table uses the feature. A refusal happens",
        "before any work, names the feature and gives the reason below. A feature name not in this table is",
        "refused for merges, and for reads too when it is in `readerFeatures`.",
        "",
        "A table whose protocol lists table features (reader version 3 or writer version 7) must list in",
        "`writerFeatures` every feature its metadata enables (`delta.enableChangeDataFeed`,",
        "`delta.enableDeletionVectors`, `delta.appendOnly`, a CHECK constraint, a generated, identity,",
        "TIMESTAMP_NTZ or VARIANT column, ...). Delta refuses to load a table that does not",
        "(`DELTA_FEATURES_PROTOCOL_METADATA_MISMATCH`), and so does the engine, for reads and merges, naming each",
        "missing feature. deltalake's `alter.add_feature` makes such tables when given fewer features than the",
        "metadata enables (a Change Data Feed table given only `deletionVectors`): list them all.",
        "",
        "| feature | kind | read | merge | notes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for f in FEATURES:
        lines.append(f"| `{f.name}` | {f.kind} | {f.read.value} | {f.merge.value} | {f.notes} |")
    return "\n".join(lines) + "\n"
