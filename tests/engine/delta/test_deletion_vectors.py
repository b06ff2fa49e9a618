"""Deletion vectors: Z85, the bitmap and file formats, descriptors, and tables whose files carry vectors read as
delta-rs reads them."""

from __future__ import annotations

import json
import struct
import uuid
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from pyroaring import BitMap, BitMap64
from pyspark.sql import DataFrame, SparkSession

from engine.delta import (
    FILE_NAME_COL,
    FILE_PATH_COL,
    ROW_INDEX_COL,
    Transaction,
    check_supported,
    files_at_paths,
    load_snapshot,
    prune_files,
    scan_deleted_rows,
    scan_files,
    scan_files_with_path,
)
from engine.delta import scan as scan_module
from engine.delta.deletion_vectors import (
    MAGIC_NUMBER,
    NATIVE_MAGIC_NUMBER,
    DeletionVectorDescriptor,
    DeletionVectorError,
    deserialize_bitmap,
    inline_descriptor,
    read_deletion_vector,
    serialize_bitmap,
    write_deletion_vector_file,
    z85_decode,
    z85_encode,
)
from engine.delta.scan_columns import UNMAPPED_MARKER
from engine.errors import ConcurrentDeleteDeleteError, ConcurrentDeleteReadError

from .dv_tables import delete_rows, enable_deletion_vectors, file_paths, read_with_deltalake

# --- Z85 -----------------------------------------------------------------------------------------------------------


def test_z85_matches_the_zeromq_specification() -> None:
    data = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert z85_encode(data) == "HelloWorld"
    assert z85_decode("HelloWorld") == data


