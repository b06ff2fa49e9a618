"""The throughput bench's short version: the same real processes (PostgreSQL, a Spark Connect server of its own,
the API and two workers) at toy sizes, every run's jobs succeeded and every table checked by the bench itself,
and every target printed PASS or MISS. ``python bench/throughput_bench.py`` runs the real sizes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from bench.throughput_bench import check_contents, main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TARGETS = (
    "medium merge engine p50 (",
    "medium merge engine p50, deletion vectors",
    "1-row merge into a small table, engine p50 (one at a time)",
    "first merge after ready / warm p50 (one at a time)",
    "CPU per 1-row merge",
    "merges per minute (6 over 2 tables, 2 workers)",
    "small merges' p95 beside a large merge / without",
    "merges per minute with 2 workers (small and again) / with 1",
)


def test_every_run_and_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "throughput.json"
    argv = ["--tables", "2", "--merges", "6", "--workers", "2", "--fewer-workers", "1", "--medium", "1"]
    argv += ["--medium-warmup", "1"]
    argv += ["--medium-rows", "20000", "--large-rows", "20000", "--driver-memory", "1g", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    split = r"^    CPU s/merge by process: spark [0-9.]+, workers [0-9.]+, api [0-9.]+$"
    assert re.search(split, printed, re.MULTILINE)
    # Each medium run's untimed merge is reported, not counted.
    assert len(re.findall(r"^    warm-up engine times \(s\): [0-9.]+$", printed, re.MULTILINE)) == 2
    for target in TARGETS:
        assert re.search(rf"^  (PASS|MISS)  {re.escape(target)}[^:\n]*: [0-9.]+", printed, re.MULTILINE), target
    jobs = json.loads(out.read_text())
    assert {run: len(docs) for run, docs in jobs.items()} == {
        "first": 1,
        "small": 6,
        "medium": 1,
        "medium-dv": 1,  # the same merge into a copy with deletion vectors
        "beside": 7,  # the six small merges and the large one
        "fewer": 6,
        "again": 6,  # after the stopped worker started again
    }
    for docs in jobs.values():
        for doc in docs:
            assert doc["status"] == "succeeded"
            timings = doc["timings"]
            assert sum(timings.values()) > 0


def test_contents_check_refuses_a_wrong_table(tmp_path: Path) -> None:
    table = tmp_path / "t"
    write_deltalake(str(table), pa.table({"id": pa.array([0, 1, 2], pa.int64()), "v": ["m", "u", "u"]}))
    check_contents(table, 3, 2)
    with pytest.raises(RuntimeError, match="holds 3 rows, 3 keys, 2 upserted, where its merges leave 4 rows"):
        check_contents(table, 4, 2)
    with pytest.raises(RuntimeError, match="2 upserted, where its merges leave 3 rows and keys, 3 upserted"):
        check_contents(table, 3, 3)
