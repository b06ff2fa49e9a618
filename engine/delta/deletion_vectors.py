"""Delta's deletion vectors: the descriptor in ``add``/``remove``, the files that hold them, and their bitmaps.

PROTOCOL.md "Deletion Vectors", "Deletion Vector Format" and "Deletion Vector File Storage Format":

- a descriptor names where the vector's bytes are: ``u`` a file ``<prefix>/deletion_vector_<uuid>.bin`` under the
  table (``pathOrInlineDv`` is the optional prefix then the Z85-encoded UUID, 20 characters), ``p`` a file by
  absolute path, ``i`` the bytes themselves, Z85-encoded, in the log;
- a DV file is a version byte (1), then for each vector at its ``offset``: its size (big-endian int32), the
  bitmap bytes and their CRC-32 (big-endian);
- the bitmap bytes are Delta's RoaringBitmapArray: the little-endian magic 1681511377, then RoaringBitmap's
  "portable" 64-bit format (a count of 32-bit buckets, then each bucket's high 32 bits and a 32-bit RoaringBitmap).

The rows a vector holds are row indexes in the data file (Parquet row positions from 0): rows logically deleted.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyroaring import BitMap, BitMap64

from engine.delta.paths import log_path_to_local
from engine.delta.storage import may_pass, storage_for
from engine.errors import DeltaError, StorageWriteError

MAGIC_NUMBER = 1681511377
"""RoaringBitmapArray's magic number (little-endian, first four bytes of every serialized vector)."""

NATIVE_MAGIC_NUMBER = 1681511376
"""The magic number of Delta's older native RoaringBitmapArray layout, which its readers still accept."""

FORMAT_VERSION = 1
"""The version byte that starts a deletion vector file."""

MAX_ROW_INDEX = (1 << 63) - 1
"""Delta requires every bucket key's most significant bit to be 0: row indexes stay below 2**63."""

UUID_Z85_LENGTH = 20

Z85_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(Z85_ALPHABET)}


class DeletionVectorError(DeltaError):
    """A deletion vector that cannot be read as the protocol defines it (bad descriptor, file, checksum...)."""

    title = "Unreadable deletion vector"


# --- Z85 (ZeroMQ RFC 32), the Base85 variant Delta uses ---------------------------------------------------------


def z85_encode(data: bytes) -> str:
    """Z85 text of ``data``, whose length must be a multiple of 4 (ZeroMQ's rule)."""
    if len(data) % 4:
        raise ValueError(f"Z85 encodes whole 4-byte frames, not {len(data)} bytes")
    out = []
    for (word,) in struct.iter_unpack(">I", data):
        chars = []
        for _ in range(5):
            word, digit = divmod(word, 85)
            chars.append(Z85_ALPHABET[digit])
        out.append("".join(reversed(chars)))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    """The bytes of Z85 ``text``, whose length must be a multiple of 5."""
    if len(text) % 5:
        raise DeletionVectorError(f"Z85 text has whole 5-character frames, not {len(text)} characters")
    out = bytearray()
    for start in range(0, len(text), 5):
        word = 0
        for char in text[start : start + 5]:
            digit = _Z85_INDEX.get(char)
            if digit is None:
                raise DeletionVectorError(f"{char!r} is not a Z85 character")
            word = word * 85 + digit
        if word > 0xFFFFFFFF:
            raise DeletionVectorError(f"Z85 frame {text[start : start + 5]!r} is out of range")
        out += struct.pack(">I", word)
    return bytes(out)


# --- the bitmap ------------------------------------------------------------------------------------------------


def serialize_bitmap(rows: BitMap64 | Iterable[int]) -> bytes:
    """Delta's RoaringBitmapArray bytes of the row indexes ``rows``."""
    bitmap = rows if isinstance(rows, BitMap64) else BitMap64(rows)
    if bitmap and bitmap.max() > MAX_ROW_INDEX:
        raise ValueError(f"Row index {bitmap.max()} is above Delta's limit of 2**63 - 1")
    bitmap.run_optimize()
    return struct.pack("<I", MAGIC_NUMBER) + bitmap.serialize()


