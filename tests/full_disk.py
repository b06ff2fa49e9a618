"""A full disk made for real: a file that takes a file system's free space, for the engine's storage tests and
the fault campaign (bench/fault_campaign.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

FULL_BYTES = 64 * 1024
"""A file system with at most this much free is full: no data file, log entry or temporary file fits."""


def fill(filler: Path) -> int:
    """Fills the file system under ``filler`` until it is full; the bytes left free. One allocation of all the
    free space fails whole (and tmpfs gives it all back) when a writer takes a little of it meanwhile, so the file
    grows in chunks, each halved when it no longer fits, down to a page; and again while a writer frees space."""
    size = 0
    with open(filler, "wb") as out:
        for _ in range(10):
            chunk = 1 << 24
            while chunk >= 4096:
                try:
                    os.posix_fallocate(out.fileno(), size, chunk)
                    size += chunk
                except OSError:
                    chunk //= 2
            left = shutil.disk_usage(filler.parent).free
            if left <= FULL_BYTES:
                return left
    raise RuntimeError(f"{filler.parent} still has {left} bytes free after filling it")
