"""Debian packages the tests need (PostgreSQL, Chromium), installed when missing and we are root. The suite runs in
two processes side by side, so one apt-get runs at a time: the second waits on a lock, then finds the package."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

APT_LOCK = Path(tempfile.gettempdir()) / "merge-service-apt.lock"
"""Shared with deploy/test/compose_check.py, which installs dockerd the same way."""


def install_when_missing(packages: list[str], present: Callable[[], bool]) -> None:
    """Install ``packages`` unless ``present()`` holds. It is asked under the lock: a package half unpacked by
    the other process (initdb there, its user not yet made) is not yet present."""
    fd = os.open(APT_LOCK, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if present():
            return
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise RuntimeError(f"{' and '.join(packages)} not installed, and installing needs root and apt-get")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]
        for step in (["update", "-qq"], ["install", "-y", "-qq", *packages]):
            done = subprocess.run([*apt, *step], env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"apt-get {' '.join(step)} failed ({done.returncode}): {done.stderr[-1000:]}")
    finally:
        os.close(fd)
