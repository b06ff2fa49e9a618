"""The installed package carries everything it needs: built as a wheel, installed (not editable) into a
virtualenv of its own and run from outside the source tree, as the container image runs it."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ("pyproject.toml", "README.md", "engine", "service")
"""What deploy/Dockerfile copies into the image to build the wheel."""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with the project's wheel; its dependencies come from this environment's site-packages
    through a path file (no download), and the source tree is not on its path."""
    tmp = tmp_path_factory.mktemp("wheel")
    source, wheels = tmp / "source", tmp / "wheels"
    source.mkdir()
    # A copy, so the build's scratch directories (build/, *.egg-info) stay out of the working tree.
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SOURCE:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", wheels, source], check=True, cwd=tmp
    )
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (wheel,) = wheels.glob("merge_service-*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", wheel],
        check=True,
        cwd=tmp,
    )
    return env_dir


def _run(env_dir: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("MERGE_SERVICE_", "PYTHON"))}
    return subprocess.run(
        [env_dir / "bin" / "merge-service", *args],
        cwd=cwd,
        env={**environment, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_installed_package_is_the_wheel_not_the_source_tree(installed: Path, tmp_path: Path) -> None:
    where = subprocess.run(
        [installed / "bin" / "python", "-c", "import service; print(service.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert Path(where).resolve().is_relative_to(installed.resolve()), where


def test_migrate_runs_from_the_installed_wheel(installed: Path, tmp_path: Path) -> None:
    database = tmp_path / "jobs.db"
    done = _run(installed, "migrate", cwd=tmp_path, MERGE_SERVICE_DATABASE_URL=f"sqlite:///{database}")
    assert done.returncode == 0, done.stderr
    versions = sorted(p.name for p in (ROOT / "service" / "migrations" / "versions").glob("0*.py"))
    with sqlite3.connect(database) as conn:
        (revision,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert versions[-1].startswith(revision), (revision, versions)
    assert "merge_jobs" in tables
