"""Running the workloads: rounds of every workload by every peer, each on a fresh copy of its target, then the
last run's tables checked."""

from __future__ import annotations

import argparse
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.merge import check
from bench.merge.children import Peer, run_child
from bench.merge.data import fresh_copy
from bench.merge.measure import PeakSampler
from bench.merge.workloads import Expected, Workload

PEER_NAMES = {"engine": "engine", "deltars": "delta-rs", "delta": "Delta on Spark"}


@dataclass
class Outcome:
    """One workload's measurements (best of --repeat for the times) and what was found wrong."""

    workload: Workload
    expected: Expected
    source: Path
    rows: int
    """The target's rows (the scale workload runs at several sizes)."""
    times: dict[Peer, list[float]] = field(default_factory=dict)
    best: dict[Peer, dict[str, Any]] = field(default_factory=dict)
    """Each peer's output of its best timed run."""
    jvm_peak: int | None = None
    problems: list[str] = field(default_factory=list)
    crashed: list[str] = field(default_factory=list)
    unsupported: str | None = None
    change_counts: tuple[dict[str, int], dict[str, int]] | None = None
    baseline: Outcome | None = None
    """For the CDF variant: the same merge without CDF."""
    total_files: int = 0
    """The files of delta-rs's target."""
    paths: dict[Peer, Path] = field(default_factory=dict)
    """Each peer's table of its last run."""

    @property
    def engine(self) -> dict[str, Any] | None:
        return self.best.get("engine")

    @property
    def deltars(self) -> dict[str, Any] | None:
        return self.best.get("deltars")

    def seconds(self, peer: Peer) -> float | None:
        times = self.times.get(peer)
        return min(times) if times else None

    def ratio(self, peer: Peer = "deltars") -> float | None:
        """The engine's best time over ``peer``'s."""
        ours, theirs = self.seconds("engine"), self.seconds(peer)
        return ours / theirs if ours is not None and theirs else None

    @property
    def cpu_ratio(self) -> float | None:
        if self.engine is None or self.deltars is None or not self.deltars.get("cpu_s"):
            return None
        return float(self.engine["cpu_s"]) / float(self.deltars["cpu_s"])

    @property
    def cdf_overhead(self) -> float | None:
        if self.baseline is None:
            return None
        ours, plain = self.seconds("engine"), self.baseline.seconds("engine")
        return ours / plain if ours is not None and plain else None


@dataclass
class Context:
    args: argparse.Namespace
    workdir: Path
    bases: dict[str, Path]
    """The targets by flavour: ``plain``, ``cdf``, ``dv`` (a copy of ``plain`` with deletion vectors enabled)."""
    total_files: dict[str, int]
    remote: str = ""
    jvm_pid: int | None = None
    """The Spark Connect server the current rounds run on (the engine's, or Delta's), and its JVM."""
    session_ids: dict[Peer, str] = field(default_factory=dict)
    """One Spark Connect session per peer for the whole run, as a worker of the service keeps one."""
    tag: str = ""

    def base(self, workload: Workload, peer: Peer) -> Path:
        """delta-rs cannot write deletion vectors: it merges the plain table, what a user would otherwise run."""
        if workload.dv and peer != "deltars":
            return self.bases["dv"]
        return self.bases["cdf" if workload.cdf else "plain"]

    def table_path(self, workload: Workload, peer: Peer) -> Path:
        return self.workdir / "runs" / f"{self.tag}w{workload.key}-{peer}"

    def session_id(self, peer: Peer) -> str:
        return self.session_ids.setdefault(peer, str(uuid.uuid4()))


def _job(ctx: Context, outcome: Outcome, peer: Peer, target: Path) -> dict[str, Any]:
    return {
        "source": str(outcome.source),
        "kind": outcome.workload.kind,
        "remote": ctx.remote,
        "session_id": ctx.session_id(peer),
        "streamed_exec": ctx.args.deltars_streamed_exec == "true",
        "warm_table": str(ctx.workdir / "warm-table"),
        "jvm_pid": ctx.jvm_pid,
        "target": str(target),
    }


