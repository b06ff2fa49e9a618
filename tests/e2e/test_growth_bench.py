"""The growth bench's short version: both series at toy sizes against the test run's Spark Connect server, every
merge checked against delta-rs's, the tables, the JSON and the plot written. ``python -m bench.growth_bench``
runs the real sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.growth_bench import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_both_series_run_checked_and_plotted(
    spark_remote: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, png = tmp_path / "growth.json", tmp_path / "growth.png"
    argv = ["--sizes", "3000", "--commits", "2,25", "--log-rows", "600", "--repeat", "1", "--remote", spark_remote]
    assert main([*argv, "--dir", str(tmp_path), "--out", str(out), "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "WRONG" not in printed
    assert "n/a (no log of 10,000 commits in this run)" in printed
    points = json.loads(out.read_text())["points"]
    assert [(p["series"], p["commits"]) for p in points] == [("size", 1), ("log", 2), ("log", 25)]
    for point in points:
        assert point["problems"] == []
        assert set(point["merge_s"]) == {"engine", "deltars"} and min(point["merge_s"].values()) > 0
    longest = points[-1]
    assert longest["appended"] == 24 and longest["checkpoints"] == 2  # after the 10th and the 20th commit
    assert set(longest["snapshot_s"]) == {"engine", "deltars"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(tmp_path.glob("growth-bench-*")) == []  # the work folder is removed


def test_a_log_cache_builds_each_log_once(
    spark_remote: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With ``--log-cache`` the first run keeps the log table it built and the next copies it: same log, checked
    and merged the same way."""
    cache = tmp_path / "logs"
    argv = ["--sizes", "1000", "--commits", "25", "--log-rows", "600", "--repeat", "1", "--remote", spark_remote]
    argv += ["--dir", str(tmp_path), "--log-cache", str(cache), "--plot", str(tmp_path / "growth.png")]
    runs = []
    for run in ("first", "second"):
        out = tmp_path / f"{run}.json"
        assert main([*argv, "--out", str(out)]) == 0
        assert "WRONG" not in capsys.readouterr().out
        runs.append(json.loads(out.read_text())["points"][-1])
        assert [p.name for p in cache.iterdir()] == ["log-600-25-seed42"]
    for point in runs:
        assert point["problems"] == [] and point["appended"] == 24 and point["checkpoints"] == 2
        assert set(point["merge_s"]) == {"engine", "deltars"}
    kept = cache / "log-600-25-seed42" / "_delta_log"
    assert len(list(kept.glob("*.json"))) == 25
