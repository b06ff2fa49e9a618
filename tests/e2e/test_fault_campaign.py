"""The fault campaign's short version: every fault kind once, in one order, against real processes (PostgreSQL,
a Spark Connect server, the API and two workers); nothing lost, doubled or wedged, and /healthz answered
throughout. ``python -m bench.fault_campaign`` runs the long, randomized version."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.fault_campaign import ALL_KINDS, campaign, clean

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(900)]

SCHEDULE = [
    "worker_kill",
    "postgres_kill",
    "stall_worker",
    "disk_full",
    "api_kill",
    "spark_kill",
    "stall_spark",
    "postgres_restart",
    "worker_restart",
    "api_restart",
]


def test_the_schedule_covers_every_fault_kind() -> None:
    assert sorted(SCHEDULE) == sorted(ALL_KINDS)


def test_one_run_of_each_fault_loses_nothing(tmp_path: Path) -> None:
    # The lake is a tmpfs of its own only for root: without one, no disk-full fault (it would fill a real disk).
    schedule = SCHEDULE if os.geteuid() == 0 else [k for k in SCHEDULE if k != "disk_full"]
    out = tmp_path / "campaign.json"
    lines: list[str] = []
    result = campaign(
        runs=len(schedule), seed=24, schedule=schedule, tables=4, work=tmp_path / "work", out=out, echo=lines.append
    )
    assert json.loads(out.read_text())["summary"] == result["summary"]
    assert result["counts"]["runs"] == len(schedule), "\n".join(lines)
    assert result["faults"] == {kind: 1 for kind in schedule}
    assert result["counts"]["succeeded"] > 0
    assert clean(result), result["summary"] + "\n" + "\n".join(lines) + f"\n{result['health_misses']}"