def deserialize_bitmap(data: bytes) -> BitMap64:
    """The row indexes of RoaringBitmapArray bytes: the portable format Delta writes, or the native one
    (magic 1681511376) that Delta's readers also accept."""
    if len(data) < 8:
        raise DeletionVectorError(f"A deletion vector bitmap has at least 8 bytes, this one {len(data)}")
    (magic,) = struct.unpack_from("<I", data)
    if magic == NATIVE_MAGIC_NUMBER:
        bitmap = _deserialize_native(data)
    elif magic == MAGIC_NUMBER:
        if len(data) < 12:
            raise DeletionVectorError(f"A portable deletion vector bitmap has at least 12 bytes, not {len(data)}")
        (buckets,) = struct.unpack_from("<Q", data, 4)
        if buckets > (len(data) - 12) // 4:
            raise DeletionVectorError(f"Deletion vector claims {buckets} buckets in {len(data)} bytes")
        try:
            bitmap = BitMap64.deserialize(data[4:])
        except (ValueError, MemoryError) as exc:
            raise DeletionVectorError(f"Deletion vector bitmap cannot be decoded: {exc}") from exc
    else:
        raise DeletionVectorError(
            f"Deletion vector magic number is {magic} (little-endian), not {MAGIC_NUMBER} or {NATIVE_MAGIC_NUMBER}"
        )
    if bitmap and bitmap.max() > MAX_ROW_INDEX:
        raise DeletionVectorError("Deletion vector has a bucket key with its most significant bit set")
    return bitmap


def _deserialize_native(data: bytes) -> BitMap64:
    """Delta's native RoaringBitmapArray: a count (int32), then per 32-bit bucket its size and bitmap."""
    (count,) = struct.unpack_from("<i", data, 4)
    if count < 0 or count > (len(data) - 8) // 4:
        raise DeletionVectorError(f"Deletion vector claims {count} buckets in {len(data)} bytes")
    bitmap = BitMap64()
    position = 8
    for high in range(count):
        if position + 4 > len(data):
            raise DeletionVectorError("Deletion vector ends inside its bucket list")
        (size,) = struct.unpack_from("<i", data, position)
        position += 4
        if size < 0 or position + size > len(data):
            raise DeletionVectorError(f"Deletion vector bucket {high} claims {size} bytes past the end")
        try:
            low = BitMap.deserialize(data[position : position + size])
        except (ValueError, MemoryError) as exc:
            raise DeletionVectorError(f"Deletion vector bucket {high} cannot be decoded: {exc}") from exc
        bitmap.update((high << 32) | value for value in low)
        position += size
    return bitmap