def test_z85_uuid_of_protocol_example_1() -> None:
    descriptor = DeletionVectorDescriptor.from_json(
        {
            "storageType": "u",
            "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
            "offset": 4,
            "sizeInBytes": 40,
            "cardinality": 6,
        }
    )
    assert descriptor.uuid == uuid.UUID("d2c639aa-8816-431a-aaf6-d3fe2512ff61")
    assert (
        descriptor.absolute_path("/mytable") == "/mytable/ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    )
    assert z85_encode(descriptor.uuid.bytes) == "^-aqEH.-t@S}K{vb[*k^"
    assert descriptor.unique_id == "uab^-aqEH.-t@S}K{vb[*k^@4"


def test_z85_of_protocol_example_3_holds_its_rows() -> None:
    raw = z85_decode("wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L")
    assert len(raw) == 40
    # The example's header is Delta's native layout written big-endian; the 32-bit bitmap after it is the one
    # the protocol lists: 3, 4, 7, 11, 18, 29.
    assert struct.unpack_from(">Iii", raw) == (NATIVE_MAGIC_NUMBER, 1, 28)
    assert list(BitMap.deserialize(raw[12:])) == [3, 4, 7, 11, 18, 29]
    # Delta's own readers take the magic number little-endian, so they refuse these bytes; so do we, by name.
    with pytest.raises(DeletionVectorError, match="magic number"):
        deserialize_bitmap(raw)


def test_z85_refuses_bad_text() -> None:
    with pytest.raises(DeletionVectorError, match="5-character"):
        z85_decode("abcd")
    with pytest.raises(DeletionVectorError, match="not a Z85 character"):
        z85_decode("abc~d")


# --- the bitmap ------------------------------------------------------------------------------------------------


def _portable(buckets: dict[int, list[int]]) -> bytes:
    """Delta's portable layout built by hand from 32-bit bitmaps: magic, bucket count, (key, bitmap) each."""
    out = struct.pack("<IQ", MAGIC_NUMBER, len(buckets))
    for key in sorted(buckets):
        out += struct.pack("<I", key) + BitMap(buckets[key]).serialize()
    return out


def test_bitmap_with_32_bit_and_wider_row_indexes() -> None:
    data = _portable({0: [0, 5, 70000], 1: [2], 7: [0, 4_000_000_000]})
    rows = deserialize_bitmap(data)
    assert list(rows) == [0, 5, 70000, (1 << 32) + 2, (7 << 32), (7 << 32) + 4_000_000_000]
    assert deserialize_bitmap(serialize_bitmap(rows)) == rows
    assert serialize_bitmap(rows)[:4] == struct.pack("<I", MAGIC_NUMBER)


def test_bitmap_in_native_layout() -> None:
    low, high = BitMap([1, 9]).serialize(), BitMap([3]).serialize()
    data = struct.pack("<Ii", NATIVE_MAGIC_NUMBER, 2)
    data += struct.pack("<i", len(low)) + low + struct.pack("<i", len(high)) + high
    assert list(deserialize_bitmap(data)) == [1, 9, (1 << 32) + 3]


def test_bitmap_refuses_keys_with_the_sign_bit_and_garbage() -> None:
    with pytest.raises(DeletionVectorError, match="most significant bit"):
        deserialize_bitmap(_portable({1 << 31: [1]}))
    with pytest.raises(ValueError, match="2\\*\\*63"):
        serialize_bitmap([1 << 63])
    with pytest.raises(DeletionVectorError):
        deserialize_bitmap(struct.pack("<IQ", MAGIC_NUMBER, 3) + b"\x01\x02")


# --- descriptors and files -------------------------------------------------------------------------------------------


def test_inline_round_trip_with_padding() -> None:
    rows = BitMap64([3, 4, 7, (1 << 40) + 1, (1 << 40) + 2])
    descriptor = inline_descriptor(rows)
    assert descriptor.storage_type == "i" and descriptor.offset is None and descriptor.cardinality == 5
    assert descriptor.size_in_bytes % 4 != 0  # padded to whole Z85 frames in the log
    assert read_deletion_vector(DeletionVectorDescriptor.from_json(descriptor.to_json()), "/nowhere") == rows


def test_file_round_trip_at_offsets_and_by_absolute_path(tmp_path: Path) -> None:
    first, second = BitMap64(range(0, 100_000, 3)), BitMap64([5, 1 << 35])
    one, two = write_deletion_vector_file(str(tmp_path), [first, second], prefix="ab")
    assert (one.offset, two.offset) == (1, 1 + 4 + one.size_in_bytes + 4)
    path = one.absolute_path(str(tmp_path))
    assert path.startswith(str(tmp_path / "ab" / "deletion_vector_")) and Path(path).is_file()
    assert read_deletion_vector(one, str(tmp_path)) == first
    assert read_deletion_vector(two, str(tmp_path)) == second
    by_path = DeletionVectorDescriptor("p", Path(path).as_uri(), two.size_in_bytes, two.cardinality, two.offset)
    assert read_deletion_vector(by_path, "/elsewhere") == second
    # The layout as the protocol spells it, read back without our reader.
    raw = Path(path).read_bytes()
    assert raw[0] == 1
    (size,) = struct.unpack_from(">I", raw, 1)
    assert size == one.size_in_bytes
    assert struct.unpack_from(">I", raw, 5 + size) == (zlib.crc32(raw[5 : 5 + size]),)


def test_checksum_mismatch_is_refused(tmp_path: Path) -> None:
    (descriptor,) = write_deletion_vector_file(str(tmp_path), [BitMap64([1, 2, 3])])
    path = Path(descriptor.absolute_path(str(tmp_path)))
    raw = bytearray(path.read_bytes())
    raw[-6] ^= 0xFF  # a byte of the bitmap data
    path.write_bytes(bytes(raw))
    with pytest.raises(DeletionVectorError, match="CRC-32"):
        read_deletion_vector(descriptor, str(tmp_path))


def test_descriptor_disagreements_are_refused(tmp_path: Path) -> None:
    (descriptor,) = write_deletion_vector_file(str(tmp_path), [BitMap64([1, 2, 3])])
    wrong_count = DeletionVectorDescriptor("u", descriptor.path_or_inline_dv, descriptor.size_in_bytes, 2, 1)
    with pytest.raises(DeletionVectorError, match="holds 3 rows"):
        read_deletion_vector(wrong_count, str(tmp_path))
    wrong_size = DeletionVectorDescriptor("u", descriptor.path_or_inline_dv, descriptor.size_in_bytes - 1, 3, 1)
    with pytest.raises(DeletionVectorError, match="descriptor says"):
        read_deletion_vector(wrong_size, str(tmp_path))
    missing = DeletionVectorDescriptor("u", z85_encode(uuid.uuid4().bytes), 10, 1, 1)
    with pytest.raises(DeletionVectorError, match="does not exist"):
        read_deletion_vector(missing, str(tmp_path))
    with pytest.raises(DeletionVectorError, match="storageType"):
        DeletionVectorDescriptor("x", "", 0, 0)


# --- tables ---------------------------------------------------------------------------------------------------------


def _rows(start: int, count: int) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})


