"""A full disk made for real: a small tmpfs of its own as the lake, and a file that takes its free space; for the
storage tests and the fault campaign (bench/fault_campaign.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
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


def can_mount() -> bool:
    """Mounting a tmpfs needs root (as CI runs)."""
    return os.geteuid() == 0 and shutil.which("mount") is not None


def mount_tmpfs(folder: Path, megabytes: int) -> None:
    """``folder`` becomes a tmpfs of ``megabytes``, writable by all: the Spark server writes there as whoever runs
    it."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(folder)], check=True)
    os.chmod(folder, 0o777)


def unmount(folder: Path) -> None:
    """Lazily, so a process still holding a file there does not keep the tmpfs mounted."""
    subprocess.run(["umount", "-l", str(folder)], check=False)