# --- the descriptor ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeletionVectorDescriptor:
    """The ``deletionVector`` struct of an ``add`` or ``remove`` action."""

    storage_type: str
    path_or_inline_dv: str
    size_in_bytes: int
    cardinality: int
    offset: int | None = None

    def __post_init__(self) -> None:
        if self.storage_type not in ("u", "i", "p"):
            raise DeletionVectorError(f"Deletion vector storageType {self.storage_type!r} is not one of u, i, p")
        if self.storage_type == "u" and len(self.path_or_inline_dv) < UUID_Z85_LENGTH:
            raise DeletionVectorError(
                f"A 'u' deletion vector names a {UUID_Z85_LENGTH}-character UUID, not {self.path_or_inline_dv!r}"
            )
        if self.size_in_bytes < 0 or self.cardinality < 0 or (self.offset is not None and self.offset < 0):
            raise DeletionVectorError("Deletion vector sizes, offsets and cardinalities are not negative")

    @property
    def is_inline(self) -> bool:
        return self.storage_type == "i"

    @property
    def unique_id(self) -> str:
        """PROTOCOL.md's derived ``uniqueId``: tells two vectors of the same file apart."""
        base = self.storage_type + self.path_or_inline_dv
        return base if self.offset is None else f"{base}@{self.offset}"

    def absolute_path(self, root: str) -> str:
        """The local path of the DV file (``u`` and ``p``), resolved as data file paths are."""
        if self.storage_type == "p":
            return log_path_to_local(self.path_or_inline_dv, root)
        if self.storage_type == "u":
            prefix = self.path_or_inline_dv[:-UUID_Z85_LENGTH]
            name = f"deletion_vector_{self.uuid}.bin"
            return log_path_to_local(f"{prefix}/{name}" if prefix else name, root)
        raise DeletionVectorError("An inline deletion vector has no file")

    @property
    def uuid(self) -> uuid.UUID:
        """The UUID that names a ``u`` vector's file."""
        return uuid.UUID(bytes=z85_decode(self.path_or_inline_dv[-UUID_Z85_LENGTH:]))

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"storageType": self.storage_type, "pathOrInlineDv": self.path_or_inline_dv}
        if self.offset is not None:
            body["offset"] = self.offset
        body["sizeInBytes"] = self.size_in_bytes
        body["cardinality"] = self.cardinality
        return body

    @staticmethod
    def from_json(body: Mapping[str, Any]) -> DeletionVectorDescriptor:
        try:
            offset = body.get("offset")
            return DeletionVectorDescriptor(
                storage_type=str(body["storageType"]),
                path_or_inline_dv=str(body["pathOrInlineDv"]),
                size_in_bytes=int(body["sizeInBytes"]),
                cardinality=int(body["cardinality"]),
                offset=None if offset is None else int(offset),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DeletionVectorError(f"Malformed deletionVector descriptor {dict(body)!r}: {exc}") from exc


def inline_descriptor(rows: BitMap64 | Iterable[int]) -> DeletionVectorDescriptor:
    """An ``i`` descriptor holding ``rows`` in the log (for small vectors). Z85 needs whole 4-byte frames, so the
    bytes are padded with zeros; ``sizeInBytes`` is the unpadded size."""
    bitmap = rows if isinstance(rows, BitMap64) else BitMap64(rows)
    data = serialize_bitmap(bitmap)
    padded = data + b"\0" * (-len(data) % 4)
    return DeletionVectorDescriptor("i", z85_encode(padded), len(data), len(bitmap))


def write_deletion_vector_file(
    root: str, bitmaps: Sequence[BitMap64 | Iterable[int]], *, prefix: str = ""
) -> list[DeletionVectorDescriptor]:
    """Write one DV file under ``root`` (in folder ``prefix``) holding ``bitmaps``; answer their ``u``
    descriptors in order. The file is written whole before any descriptor exists, so a crash leaves at most an
    unreferenced file."""
    file_id = uuid.uuid4()
    body = bytearray([FORMAT_VERSION])
    found: list[tuple[int, int, int]] = []
    for rows in bitmaps:
        bitmap = rows if isinstance(rows, BitMap64) else BitMap64(rows)
        data = serialize_bitmap(bitmap)
        found.append((len(body), len(data), len(bitmap)))
        body += struct.pack(">I", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    key = f"{prefix}/deletion_vector_{file_id}.bin" if prefix else f"deletion_vector_{file_id}.bin"
    try:
        storage_for(root).put(key, bytes(body))
    except OSError as exc:
        message = f"Cannot write the deletion vector file {key} of {root}: {exc}"
        raise (StorageWriteError(message) if may_pass(exc) else DeltaError(message)) from exc
    encoded = prefix + z85_encode(file_id.bytes)
    return [DeletionVectorDescriptor("u", encoded, size, count, offset) for offset, size, count in found]


# --- reading -----------------------------------------------------------------------------------------------------


def read_deletion_vector(descriptor: DeletionVectorDescriptor, root: str) -> BitMap64:
    """The deleted row indexes a descriptor names, checked against its size, checksum and cardinality."""
    if descriptor.cardinality == 0 and descriptor.size_in_bytes == 0:
        return BitMap64()  # Delta's DeletionVectorDescriptor.EMPTY: an inline vector of no bytes
    if descriptor.is_inline:
        raw = z85_decode(descriptor.path_or_inline_dv)
        if len(raw) < descriptor.size_in_bytes:
            raise DeletionVectorError(
                f"Inline deletion vector has {len(raw)} bytes, its descriptor says {descriptor.size_in_bytes}"
            )
        data = raw[: descriptor.size_in_bytes]
    else:
        data = _read_from_file(descriptor, descriptor.absolute_path(root))
    bitmap = deserialize_bitmap(data)
    if len(bitmap) != descriptor.cardinality:
        raise DeletionVectorError(
            f"Deletion vector {descriptor.unique_id} holds {len(bitmap)} rows, its descriptor says "
            f"{descriptor.cardinality}"
        )
    return bitmap


def _read_from_file(descriptor: DeletionVectorDescriptor, path: str) -> bytes:
    offset = descriptor.offset or 0
    try:
        with open(path, "rb") as handle:
            version = handle.read(1)
            if version != bytes([FORMAT_VERSION]):
                raise DeletionVectorError(
                    f"Deletion vector file {path} has format version {version.hex() or 'none'}, not {FORMAT_VERSION}"
                )
            handle.seek(offset)
            chunk = handle.read(4 + descriptor.size_in_bytes + 4)
    except FileNotFoundError as exc:
        raise DeletionVectorError(f"Deletion vector file {path} does not exist") from exc
    except OSError as exc:
        raise DeletionVectorError(f"Cannot read deletion vector file {path}: {exc}") from exc
    if len(chunk) < 4 + descriptor.size_in_bytes + 4:
        raise DeletionVectorError(f"Deletion vector file {path} ends before the vector at offset {offset}")
    (size,) = struct.unpack_from(">I", chunk)
    if size != descriptor.size_in_bytes:
        raise DeletionVectorError(
            f"Deletion vector at offset {offset} of {path} has {size} bytes, its descriptor says "
            f"{descriptor.size_in_bytes}"
        )
    data = chunk[4 : 4 + size]
    (checksum,) = struct.unpack_from(">I", chunk, 4 + size)
    if zlib.crc32(data) != checksum:
        raise DeletionVectorError(f"Deletion vector at offset {offset} of {path} fails its CRC-32 checksum")
    return data


__all__ = [
    "DeletionVectorDescriptor",
    "DeletionVectorError",
    "deserialize_bitmap",
    "inline_descriptor",
    "read_deletion_vector",
    "serialize_bitmap",
    "write_deletion_vector_file",
    "z85_decode",
    "z85_encode",
]