def _dv_table(lake: Path) -> tuple[Path, list[str]]:
    path = lake / "dv"
    write_deltalake(str(path), _rows(0, 10))
    write_deltalake(str(path), _rows(10, 5), mode="append")
    enable_deletion_vectors(path)
    return path, file_paths(path)


def test_snapshot_reads_descriptors_and_live_counts(lake: Path) -> None:
    path, files = _dv_table(lake)
    delete_rows(path, {files[0]: [1, 3]})
    delete_rows(path, {files[0]: [5], files[1]: [0]}, storage="i")
    snapshot = load_snapshot(path)
    check_supported(snapshot)  # files with vectors are read now
    assert snapshot.has_deletion_vectors
    for f in snapshot.files:
        assert f.deletion_vector is not None and f.stats is not None and f.stats.tight_bounds is False
        assert f.num_live_records == (f.stats.num_records or 0) - f.deletion_vector.cardinality
    live = sum(f.num_live_records or 0 for f in snapshot.files)
    assert live == read_with_deltalake(path).num_rows == 11


def test_snapshot_after_checkpoint(lake: Path) -> None:
    from deltalake import DeltaTable

    path, files = _dv_table(lake)
    delete_rows(path, {files[1]: [2]})
    DeltaTable(str(path)).create_checkpoint()
    delete_rows(path, {files[0]: [0, 9]})
    snapshot = load_snapshot(path)
    counts = {f.path: f.num_deleted_rows for f in snapshot.files}
    assert counts == {files[0]: 2, files[1]: 1}
    older = load_snapshot(path, version=snapshot.version - 1)
    assert {f.path: f.deletion_vector for f in older.files}[files[0]] is None


