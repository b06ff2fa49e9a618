"""How a merge's cost grows (issue 25): with the target's size, and with the length of its Delta log.

Two series, each point measured by the engine and by delta-rs on fresh copies of the same table in the same run
(each merge in a process of its own, as ``bench/merge`` runs them; a warm-up round first, then the best of
``--repeat``):

  size     1,000 scattered upserts (half existing keys, half new) into targets of ``--sizes`` rows, in files of
           250,000 rows: the merge's time.
  log      the same upsert into a table of ``--log-rows`` rows whose log holds ``--commits`` commits: small
           appends, with a compaction every 100 commits, a checkpoint every 10 commits as Delta writes them
           (``delta.checkpointInterval``, written by delta-rs). The merge's time, and the time to read the
           table's snapshot: the engine's ``load_snapshot`` (protocol, metadata, the files and their statistics)
           beside delta-rs's ``DeltaTable`` (its log replay).

Every merge is checked: its counts against the data's, its table against delta-rs's, read back with deltalake.
A wrong answer exits 1. Prints the two tables, the snapshot target (a 10,000-commit log read in at most 0.3 s)
PASS or MISS, writes ``--out`` (JSON) and ``--plot`` (PNG: time against size, and against commits, log scales).

    .venv/bin/python -m bench.growth_bench                       # 0.5M / 5M / 20M rows; 10 / 1,000 / 10,000 commits
    .venv/bin/python -m bench.growth_bench --sizes 200000 --commits 10,300 --repeat 1   # while developing
    .venv/bin/python -m bench.growth_bench --log-cache var/growth-logs   # build the long logs once, reuse them
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.merge.check import check_result, compare_tables
from bench.merge.children import run_child
from bench.merge.cli import engine_server
from bench.merge.data import TARGET_EPOCH_US, build_source, build_target, fresh_copy, make_rows
from bench.merge.measure import load_average
from bench.merge.workloads import WORKLOADS, Expected

ROOT = Path(__file__).resolve().parents[1]
ROWS_PER_FILE = 250_000
CHECKPOINT_INTERVAL = 10
COMPACT_EVERY = 100
SNAPSHOT_TARGET_S = 0.3
SNAPSHOT_TARGET_COMMITS = 10_000
UPSERT = WORKLOADS["2"]  # 1,000 scattered upserts
PEERS = ("engine", "deltars")


@dataclass
class Point:
    series: str
    """``size`` or ``log``."""
    rows: int
    """The target's rows before the series' appends."""
    commits: int
    """Commits in the target's log."""
    appended: int = 0
    """Rows the log series' appends added."""
    files: int = 0
    checkpoints: int = 0
    merge_s: dict[str, float] = field(default_factory=dict)
    """Each peer's best merge time."""
    snapshot_s: dict[str, float] = field(default_factory=dict)
    """Each peer's best time to read the table's snapshot (the log series)."""
    engine_execution_ms: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        ours, theirs = self.merge_s.get("engine"), self.merge_s.get("deltars")
        return ours / theirs if ours is not None and theirs else None


def build_log_table(path: Path, rows: int, commits: int, rng: np.random.Generator) -> tuple[int, int]:
    """A table of ``rows`` rows (ids ``0, 2, ...``) whose log ends at version ``commits - 1``: one-row appends of
    new even ids, every ``COMPACT_EVERY``-th commit a compaction instead. ``delta.checkpointInterval`` is Delta's
    default, and delta-rs writes a checkpoint every that many commits, as Delta does. Answers its files and
    checkpoints."""
    from deltalake import DeltaTable, write_deltalake

    base = make_rows(2 * np.arange(rows, dtype=np.int64), rng, prefix="name-", epoch_us=TARGET_EPOCH_US)
    write_deltalake(str(path), base, configuration={"delta.checkpointInterval": str(CHECKPOINT_INTERVAL)})
    for version in range(1, commits):
        if version % COMPACT_EVERY == 0:
            DeltaTable(str(path)).optimize.compact()
        else:
            row = make_rows(np.array([2 * (rows + version)]), rng, prefix="name-", epoch_us=TARGET_EPOCH_US)
            write_deltalake(str(path), row, mode="append")
    return log_table_files(path, commits)