def run_once(ctx: Context, outcome: Outcome, peer: Peer, timed: bool) -> float | None:
    """One run of a workload by ``peer`` on a fresh copy of its target; answers its time."""
    workload = outcome.workload
    path = ctx.table_path(workload, peer)
    if peer == "delta":
        # Delta on Spark caches a table's log by path: a fresh copy at the path it merged last would meet the
        # cached state of the merged table. A path per run loads each copy's log as the other peers do.
        path = path.with_name(f"{path.name}-{sum(1 for _ in path.parent.glob(path.name + '-*'))}")
    if peer in outcome.paths:
        shutil.rmtree(outcome.paths[peer], ignore_errors=True)
    outcome.paths[peer] = path
    fresh_copy(ctx.base(workload, peer), path)
    with PeakSampler(ctx.jvm_pid if peer == "engine" else None) as jvm:
        out = run_child(peer, _job(ctx, outcome, peer, path), ctx.workdir, f"{ctx.tag}w{workload.key}")
    if peer == "engine":
        outcome.jvm_peak = max(outcome.jvm_peak or 0, jvm.peak) or None
    if out["status"] == "unsupported":
        outcome.unsupported = out["error"]
        return None
    if out["status"] != "ok":
        outcome.crashed.append(f"{PEER_NAMES[peer]}: {out['error']}" + (f"\n{out.get('traceback', '')}"))
        return None
    seconds = float(out["wall_s"])
    if timed:
        times = outcome.times.setdefault(peer, [])
        times.append(seconds)
        if seconds <= min(times):
            outcome.best[peer] = out
    return seconds


def run_rounds(ctx: Context, outcomes: Sequence[Outcome], peers: Sequence[Peer], log: Callable[[str], None]) -> None:
    """Every workload once per round and peer, warm-up rounds first: each workload meets the Spark server as warm
    as the others, and the machine's slow minutes spread over all of them."""
    rounds = ctx.args.warmup + ctx.args.repeat
    for number in range(rounds):
        timed = number >= ctx.args.warmup
        log(f"round {number + 1} of {rounds} ({'timed' if timed else 'warm-up, untimed'})")
        for outcome in outcomes:
            if outcome.crashed or outcome.unsupported:
                continue
            spent = [(peer, run_once(ctx, outcome, peer, timed)) for peer in peers]
            log(
                f"  ({outcome.workload.key}) "
                + ", ".join(f"{PEER_NAMES[p]} {s:6.2f} s" if s is not None else f"{PEER_NAMES[p]} -" for p, s in spent)
                + ("" if timed else " (untimed)")
            )


def check_outcome(ctx: Context, outcome: Outcome, peers: Sequence[Peer]) -> None:
    """The last run's tables of every peer, read back and compared with delta-rs's, and the counts checked."""
    from deltalake import DeltaTable

    workload, expected = outcome.workload, outcome.expected
    theirs = outcome.paths.get("deltars", ctx.table_path(workload, "deltars"))
    if outcome.deltars is not None:
        outcome.problems += check.check_deltars_metrics(outcome.deltars["metrics"], expected)
    rows_after = outcome.rows + expected.inserted - expected.deleted
    for peer in peers:
        out = outcome.best.get(peer)
        if peer == "deltars" or out is None or outcome.deltars is None:
            continue
        name, path = PEER_NAMES[peer], outcome.paths[peer]
        source_rows = out["metrics"].get("numSourceRows")
        outcome.problems += check.check_result(name, out["result"], source_rows, expected)
        outcome.problems += check.compare_tables(path, theirs, rows_after, peer=name)
        version = DeltaTable(str(ctx.base(workload, peer))).version() + 1
        if out.get("table_version") != version:
            outcome.problems.append(f"{name} committed version {out.get('table_version')}, expected {version}")
        elif workload.dv and workload.kind != "insert" and not check.merged_on_read(path, version):
            outcome.problems.append(f"{name} rewrote rows on a table with deletion vectors enabled")
        if workload.cdf and peer == "engine":
            _check_changes(outcome, path, theirs, version)
    for path in outcome.paths.values():
        shutil.rmtree(path, ignore_errors=True)


def _check_changes(outcome: Outcome, ours: Path, theirs: Path, version: int) -> None:
    try:
        mine = check.change_counts(ours, version)
    except Exception as exc:
        mine = {}
        outcome.problems.append(f"cannot read the engine's change data: {type(exc).__name__}: {exc}")
    other = check.change_counts(theirs, version)
    outcome.change_counts = (mine, other)
    if mine and mine != other:
        outcome.problems.append(f"change rows differ: engine {mine}, delta-rs {other}")
