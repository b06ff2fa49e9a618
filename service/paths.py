"""Lake roots: every target and source must resolve inside one, after symlinks, with no ``..``, no glob
characters and no scheme other than ``file``. The resolved path is also the table's identity for per-table
ordering."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

from service.errors import RequestValidationProblem

MAX_PATH_LENGTH = 2048
GLOB_CHARACTERS = frozenset("*?[]{}\\")
"""Hadoop expands these in a path Spark reads; the expansion could pass through a symlink out of the lake after
the path itself was checked, so paths with them are refused."""


class LakeRoots:
    def __init__(self, roots: Sequence[str | Path]) -> None:
        self.roots = tuple(Path(os.path.realpath(os.path.abspath(str(r)))) for r in roots)

    def resolve(self, location: str, field: str) -> str:
        """The canonical local path of ``location``; 422 (naming ``field``) unless it lies under a root."""
        path = self._local_path(location, field)
        resolved = Path(os.path.realpath(path))
        for root in self.roots:
            if resolved != root and resolved.is_relative_to(root):
                return str(resolved)
        raise RequestValidationProblem(
            field,
            f"{field}: {location!r} is not under a configured lake root ({', '.join(str(r) for r in self.roots)}).",
            title="Path outside the lake",
        )

    @staticmethod
    def _local_path(location: str, field: str) -> str:
        def refuse(why: str) -> RequestValidationProblem:
            return RequestValidationProblem(field, f"{field}: {why}", title="Invalid path")

        if not location or len(location) > MAX_PATH_LENGTH:
            raise refuse(f"a path of 1 to {MAX_PATH_LENGTH} characters is required.")
        if "\x00" in location:
            raise refuse("the path contains a NUL character.")
        parts = urlsplit(location)
        if parts.scheme:
            if parts.scheme.lower() != "file" or len(parts.scheme) == 1:
                raise refuse(f"the scheme {parts.scheme!r} is not supported; use a path or a file:// URI.")
            if parts.netloc not in ("", "localhost"):
                raise refuse(f"file URIs must name a local path, not the host {parts.netloc!r}.")
            if parts.query or parts.fragment:
                raise refuse("file URIs may not carry a query or fragment.")
            path = unquote(parts.path)
        else:
            path = location
        if not path.startswith("/"):
            raise refuse(f"{location!r} is not an absolute path.")
        if ".." in path.split("/"):
            raise refuse(f"{location!r} contains '..'.")
        globs = sorted(GLOB_CHARACTERS.intersection(path))
        if globs:
            raise refuse(
                f"{location!r} contains the glob character(s) {' '.join(globs)}; globs are not supported: name a "
                "file or a directory."
            )
        return path
