"""The deployment end to end (deploy/test/compose_check.py), inside `make test`: runs when this machine has a
dockerd, or can start one (root with apt-get). It takes some 5 minutes (stand-in base images, image builds, the
stack's start, a killed worker, down and up); `make compose-check` or `pytest -m compose` runs it alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NO_DOCKERD = 77
"""compose_check.py's exit status when dockerd cannot run here."""


def _docker_possible() -> bool:
    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        return True
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


@pytest.mark.compose
@pytest.mark.timeout(3600)
def test_compose_stack_end_to_end() -> None:
    if not _docker_possible():
        pytest.skip("no dockerd answers, and this user cannot install or start one (needs root and apt-get)")
    done = subprocess.run(
        [sys.executable, ROOT / "deploy" / "test" / "compose_check.py", "--start-dockerd"], cwd=ROOT, check=False
    )
    if done.returncode == NO_DOCKERD:
        pytest.skip("dockerd cannot start on this machine")
    assert done.returncode == 0, "the compose check failed: its output above says where"