def log_table_files(path: Path, commits: int) -> tuple[int, int]:
    """The log table's data files and checkpoints, once its log is checked to end at version ``commits - 1``."""
    from deltalake import DeltaTable

    table = DeltaTable(str(path))
    if table.version() != commits - 1:
        raise SystemExit(f"the log table ended at version {table.version()}, not {commits - 1}")
    return len(table.file_uris()), len(list((path / "_delta_log").glob("*.checkpoint*.parquet")))


def best_of(repeat: int, run: Callable[[], float]) -> float:
    run()  # untimed: the first read of a table pays for what later ones find loaded
    return min(run() for _ in range(repeat))


def snapshot_times(path: Path, repeat: int) -> dict[str, float]:
    from deltalake import DeltaTable

    from engine.delta.snapshot import load_snapshot

    def engine() -> float:
        start = time.perf_counter()
        load_snapshot(path)
        return time.perf_counter() - start

    def deltars() -> float:
        start = time.perf_counter()
        DeltaTable(str(path))
        return time.perf_counter() - start

    return {"engine": best_of(repeat, engine), "deltars": best_of(repeat, deltars)}


@dataclass
class Run:
    args: argparse.Namespace
    workdir: Path
    remote: str
    jvm_pid: int | None
    session_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def merge(self, point: Point, base: Path, source: Path, expected: Expected, log: Callable[[str], None]) -> None:
        """The upsert by each peer: an untimed round, then ``--repeat`` timed ones, each on a fresh copy of
        ``base``; the last copies are checked against each other and the expected counts."""
        tag = f"{point.series}-{point.rows}-{point.commits}"
        times: dict[str, list[float]] = {peer: [] for peer in PEERS}
        last: dict[str, dict[str, Any]] = {}
        for number in range(self.args.repeat + 1):
            for peer in PEERS:
                target = self.workdir / "runs" / f"{tag}-{peer}"
                fresh_copy(base, target)
                out = run_child(peer, self._job(peer, target, source), self.workdir, tag)
                if out["status"] != "ok":
                    point.problems.append(f"{peer}: {out.get('error')}")
                    return
                if number > 0:
                    times[peer].append(float(out["wall_s"]))
                last[peer] = out
            log(f"  {tag} round {number}: " + ", ".join(f"{p} {last[p]['wall_s']:.2f} s" for p in PEERS))
        point.merge_s = {peer: min(spent) for peer, spent in times.items()}
        engine = last["engine"]
        point.engine_execution_ms = engine["metrics"].get("executionTimeMs")
        point.problems += check_result("engine", engine["result"], engine["metrics"].get("numSourceRows"), expected)
        rows_after = point.rows + point.appended + expected.inserted
        point.problems += compare_tables(
            self.workdir / "runs" / f"{tag}-engine", self.workdir / "runs" / f"{tag}-deltars", rows_after
        )
        for peer in PEERS:
            shutil.rmtree(self.workdir / "runs" / f"{tag}-{peer}", ignore_errors=True)

    def _job(self, peer: str, target: Path, source: Path) -> dict[str, Any]:
        return {
            "source": str(source),
            "kind": UPSERT.kind,
            "remote": self.remote,
            "session_id": self.session_id,
            "streamed_exec": False,
            "warm_table": str(self.workdir / "warm-table"),
            "jvm_pid": self.jvm_pid if peer == "engine" else None,
            "target": str(target),
        }


