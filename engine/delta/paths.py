"""Every path form the layer meets, converted in one place.

- table locations: a local path or a ``file://`` URI -> (``file:///abs/path`` URI, absolute local path);
- log paths: Delta stores ``add.path`` as a URI reference, relative to the table root (percent-encoded) or
  absolute (``file:///...``);
- partition directories: Spark (and Hive) escape special characters in ``k=v`` names as ``%XX``;
- Spark reads: Spark globs any path with ``{}[]*?\\`` in it, so those characters are escaped;
- ``_metadata.file_path``: Spark reports ``file:/abs/path`` with the path percent-encoded;
- confinement: every file a log names must lie, after symlinks, in the table's directory or a lake root.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

from engine.errors import DeltaError

HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"

# Characters Spark's ExternalCatalogUtils.escapePathName escapes in partition directory names.
_SPARK_ESCAPED = set("\"#%'*/:=?\\\x7f{[]^") | {chr(c) for c in range(1, 32)}
_GLOB_CHARS = re.compile(r"([{}\[\]*?\\])")
PLAIN_PATH = re.compile(r"/[A-Za-z0-9/._=-]*")
"""Local paths Spark reports verbatim after ``file:`` in ``_metadata.file_path`` (nothing to percent-encode)."""
_PCT = re.compile(r"%([0-9A-Fa-f]{2})")


def normalize_table(table: str | os.PathLike[str]) -> tuple[str, str]:
    """Answer (``file:///abs/path`` URI, absolute local path) for a table location."""
    text = os.fspath(table)
    if "://" in text or text.startswith("file:"):
        parsed = urlparse(text)
        if parsed.scheme != "file":
            raise DeltaError(f"Only local tables (plain paths or file:// URIs) are supported, not {text!r}")
        if parsed.netloc not in ("", "localhost"):
            raise DeltaError(f"A file:// URI must name a local path, not host {parsed.netloc!r}: {text!r}")
        text = unquote(parsed.path)
    root = os.path.abspath(text)
    if len(root) > 1:
        root = root.rstrip("/")
    return Path(root).as_uri(), root


def encode_log_path(relative: str) -> str:
    """A relative file path (``/``-separated, as on disk) in the percent-encoded form Delta logs require."""
    return quote(relative, safe="/=")


def log_path_to_local(path: str, root: str) -> str:
    """The absolute local path of a file named in the log (relative URI reference or ``file:`` URI)."""
    if path.startswith("file:"):
        return unquote(urlparse(path).path)
    if "://" in path:
        raise DeltaError(f"File {path!r} is not on the local filesystem")
    return os.path.join(root, unquote(path))


def escape_partition_value(value: str) -> str:
    """Spark's escapePathName for the value part of a ``k=v`` directory name."""
    return "".join(f"%{ord(c):02X}" if c in _SPARK_ESCAPED else c for c in value)


def unescape_partition_value(text: str) -> str:
    """Spark's unescapePathName: each ``%XX`` is the character with that code."""
    return _PCT.sub(lambda m: chr(int(m.group(1), 16)), text)


def parse_partition_dir(segment: str) -> tuple[str, str | None]:
    """(column, raw value or None) from one ``k=v`` directory name that Spark wrote."""
    if "=" not in segment:
        raise DeltaError(f"{segment!r} is not a partition directory (k=v)")
    key, _, value = segment.partition("=")
    raw = unescape_partition_value(value)
    return unescape_partition_value(key), None if raw == HIVE_DEFAULT_PARTITION else raw


def spark_read_path(local_path: str) -> str:
    """A path Spark reads as exactly this file: ``file:`` scheme, glob characters escaped."""
    return "file:" + _GLOB_CHARS.sub(r"\\\1", local_path)


class ReadScope:
    """Where the files of one table (or one file source) may be read from: its own directory and the lake
    roots, compared after symlinks. A log is data: an absolute ``file://`` path, a ``..`` or a symlink in it
    must not take a read outside the lake."""

    def __init__(self, root: str, lake_roots: Iterable[str] = ()) -> None:
        self.root = root
        self.roots = tuple(dict.fromkeys(os.path.realpath(r) for r in (root, *lake_roots)))
        self._dirs: dict[str, str] = {}

    def contains(self, local_path: str) -> bool:
        """Whether ``local_path`` resolves inside the scope. A directory's resolution is remembered: a table's
        files share a few directories, so a file costs one ``lstat``."""
        path = os.path.normpath(local_path)
        parent, name = os.path.split(path)
        real_parent = self._dirs.get(parent)
        if real_parent is None:
            real_parent = self._dirs[parent] = os.path.realpath(parent)
        real = os.path.join(real_parent, name)
        if os.path.islink(real):
            real = os.path.realpath(real)
        return any(real == r or real.startswith(r.rstrip("/") + "/") for r in self.roots)

    def check(self, local_path: str, named_as: str) -> str:
        """``local_path`` if it lies in the scope; a DeltaError naming the path otherwise."""
        if not self.contains(local_path):
            raise DeltaError(
                f"{self.root}: the file {named_as!r} lies outside the table's directory and every lake root; "
                "it is not read."
            )
        return local_path