@pytest.mark.parametrize("by_bitmaps", [False, True], ids=["inline", "bitmaps"])
@pytest.mark.parametrize("per_file", [True, False], ids=["file-by-file", "one-read"])
@pytest.mark.parametrize("storage", ["u", "i", "p"])
def test_scan_drops_deleted_rows(
    spark: SparkSession, lake: Path, storage: str, per_file: bool, by_bitmaps: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files with vectors are read one by one (few: each named by a literal) or together (many: named from the
    reader's path; with bitmaps, always together, each row joined to its file's bitmap by the reader's path);
    each row keeps its file's log path and row index every way."""
    monkeypatch.setattr(scan_module, "PER_FILE_SCAN_FILES", 1_000 if per_file else 0)
    monkeypatch.setattr(scan_deleted_rows, "INLINE_DELETED_ROWS", 0 if by_bitmaps else 1_000)
    stored_reads: list[bool] = []
    scan_stored = scan_module._scan_stored

    def recorded(*args: Any, **kwargs: Any) -> Any:
        stored_reads.append(bool(kwargs.get("per_file")))
        return scan_stored(*args, **kwargs)

    monkeypatch.setattr(scan_module, "_scan_stored", recorded)
    path, files = _dv_table(lake)
    delete_rows(
        path,
        {files[0]: [0, 4, 9], files[1]: [3]},
        storage="i" if storage == "i" else "u",
        absolute=storage == "p",
        prefix="dv" if storage == "u" else "",
    )
    snapshot = load_snapshot(path)
    expected = read_with_deltalake(path).column("id").to_pylist()
    assert len(expected) == 11
    for file_columns in (True, False):
        rows = scan_files(spark, snapshot, snapshot.files, file_columns=file_columns).collect()
        assert sorted(r["id"] for r in rows) == expected
    named = scan_files(spark, snapshot, snapshot.files).collect()
    assert {r[FILE_NAME_COL] for r in named} == set(files)
    for r in named:
        assert pq.read_table(path / r[FILE_NAME_COL]).column("id")[r[ROW_INDEX_COL]].as_py() == r["id"]
    # Bitmaps over an unpartitioned table's plain paths: one read of the files with vectors, never file by file.
    assert (True in stored_reads) is not by_bitmaps


def test_a_few_deleted_rows_stay_out_of_the_generated_code(
    spark: SparkSession, lake: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file's few deleted rows reach generated code by reference, so a new small vector does not compile the
    scan's code anew: no row index is written into it as a literal (``IN`` would write each one)."""
    path = lake / "few"
    write_deltalake(str(path), _rows(0, 2000))
    enable_deletion_vectors(path)
    files = file_paths(path)
    delete_rows(path, {files[0]: [1234, 1717]})
    snapshot = load_snapshot(path)
    scan = scan_files(spark, snapshot, snapshot.files)
    assert sorted(r["id"] for r in scan.select("id").collect()) == [i for i in range(2000) if i not in (1234, 1717)]
    capsys.readouterr()
    scan.explain(mode="codegen")
    code = capsys.readouterr().out
    assert "Generated code" in code
    assert "1234L" not in code and "1717L" not in code


@pytest.mark.parametrize(
    ("inline_limit", "bitmap_words", "row_bits"),
    [(0, 1_000_000, 40), (0, 0, 40), (0, 0, 4), (1_000_000, 0, 40)],
    ids=["bitmaps", "side-table", "side-table-pair", "inline"],
)
def test_scan_drops_deleted_rows_of_a_partitioned_table_every_way(
    spark: SparkSession,
    lake: Path,
    inline_limit: int,
    bitmap_words: int,
    row_bits: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plan-inline filter, the broadcast bitmaps (rows in every bit of a word, the sign bit included) and the
    side-table anti-join (on one long key, or on the pair when row indexes are too wide for it) give the same
    rows; partition values still join."""
    monkeypatch.setattr(scan_deleted_rows, "INLINE_DELETED_ROWS", inline_limit)
    monkeypatch.setattr(scan_deleted_rows, "BITMAP_WORDS", bitmap_words)
    monkeypatch.setattr(scan_deleted_rows, "_ROW_BITS", row_bits)
    path = lake / "parted"
    data = _rows(0, 3000).append_column("part", pa.array([["a b", "c"][i % 2] for i in range(3000)]))
    write_deltalake(str(path), data, partition_by=["part"])
    write_deltalake(str(path), _rows(3000, 10).append_column("part", pa.array(["c"] * 10)), mode="append")
    enable_deletion_vectors(path)
    files = file_paths(path)
    delete_rows(path, {files[0]: range(0, 1500, 2), files[1]: [7, 63, 127, 1499]})
    snapshot = load_snapshot(path)
    expected = read_with_deltalake(path)
    assert expected.num_rows == 3010 - 754
    rows = scan_files(spark, snapshot, snapshot.files).collect()
    assert sorted((r["id"], r["part"]) for r in rows) == sorted(
        zip(expected.column("id").to_pylist(), expected.column("part").to_pylist(), strict=True)
    )
    assert all(r[FILE_NAME_COL] in files for r in rows)
    with_path = scan_files_with_path(spark, snapshot, snapshot.files)
    touched = with_path.where("id % 1000 = 1").select(FILE_PATH_COL).distinct().collect()
    assert {f.path for f in files_at_paths(snapshot, snapshot.files, [r[0] for r in touched])} <= set(files)


@pytest.mark.parametrize(
    ("inline_limit", "bitmap_words", "partitioned"),
    [(1_000, 1_000_000, False), (0, 1_000_000, False), (0, 1_000_000, True), (0, 0, False)],
    ids=["inline", "bitmaps-one-read", "bitmaps-partitioned", "side-table"],
)
def test_a_prefilter_sees_the_stored_rows_and_the_scan_keeps_what_both_keep(
    spark: SparkSession,
    lake: Path,
    inline_limit: int,
    bitmap_words: int,
    partitioned: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A prefilter meets the files' rows before their vectors (deleted rows among them), on files with vectors
    and without, every way the vectors are applied; the scan gives the rows both the filter and the vectors keep,
    with their log paths and row indexes."""
    monkeypatch.setattr(scan_deleted_rows, "INLINE_DELETED_ROWS", inline_limit)
    monkeypatch.setattr(scan_deleted_rows, "BITMAP_WORDS", bitmap_words)
    path = lake / "prefiltered"
    parts = {"partition_by": ["part"]} if partitioned else {}

    def rows(start: int, count: int) -> pa.Table:
        return _rows(start, count).append_column("part", pa.array(["a", "b"][i % 2] for i in range(count)))

    write_deltalake(str(path), rows(0, 40), **parts)
    write_deltalake(str(path), rows(40, 30), mode="append", **parts)
    enable_deletion_vectors(path)
    files = file_paths(path)
    delete_rows(path, {files[0]: [0, 1, 5, 17], files[1]: [2, 3]})
    write_deltalake(str(path), rows(70, 10), mode="append", **parts)  # files without a vector
    snapshot = load_snapshot(path)
    wanted = set(range(0, 80, 3))
    keys = spark.createDataFrame([(i,) for i in sorted(wanted)], "key long")
    seen: list[int] = []

    def prefilter(stored: DataFrame) -> DataFrame:
        seen.append(stored.count())
        return stored.join(keys, stored["id"] == keys["key"], "left_semi")

    scanned = scan_files(spark, snapshot, snapshot.files, prefilter=prefilter).collect()
    live = set(read_with_deltalake(path).column("id").to_pylist())
    assert len(live) == 80 - 6
    assert sorted(r["id"] for r in scanned) == sorted(live & wanted)
    assert sum(seen) == 80  # every stored row, the deleted ones too
    for r in scanned:
        assert pq.read_table(path / unquote(r[FILE_NAME_COL])).column("id")[r[ROW_INDEX_COL]].as_py() == r["id"]


@pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned"])
def test_one_files_bitmap_meets_its_own_read(
    spark: SparkSession, lake: Path, partitioned: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One file with a vector among files without: its bitmap is crossed with its own read (no join by name, no
    read of the files together), every bit of a word and the last row included; the other files read as stored."""
    monkeypatch.setattr(scan_deleted_rows, "INLINE_DELETED_ROWS", 0)
    read_together: list[int] = []
    in_one_read = scan_deleted_rows._drop_by_bitmaps_in_one_read

    def recorded(*args: Any, **kwargs: Any) -> Any:
        read_together.append(1)
        return in_one_read(*args, **kwargs)

    monkeypatch.setattr(scan_deleted_rows, "_drop_by_bitmaps_in_one_read", recorded)
    path = lake / "one"
    data = _rows(0, 300)
    if partitioned:
        data = data.append_column("part", pa.array(["a b"] * 300))
    write_deltalake(str(path), data, partition_by=["part"] if partitioned else None)
    more = _rows(300, 5)
    if partitioned:
        more = more.append_column("part", pa.array(["c"] * 5))
    write_deltalake(str(path), more, mode="append")
    enable_deletion_vectors(path)
    files = file_paths(path)
    delete_rows(path, {files[0]: [0, 1, 63, 64, 127, 128, 200, 299]})
    snapshot = load_snapshot(path)
    expected = read_with_deltalake(path).column("id").to_pylist()
    assert len(expected) == 297
    named = scan_files(spark, snapshot, snapshot.files).collect()
    assert sorted(r["id"] for r in named) == sorted(expected)
    for r in named:
        assert r[FILE_NAME_COL] in files
        stored = pq.read_table(path / unquote(r[FILE_NAME_COL]), columns=["id"])
        assert stored.column("id")[r[ROW_INDEX_COL]].as_py() == r["id"]
    alone = [f for f in snapshot.files if f.path == files[0]]
    assert scan_files(spark, snapshot, alone, file_columns=False).count() == 292
    assert read_together == []


def test_files_of_one_size_meet_their_bitmaps_in_the_same_read(
    spark: SparkSession, lake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files read together meet their bitmaps by size; two files of the same size meet theirs by a hash of their
    path in the same read. Every file loses exactly its deleted rows and keeps its log path and row indexes."""
    monkeypatch.setattr(scan_deleted_rows, "INLINE_DELETED_ROWS", 0)
    reads: list[bool] = []
    in_one_read = scan_deleted_rows._drop_by_bitmaps_in_one_read

    def recorded(*args: Any, **kwargs: Any) -> Any:
        read = in_one_read(*args, **kwargs)
        reads.append(read is not None)
        return read

    monkeypatch.setattr(scan_deleted_rows, "_drop_by_bitmaps_in_one_read", recorded)
    path = lake / "sizes"
    write_deltalake(str(path), _rows(100, 40))
    write_deltalake(str(path), _rows(100, 40), mode="append")  # the same rows: the same size
    write_deltalake(str(path), _rows(300, 7), mode="append")
    write_deltalake(str(path), _rows(400, 90), mode="append")
    enable_deletion_vectors(path)
    files = file_paths(path)  # 90 rows, the two of 40, then 7
    sizes = {f.path: f.size for f in load_snapshot(path).files}
    assert sizes[files[1]] == sizes[files[2]] and len(set(sizes.values())) == 3
    delete_rows(path, {files[0]: range(0, 90, 3), files[1]: [0, 39], files[2]: [5], files[3]: [6]})
    snapshot = load_snapshot(path)
    expected = read_with_deltalake(path).column("id").to_pylist()
    assert len(expected) == 177 - 34
    named = scan_files(spark, snapshot, snapshot.files).collect()
    assert sorted(r["id"] for r in named) == sorted(expected)
    for r in named:
        assert pq.read_table(path / r[FILE_NAME_COL]).column("id")[r[ROW_INDEX_COL]].as_py() == r["id"]
    assert {r[FILE_NAME_COL] for r in named} == set(files)
    assert reads == [True]


def test_a_file_of_another_size_than_its_log_entry_fails_the_scan(
    spark: SparkSession, lake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file whose size is not the one its log entry gives meets no bitmap: the scan fails, naming the file,
    rather than passing its deleted rows."""
    monkeypatch.setattr(scan_deleted_rows, "INLINE_DELETED_ROWS", 0)
    path, files = _dv_table(lake)
    delete_rows(path, {files[0]: [0, 4, 9], files[1]: [3]})
    snapshot = load_snapshot(path)
    wrong = [replace(f, size=f.size + 1) if f.path == files[0] else f for f in snapshot.files]
    with pytest.raises(Exception, match=UNMAPPED_MARKER):
        scan_files(spark, snapshot, wrong, file_columns=False).collect()


def test_bitmaps_of_files_at_paths_spark_rewrites_are_applied_file_by_file(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path Spark does not report verbatim (here a space, which it escapes) cannot be joined by the reader's
    path: such files are read one by one, named by literals, and still lose exactly their deleted rows."""
    monkeypatch.setattr(scan_deleted_rows, "INLINE_DELETED_ROWS", 0)
    path, files = _dv_table(tmp_path / "a lake")
    delete_rows(path, {files[0]: [0, 4, 9], files[1]: [3]})
    snapshot = load_snapshot(path)
    expected = read_with_deltalake(path).column("id").to_pylist()
    named = scan_files(spark, snapshot, snapshot.files).collect()
    assert sorted(r["id"] for r in named) == expected
    for r in named:
        assert pq.read_table(path / r[FILE_NAME_COL]).column("id")[r[ROW_INDEX_COL]].as_py() == r["id"]


def test_scan_of_some_files_reads_their_vectors_only(spark: SparkSession, lake: Path) -> None:
    path, files = _dv_table(lake)
    delete_rows(path, {files[1]: [0, 1, 2, 3, 4]})  # every row of the small file
    snapshot = load_snapshot(path)
    small = [f for f in snapshot.files if f.path == files[1]]
    assert scan_files(spark, snapshot, small).count() == 0
    assert scan_files(spark, snapshot, snapshot.files, file_columns=False).count() == 10


# --- statistics and commits over vectors ------------------------------------------------------------------------


def test_skipping_reads_wide_statistics_as_bounds(lake: Path) -> None:
    """With ``tightBounds`` false, min/max bound the live rows and nullCount says only "none" or "all" of the
    physical rows: a file is skipped only where that proves no live row matches."""
    path = lake / "wide"
    write_deltalake(str(path), pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()), "n": pa.array([None, None, 5, 6])}))
    write_deltalake(
        str(path), pa.table({"id": pa.array([7, 8], pa.int64()), "n": pa.array([None, None])}), mode="append"
    )
    enable_deletion_vectors(path)
    mixed, nulls = file_paths(path)
    delete_rows(path, {mixed: [0, 1, 3]})  # live: id 3 (n 5) only; statistics still say n in [5, 6], 2 nulls
    snapshot = load_snapshot(path)

    def kept(predicate: str) -> set[str]:
        return {f.path for f in prune_files(snapshot, snapshot.files, predicate)}

    assert kept("id = 3") == {mixed}
    assert kept("id = 4") == {mixed}  # deleted, but bounds are wide: kept, never wrongly skipped
    assert kept("id > 100") == set()
    assert kept("n IS NOT NULL") == {mixed}  # nullCount == numRecords in the other: all null
    assert kept("n IS NULL") == {mixed, nulls}  # 2 of 4 physical nulls tells nothing of the live rows
    assert kept("n = 6") == {mixed}


def test_a_concurrent_vector_change_conflicts_with_a_merge_of_that_file(lake: Path) -> None:
    """Delta writes a new vector as remove + add of the same path: a transaction that read or rewrote the
    file loses; one whose reads the file cannot touch commits on top."""
    path, files = _dv_table(lake)
    snapshot = load_snapshot(path)
    first = snapshot.files_by_path[files[0]]

    rewrite = Transaction(snapshot)
    rewrite.record_read([first], "id < 5")
    reader = Transaction(snapshot)
    reader.record_read([first], "id < 5")
    elsewhere = Transaction(snapshot)
    elsewhere.record_read([], "id > 1000")
    delete_rows(path, {files[0]: [2]})

    with pytest.raises(ConcurrentDeleteDeleteError, match=files[0]):
        rewrite.commit([first.to_remove()], operation="MERGE", operation_parameters={})
    with pytest.raises(ConcurrentDeleteReadError, match=files[0]):
        reader.commit([], operation="MERGE", operation_parameters={})
    assert elsewhere.commit([], operation="MERGE", operation_parameters={}) == snapshot.version + 2


def test_remove_carries_the_vector_of_the_file_it_removes(lake: Path) -> None:
    path, files = _dv_table(lake)
    delete_rows(path, {files[0]: [4]}, storage="i")
    snapshot = load_snapshot(path)
    first = snapshot.files_by_path[files[0]]
    version = Transaction(snapshot).commit([first.to_remove()], operation="DELETE", operation_parameters={})
    actions = [json.loads(line) for line in (path / "_delta_log" / f"{version:020d}.json").read_text().splitlines()]
    (remove,) = [a["remove"] for a in actions if "remove" in a]
    assert remove["deletionVector"] == first.deletion_vector.to_json()  # type: ignore[union-attr]
    assert read_with_deltalake(path).column("id").to_pylist() == list(range(10, 15))