def size_point(run: Run, rows: int, rng: np.random.Generator, log: Callable[[str], None]) -> Point:
    folder = run.workdir / f"size-{rows}"
    files = max(1, -(-rows // ROWS_PER_FILE))
    point = Point("size", rows, commits=files, files=build_target(folder / "target", rows, files, rng))
    expected = build_source(folder / "source", UPSERT, rows, rng)
    log(f"size {rows:,} rows in {point.files} files")
    run.merge(point, folder / "target", folder / "source", expected, log)
    shutil.rmtree(folder, ignore_errors=True)
    return point


def log_point(run: Run, commits: int, rng: np.random.Generator, log: Callable[[str], None]) -> Point:
    folder = run.workdir / f"log-{commits}"
    rows = run.args.log_rows
    started = time.monotonic()
    cache = run.args.log_cache
    if cache is None:
        files, checkpoints = build_log_table(folder / "target", rows, commits, rng)
    else:
        # Building a 10,000-commit log takes some 16 minutes; a later run copies the one built before.
        kept = cache / f"log-{rows}-{commits}-seed{run.args.seed}"
        if not kept.exists():
            building = cache / f"{kept.name}.building-{uuid.uuid4().hex}"
            build_log_table(building, rows, commits, rng)
            building.rename(kept)
        fresh_copy(kept, folder / "target")
        files, checkpoints = log_table_files(folder / "target", commits)
    appended = commits - 1 - (commits - 1) // COMPACT_EVERY
    point = Point("log", rows, commits, appended=appended, files=files, checkpoints=checkpoints)
    built = time.monotonic() - started
    log(f"log of {commits:,} commits ({checkpoints} checkpoints, {files} files) built in {built:.0f} s")
    expected = build_source(folder / "source", UPSERT, rows, rng)
    point.snapshot_s = snapshot_times(folder / "target", run.args.repeat)
    run.merge(point, folder / "target", folder / "source", expected, log)
    shutil.rmtree(folder, ignore_errors=True)
    return point


def _secs(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"


def report(points: Sequence[Point]) -> list[str]:
    """Prints the tables; answers the targets' lines."""
    print("\nMerge time against the target's size (1,000 scattered upserts; seconds, best of the timed rounds)")
    print(f"{'rows':>12} {'files':>6} {'engine':>8} {'delta-rs':>9} {'ratio':>6} {'executionTimeMs':>16}")
    for p in (p for p in points if p.series == "size"):
        ratio = f"{p.ratio:.2f}" if p.ratio is not None else "-"
        print(
            f"{p.rows:>12,} {p.files:>6} {_secs(p.merge_s.get('engine')):>8} {_secs(p.merge_s.get('deltars')):>9} "
            f"{ratio:>6} {p.engine_execution_ms or '-':>16}"
        )
    print("\nAgainst the log's length (the same upsert; snapshot: reading the table's state)")
    print(
        f"{'commits':>8} {'checkpoints':>11} {'files':>6} {'snapshot engine':>15} {'delta-rs':>9} "
        f"{'merge engine':>12} {'delta-rs':>9} {'ratio':>6}"
    )
    for p in (p for p in points if p.series == "log"):
        ratio = f"{p.ratio:.2f}" if p.ratio is not None else "-"
        print(
            f"{p.commits:>8,} {p.checkpoints:>11} {p.files:>6} {_secs(p.snapshot_s.get('engine')):>15} "
            f"{_secs(p.snapshot_s.get('deltars')):>9} {_secs(p.merge_s.get('engine')):>12} "
            f"{_secs(p.merge_s.get('deltars')):>9} {ratio:>6}"
        )
    longest = [p for p in points if p.series == "log" and p.commits >= SNAPSHOT_TARGET_COMMITS]
    seconds = longest[0].snapshot_s.get("engine") if longest else None
    if seconds is None:
        verdict = f"n/a (no log of {SNAPSHOT_TARGET_COMMITS:,} commits in this run)"
    else:
        verdict = f"{'PASS' if seconds <= SNAPSHOT_TARGET_S else 'MISS'} ({seconds:.3f} s)"
    return [
        f"snapshot of a {SNAPSHOT_TARGET_COMMITS:,}-commit log with checkpoints <= {SNAPSHOT_TARGET_S} s: {verdict}"
    ]


def plot(points: Sequence[Point], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_size, by_log) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = {"engine": "engine", "deltars": "delta-rs"}
    colours = {"engine": "tab:blue", "deltars": "tab:orange"}
    sizes = [p for p in points if p.series == "size" and p.merge_s]
    logs = [p for p in points if p.series == "log" and p.merge_s]
    for peer in PEERS:
        style = {"color": colours[peer], "marker": "o"}
        by_size.plot([p.rows for p in sizes], [p.merge_s[peer] for p in sizes], label=f"{names[peer]} merge", **style)
        by_log.plot([p.commits for p in logs], [p.merge_s[peer] for p in logs], label=f"{names[peer]} merge", **style)
        commits, snapshots = [p.commits for p in logs], [p.snapshot_s[peer] for p in logs]
        dashed = {"color": colours[peer], "marker": "s", "linestyle": "--"}
        by_log.plot(commits, snapshots, label=f"{names[peer]} snapshot", **dashed)
    by_size.set(
        xscale="log", yscale="log", xlabel="target rows", ylabel="seconds", title="1,000 upserts by target size"
    )
    by_log.set(xscale="log", yscale="log", xlabel="commits in the log", ylabel="seconds", title="by log length")
    by_log.axhline(SNAPSHOT_TARGET_S, color="grey", linewidth=0.8, linestyle=":", label="snapshot target")
    for axes in (by_size, by_log):
        axes.grid(True, which="both", linewidth=0.3)
        axes.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _sizes(text: str) -> list[int]:
    return sorted({int(n) for n in text.split(",") if n.strip()})


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--sizes", type=_sizes, default=[500_000, 5_000_000, 20_000_000], help="target rows, comma-separated"
    )
    p.add_argument("--commits", type=_sizes, default=[10, 1_000, 10_000], help="log lengths, comma-separated")
    p.add_argument("--log-rows", type=int, default=100_000, help="rows of the log series' table (default 100,000)")
    p.add_argument("--repeat", type=int, default=3, help="timed rounds; the best counts (default 3)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--driver-memory", default="6g", help="spark.driver.memory of the Spark server (default 6g)")
    p.add_argument("--remote", default="", help="an existing Spark Connect server (sc://host:port)")
    p.add_argument("--dir", type=Path, default=None, help="work folder (default: a new temporary one, removed)")
    p.add_argument(
        "--log-cache",
        type=Path,
        default=None,
        help="keep the log series' tables here and copy them in later runs (by rows, commits and seed)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "var" / "growth.json")
    p.add_argument("--plot", type=Path, default=ROOT / "var" / "growth.png")
    args = p.parse_args(argv)
    if args.repeat < 1 or any(n < 1000 for n in args.sizes) or any(n < 1 for n in args.commits):
        p.error("--repeat must be at least 1, --sizes at least 1,000 rows and --commits at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    import tempfile

    from deltalake import write_deltalake

    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="growth-bench-", dir=args.dir))
    rng = np.random.default_rng(args.seed)

    def log(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    log(f"work folder {workdir}; load average {load_average()}")
    write_deltalake(str(workdir / "warm-table"), make_rows(np.arange(3), rng, prefix="w", epoch_us=TARGET_EPOCH_US))
    points: list[Point] = []
    try:
        with engine_server(args, workdir) as (remote, jvm_pid):
            run = Run(args, workdir, remote, jvm_pid)
            points += [size_point(run, rows, rng, log) for rows in args.sizes]
            points += [log_point(run, commits, rng, log) for commits in args.commits]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    targets = report(points)
    print()
    for line in targets:
        print(line)
    problems = [
        f"{p.series} {p.rows:,} rows, {p.commits:,} commits: {problem}" for p in points for problem in p.problems
    ]
    for problem in problems:
        print(f"WRONG: {problem}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"points": [asdict(p) for p in points], "targets": targets}, indent=2))
    plot(points, args.plot)
    print(f"\nwrote {args.out} and {args.plot}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
