"""MERGE benchmark: the engine against delta-rs (``deltalake``) on the same data, in the same run.

Workloads (issue 4) on a target of ``--rows`` rows (default 5,000,000) in ``--files`` files (default 20), sorted by
``id``. Target ids are the even numbers ``0, 2, ..., 2*(rows-1)``; "new" keys are odd, so they fall between
existing keys all over the key range instead of after it:

  (1) upsert of rows/10 rows, keys random: half existing ids, half new ids
  (2) upsert of 1,000 rows, keys random, half existing and half new
  (3) upsert of rows/10 rows whose keys all lie in the newest 5% of the key range (half existing, half new)
  (4) insert-only (WHEN NOT MATCHED THEN INSERT *) of rows/10 new keys, random
  (5) delete (WHEN MATCHED THEN DELETE) of rows/100 existing keys, random
  (1c, with --cdf) workload (1) on tables with delta.enableChangeDataFeed = true (issue 6)

Every merge runs on a fresh copy of the same target, each side in a process of its own so that its peak memory is
its own: the engine in a Python process that talks to one shared Spark Connect server, delta-rs in another Python
process. Every engine process joins the same Spark Connect session, as the service's worker runs all its merges in
one: the server compiles a query's generated code once per session, and a worker's steady state has it compiled.
Both timings include reading the source: the engine reads the source Delta table itself inside ``run_merge``; the
delta-rs process reads the same Delta table into a pyarrow table inside its timing. Both include loading the
target's snapshot. Neither includes process start-up, imports or the Spark Connect session set-up.

After each workload both tables are read back with ``deltalake`` and compared in full (row count, then every
column sorted by id), and the merge counts are checked against the counts the data was built for, so a fast wrong
answer fails the run (exit code 1). Missed targets are reported, not failed: the exit code is 0.

    .venv/bin/python bench/merge_bench.py [--rows N] [--files N] [--only 1,3] [--repeat N] [--warmup N] [--cdf] [--keep]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MARKER = ".merge-bench"
MEMORY_TARGET_MB = 500.0
US_PER_DAY = 86_400_000_000
TARGET_EPOCH_US = 1_577_836_800_000_000  # 2020-01-01T00:00:00Z
SOURCE_EPOCH_US = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z

Kind = Literal["upsert", "insert", "delete"]


@dataclass(frozen=True)
class Workload:
    key: str
    title: str
    kind: Kind
    target_ratio: float | None
    max_files_touched: int | None = None
    cdf: bool = False
    cdf_overhead_target: float | None = None
    """For the CDF variant: its engine time over the engine's time for the same merge without CDF."""


WORKLOADS: dict[str, Workload] = {
    w.key: w
    for w in (
        Workload("1", "upsert, random keys", "upsert", 3.0),
        Workload("2", "upsert, random keys (small)", "upsert", 4.0),
        Workload("3", "upsert, newest 5% of keys", "upsert", 3.0, max_files_touched=2),
        Workload("4", "insert-only, new keys", "insert", 2.0),
        Workload("5", "delete 1% by key", "delete", 3.0),
        Workload("1c", "upsert, random keys, CDF on", "upsert", None, cdf=True, cdf_overhead_target=1.5),
    )
}


@dataclass
class Expected:
    source_rows: int
    updated: int = 0
    inserted: int = 0
    deleted: int = 0


@dataclass
class Outcome:
    """One workload's measurements (best of --repeat for the times) and what was found wrong."""

    workload: Workload
    expected: Expected
    engine: dict[str, Any] | None = None
    deltars: dict[str, Any] | None = None
    engine_times: list[float] = field(default_factory=list)
    deltars_times: list[float] = field(default_factory=list)
    jvm_peak: int | None = None
    problems: list[str] = field(default_factory=list)
    crashed: list[str] = field(default_factory=list)
    unsupported: str | None = None
    change_counts: tuple[dict[str, int], dict[str, int]] | None = None
    baseline: Outcome | None = None
    """For the CDF variant: the same merge without CDF."""

    @property
    def engine_s(self) -> float | None:
        return min(self.engine_times) if self.engine_times else None

    @property
    def deltars_s(self) -> float | None:
        return min(self.deltars_times) if self.deltars_times else None

    @property
    def ratio(self) -> float | None:
        if self.engine_s is None or not self.deltars_s:
            return None
        return self.engine_s / self.deltars_s

    @property
    def cpu_ratio(self) -> float | None:
        if self.engine is None or self.deltars is None or not self.deltars.get("cpu_s"):
            return None
        return float(self.engine["cpu_s"]) / float(self.deltars["cpu_s"])

    @property
    def cdf_overhead(self) -> float | None:
        if self.baseline is None or self.engine_s is None or not self.baseline.engine_s:
            return None
        return self.engine_s / self.baseline.engine_s


# --- data ---------------------------------------------------------------------------------------------------------


def make_rows(ids: np.ndarray, rng: np.random.Generator, *, prefix: str, epoch_us: int) -> pa.Table:
    """id BIGINT, name STRING, value DOUBLE, ts TIMESTAMP, day DATE; vectorised."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    id_arr = pa.array(ids)
    ts_us = epoch_us + ids * 1_000_000
    return pa.table(
        {
            "id": id_arr,
            "name": pc.binary_join_element_wise(prefix, pc.cast(id_arr, pa.string()), ""),
            "value": pa.array(rng.random(len(ids)) * 1000.0),
            "ts": pa.array(ts_us, type=pa.timestamp("us", tz="UTC")),
            "day": pa.array((ts_us // US_PER_DAY).astype(np.int32), type=pa.date32()),
        }
    )


def build_target(path: Path, rows: int, files: int, rng: np.random.Generator, *, cdf: bool = False) -> int:
    """``files`` appends of consecutive, sorted id ranges: one Parquet file each. Answers the file count."""
    from deltalake import DeltaTable, write_deltalake

    configuration = {"delta.enableChangeDataFeed": "true"} if cdf else None
    bounds = np.linspace(0, rows, files + 1, dtype=np.int64)
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        chunk = make_rows(2 * np.arange(lo, hi, dtype=np.int64), rng, prefix="name-", epoch_us=TARGET_EPOCH_US)
        write_deltalake(
            str(path), chunk, mode="error" if i == 0 else "append", configuration=configuration if i == 0 else None
        )
    return len(DeltaTable(str(path)).file_uris())


def sample(rng: np.random.Generator, population: int, n: int) -> np.ndarray:
    return rng.choice(population, size=min(n, population), replace=False).astype(np.int64)


def source_keys(workload: Workload, rows: int, rng: np.random.Generator) -> tuple[np.ndarray, Expected]:
    """Source ids for a workload, and the counts a correct merge must report."""
    if workload.key in ("1", "1c", "2"):
        n = min(1000, rows) if workload.key == "2" else max(rows // 10, 1)
        existing = 2 * sample(rng, rows, n // 2)
        new = 2 * sample(rng, rows, n - len(existing)) + 1
    elif workload.key == "3":
        n = max(rows // 10, 1)
        first = rows - max(rows // 20, 1)  # index of the first row in the newest 5% of the key range
        existing = 2 * (first + sample(rng, rows - first, n // 2))
        new = 2 * (first + sample(rng, rows - first, n - len(existing))) + 1
    elif workload.key == "4":
        existing = np.empty(0, dtype=np.int64)
        new = 2 * sample(rng, rows, max(rows // 10, 1)) + 1
    else:
        existing = 2 * sample(rng, rows, max(rows // 100, 1))
        new = np.empty(0, dtype=np.int64)
    ids = np.concatenate([existing, new])
    rng.shuffle(ids)
    if workload.kind == "delete":
        return ids, Expected(len(ids), deleted=len(existing))
    if workload.kind == "insert":
        return ids, Expected(len(ids), inserted=len(new))
    return ids, Expected(len(ids), updated=len(existing), inserted=len(new))


def build_source(path: Path, workload: Workload, rows: int, rng: np.random.Generator) -> Expected:
    from deltalake import write_deltalake

    ids, expected = source_keys(workload, rows, rng)
    if workload.kind == "delete":
        table = pa.table({"id": pa.array(ids)})
    else:
        table = make_rows(ids, rng, prefix="upd-", epoch_us=SOURCE_EPOCH_US)
    write_deltalake(str(path), table)
    return expected


# --- the two sides, each in a process of its own -------------------------------------------------------------------


def peak_rss_bytes() -> int:
    """This process's own peak RSS (VmHWM). Unlike ru_maxrss it is not inherited from the process that spawned us."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def tree_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process and its children (the Spark server JVM), or None."""
    if pid is None:
        return None
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for proc in procs:
        with suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def warm_deltalake(job: dict[str, Any]) -> None:
    """The first table deltalake reads in a process costs ~0.5 s of one-time set-up; both sides pay it untimed."""
    from deltalake import DeltaTable

    DeltaTable(job["warm_table"]).to_pyarrow_table()


def engine_child(job: dict[str, Any]) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    import engine
    from engine.errors import UnsupportedTableFeatureError
    from engine.spark import configure_session

    # The Spark Connect session the service's worker keeps for all its merges: one for the whole run, joined by
    # every engine process. The server compiles a query's generated code once per session.
    spark = SparkSession.builder.remote(f"{job['remote'].rstrip('/')}/;session_id={job['session_id']}").create()
    configure_session(spark)
    spark.range(1).collect()
    warm_deltalake(job)
    kind: Kind = job["kind"]
    matched: tuple[engine.MergeClause, ...] = ()
    not_matched: tuple[engine.MergeClause, ...] = ()
    if kind == "upsert":
        matched = (engine.MergeClause("matched", engine.UpdateAction(star=True)),)
    if kind == "delete":
        matched = (engine.MergeClause("matched", engine.DeleteAction()),)
    if kind in ("upsert", "insert"):
        not_matched = (engine.MergeClause("notMatched", engine.InsertAction(star=True)),)
    spec = engine.MergeSpec(
        target=job["target"],
        source=engine.TableSource(format="delta", path=job["source"]),
        on="t.id = s.id",
        target_alias="t",
        source_alias="s",
        matched=matched,
        not_matched=not_matched,
    )
    phases: list[tuple[str, float]] = []
    rss_before = peak_rss_bytes()
    jvm_cpu0, cpu0 = tree_cpu_seconds(job.get("jvm_pid")), time.process_time()
    start = time.perf_counter()
    try:
        result = engine.run_merge(spark, spec, on_progress=lambda p: phases.append((p, time.perf_counter() - start)))
    except UnsupportedTableFeatureError as exc:
        return {"status": "unsupported", "error": f"{type(exc).__name__}: {exc}", "peak_rss": peak_rss_bytes()}
    except Exception as exc:
        return {
            "status": "error",
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
            "peak_rss": peak_rss_bytes(),
        }
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    jvm_cpu = tree_cpu_seconds(job.get("jvm_pid"))
    out = {
        "status": "ok",
        "wall_s": wall,
        "cpu_s": cpu + (jvm_cpu - jvm_cpu0 if jvm_cpu is not None and jvm_cpu0 is not None else 0.0),
        "jvm_cpu_s": jvm_cpu - jvm_cpu0 if jvm_cpu is not None and jvm_cpu0 is not None else None,
        "table_version": result.table_version,
        "result": result.result,
        "metrics": result.metrics,
        "phases": phases,
        "peak_rss": peak_rss_bytes(),
        "peak_rss_before_merge": rss_before,
    }
    spark.release_session_on_close = False  # the next engine process joins the same session
    spark.stop()
    return out


def deltars_child(job: dict[str, Any]) -> dict[str, Any]:
    from deltalake import DeltaTable

    warm_deltalake(job)
    rss_before = peak_rss_bytes()
    cpu0 = time.process_time()
    start = time.perf_counter()
    try:
        source = DeltaTable(job["source"]).to_pyarrow_table()
        source_s = time.perf_counter() - start
        merger = DeltaTable(job["target"]).merge(
            source=source,
            predicate="t.id = s.id",
            source_alias="s",
            target_alias="t",
            streamed_exec=job["streamed_exec"],
        )
        if job["kind"] == "upsert":
            merger = merger.when_matched_update_all().when_not_matched_insert_all()
        elif job["kind"] == "insert":
            merger = merger.when_not_matched_insert_all()
        else:
            merger = merger.when_matched_delete()
        metrics = merger.execute()
    except Exception as exc:
        return {
            "status": "error",
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
            "peak_rss": peak_rss_bytes(),
        }
    wall = time.perf_counter() - start
    return {
        "status": "ok",
        "wall_s": wall,
        "cpu_s": time.process_time() - cpu0,
        "source_read_s": source_s,
        "metrics": metrics,
        "peak_rss": peak_rss_bytes(),
        "peak_rss_before_merge": rss_before,
    }


def child_main(side: str, job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    out = engine_child(job) if side == "engine" else deltars_child(job)
    Path(job["out"]).write_text(json.dumps(out, default=str))
    return 0


class PeakSampler:
    """Peak RSS of a process tree (the Spark JVM) while a block runs, sampled every 50 ms. The tree is listed
    once, at the start: listing it walks every process on the machine, CPU taken from the merge measured."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._procs: list[Any] = []

    def _rss(self) -> int:
        import psutil

        total = 0
        for proc in self._procs:
            with suppress(psutil.Error):
                total += proc.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            self._stop.wait(0.05)

    def __enter__(self) -> PeakSampler:
        if self.pid is not None:
            import psutil

            with suppress(psutil.Error):
                root = psutil.Process(self.pid)
                self._procs = [root, *root.children(recursive=True)]
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def run_child(side: str, job: dict[str, Any], workdir: Path, tag: str) -> dict[str, Any]:
    job_path = workdir / f"job-{tag}-{side}.json"
    out_path = workdir / f"out-{tag}-{side}.json"
    log_path = workdir / f"log-{tag}-{side}.txt"
    out_path.unlink(missing_ok=True)
    job_path.write_text(json.dumps({**job, "out": str(out_path)}))
    with open(log_path, "wb") as log:
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", side, str(job_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            check=False,
        )
    if proc.returncode != 0 or not out_path.exists():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        return {"status": "error", "error": f"{side} process exited with code {proc.returncode}:\n{tail}"}
    return dict(json.loads(out_path.read_text()))


# --- checking the answers ------------------------------------------------------------------------------------------


def read_sorted(path: Path) -> pa.Table:
    from deltalake import DeltaTable

    return DeltaTable(str(path)).to_pyarrow_table().sort_by("id").combine_chunks()


def compare_tables(engine_path: Path, deltars_path: Path, expected_rows: int) -> list[str]:
    problems = []
    try:
        ours = read_sorted(engine_path)
    except Exception as exc:
        return [f"deltalake cannot read the engine's table: {type(exc).__name__}: {exc}"]
    theirs = read_sorted(deltars_path)
    if ours.num_rows != theirs.num_rows or ours.num_rows != expected_rows:
        problems.append(
            f"row counts differ: engine {ours.num_rows:,}, delta-rs {theirs.num_rows:,}, expected {expected_rows:,}"
        )
        return problems
    if ours.schema.names != theirs.schema.names:
        problems.append(f"columns differ: engine {ours.schema.names}, delta-rs {theirs.schema.names}")
        return problems
    for name in theirs.schema.names:
        a, b = ours.column(name), theirs.column(name)
        if a.type != b.type:
            try:
                a = a.cast(b.type)
            except pa.ArrowInvalid as exc:
                problems.append(f"column {name}: engine type {a.type}, delta-rs type {b.type}: {exc}")
                continue
        if a.equals(b):
            continue
        same = pc.fill_null(pc.or_kleene(pc.equal(a, b), pc.and_(pc.is_null(a), pc.is_null(b))), False)
        bad = pc.indices_nonzero(pc.invert(same))
        i = bad[0].as_py()
        problems.append(
            f"column {name} differs in {len(bad):,} rows; first at id {theirs.column('id')[i]}: "
            f"engine {a[i].as_py()!r}, delta-rs {b[i].as_py()!r}"
        )
    return problems


def change_counts(path: Path, version: int) -> dict[str, int]:
    from deltalake import DeltaTable

    reader = DeltaTable(str(path)).load_cdf(starting_version=version, ending_version=version)
    changes = pa.RecordBatchReader.from_stream(reader).read_all()
    counts = changes.group_by("_change_type").aggregate([([], "count_all")])
    return {str(k): int(v) for k, v in zip(counts.column(0).to_pylist(), counts.column(1).to_pylist(), strict=True)}


def check_counts(outcome: Outcome) -> None:
    e, engine_out, deltars_out = outcome.expected, outcome.engine, outcome.deltars
    want = {"updated": e.updated, "inserted": e.inserted, "deleted": e.deleted}
    if engine_out is not None:
        r = engine_out["result"]
        got = {
            "updated": r.get("num_updated_rows"),
            "inserted": r.get("num_inserted_rows"),
            "deleted": r.get("num_deleted_rows"),
        }
        if got != want:
            outcome.problems.append(f"engine result {got}, expected {want}")
        if engine_out["metrics"].get("numSourceRows") != e.source_rows:
            outcome.problems.append(
                f"engine numSourceRows {engine_out['metrics'].get('numSourceRows')}, expected {e.source_rows}"
            )
    if deltars_out is not None:
        m = deltars_out["metrics"]
        got = {
            "updated": m.get("num_target_rows_updated"),
            "inserted": m.get("num_target_rows_inserted"),
            "deleted": m.get("num_target_rows_deleted"),
        }
        if got != want:
            outcome.problems.append(f"delta-rs metrics {got}, expected {want} (the bench's data is wrong)")


# --- one workload --------------------------------------------------------------------------------------------------


@dataclass
class Context:
    args: argparse.Namespace
    workdir: Path
    remote: str
    jvm_pid: int | None
    bases: dict[bool, Path]
    total_files: dict[bool, int]
    session_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    """The engine's one Spark Connect session for the whole run, as a worker of the service keeps one."""


def fresh_copy(base: Path, dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(base, dest)


def _job(ctx: Context, workload: Workload, source: Path) -> dict[str, Any]:
    return {
        "source": str(source),
        "kind": workload.kind,
        "remote": ctx.remote,
        "session_id": ctx.session_id,
        "streamed_exec": ctx.args.deltars_streamed_exec == "true",
        "warm_table": str(ctx.workdir / "warm-table"),
        "jvm_pid": ctx.jvm_pid,
    }


def _table_paths(ctx: Context, workload: Workload) -> tuple[Path, Path]:
    runs = ctx.workdir / "runs"
    return runs / f"w{workload.key}-engine", runs / f"w{workload.key}-deltars"


def run_once(ctx: Context, outcome: Outcome, source: Path, timed: bool, log: Callable[[str], None]) -> None:
    """One run of a workload by each side, each on a fresh copy of the target; ``timed`` runs count."""
    workload = outcome.workload
    base = ctx.bases[workload.cdf]
    engine_path, deltars_path = _table_paths(ctx, workload)
    job = _job(ctx, workload, source)
    label = f"run {len(outcome.engine_times) + 1}" if timed else "warm-up"
    fresh_copy(base, engine_path)
    with PeakSampler(ctx.jvm_pid) as jvm:
        out = run_child("engine", {**job, "target": str(engine_path)}, ctx.workdir, f"w{workload.key}")
    outcome.jvm_peak = max(outcome.jvm_peak or 0, jvm.peak) or None
    if out["status"] == "unsupported":
        outcome.unsupported = out["error"]
        return
    if out["status"] != "ok":
        outcome.crashed.append(f"engine: {out['error']}" + (f"\n{out['traceback']}" if "traceback" in out else ""))
        return
    engine_s = out["wall_s"]
    if timed:
        outcome.engine_times.append(engine_s)
        if outcome.engine is None or engine_s <= min(outcome.engine_times):
            outcome.engine = out
    fresh_copy(base, deltars_path)
    out = run_child("deltars", {**job, "target": str(deltars_path)}, ctx.workdir, f"w{workload.key}")
    if out["status"] != "ok":
        outcome.crashed.append(f"delta-rs: {out['error']}")
        return
    if timed:
        outcome.deltars_times.append(out["wall_s"])
        if outcome.deltars is None or out["wall_s"] <= min(outcome.deltars_times):
            outcome.deltars = out
    log(
        f"  ({workload.key}) {label}: engine {engine_s:6.2f} s, delta-rs {out['wall_s']:6.2f} s"
        + ("" if timed else " (untimed)")
    )


def check_outcome(ctx: Context, outcome: Outcome) -> None:
    """The last run's tables of both sides, read back and compared, and the counts checked."""
    workload, expected = outcome.workload, outcome.expected
    engine_path, deltars_path = _table_paths(ctx, workload)
    if outcome.engine is not None and outcome.deltars is not None:
        check_counts(outcome)
        rows_after = ctx.args.rows + expected.inserted - expected.deleted
        outcome.problems += compare_tables(engine_path, deltars_path, rows_after)
        from deltalake import DeltaTable

        version = DeltaTable(str(deltars_path)).version()
        if outcome.engine.get("table_version") != version:
            outcome.problems.append(
                f"the engine committed version {outcome.engine.get('table_version')}, delta-rs version {version}"
            )
        if workload.cdf:
            try:
                ours = change_counts(engine_path, version)
            except Exception as exc:
                ours = {}
                outcome.problems.append(f"cannot read the engine's change data: {type(exc).__name__}: {exc}")
            theirs = change_counts(deltars_path, version)
            outcome.change_counts = (ours, theirs)
            if ours and ours != theirs:
                outcome.problems.append(f"change rows differ: engine {ours}, delta-rs {theirs}")
    shutil.rmtree(engine_path, ignore_errors=True)
    shutil.rmtree(deltars_path, ignore_errors=True)


def run_rounds(
    ctx: Context, planned: Sequence[tuple[Workload, Path, Expected]], log: Callable[[str], None]
) -> list[Outcome]:
    """Every workload once per round, warm-up rounds first: each workload meets the Spark server as warm as the
    others, and the machine's slow minutes spread over all of them."""
    outcomes = [Outcome(w, expected) for w, _, expected in planned]
    rounds = ctx.args.warmup + ctx.args.repeat
    for number in range(rounds):
        timed = number >= ctx.args.warmup
        log(f"round {number + 1} of {rounds} ({'timed' if timed else 'warm-up, untimed'})")
        for outcome, (_, source, _) in zip(outcomes, planned, strict=True):
            if not (outcome.crashed or outcome.unsupported):
                run_once(ctx, outcome, source, timed, log)
    for outcome in outcomes:
        check_outcome(ctx, outcome)
    return outcomes


# --- report --------------------------------------------------------------------------------------------------------


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def mb(n: int | None) -> str:
    return f"{n / 2**20:,.0f}" if n else "-"


def secs(s: float | None) -> str:
    return f"{s:.2f}" if s is not None else "-"


def files_engine(o: Outcome) -> tuple[int | None, str]:
    if o.engine is None:
        return None, "-"
    m = o.engine["metrics"]
    return m.get("numTargetFilesRemoved"), f"{m.get('numTargetFilesRemoved')}/{m.get('numTargetFilesBeforeSkipping')}"


def files_deltars(o: Outcome, total: int) -> str:
    if o.deltars is None:
        return "-"
    return f"{o.deltars['metrics'].get('num_target_files_removed')}/{total}"


def verdict(o: Outcome) -> str:
    if o.crashed:
        return "CRASH"
    if o.unsupported:
        return "NOT SUPPORTED"
    if o.problems:
        return "WRONG ANSWER"
    if o.ratio is None:
        return "-"
    misses = []
    if o.workload.target_ratio is not None and o.ratio > o.workload.target_ratio:
        misses.append("time")
    if o.workload.cdf_overhead_target is not None and (
        o.cdf_overhead is None or o.cdf_overhead > o.workload.cdf_overhead_target
    ):
        misses.append("CDF overhead")
    touched, _ = files_engine(o)
    if o.workload.max_files_touched is not None and (touched is None or touched > o.workload.max_files_touched):
        misses.append("files")
    if o.engine is not None and o.engine["peak_rss"] / 2**20 >= MEMORY_TARGET_MB:
        misses.append("memory")
    return "MISS (" + ", ".join(misses) + ")" if misses else "PASS"


def target_text(w: Workload) -> str:
    if w.cdf_overhead_target is not None:
        return f"<= {w.cdf_overhead_target:g}x of (1)"
    if w.target_ratio is None:
        return "-"
    text = f"<= {w.target_ratio:g}"
    if w.max_files_touched is not None:
        text += f", <= {w.max_files_touched} files"
    return text


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    print(line(headers))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


def report(ctx: Context, outcomes: list[Outcome]) -> None:
    print()
    print(f"Results (seconds are best of {ctx.args.repeat}; ratio = engine / delta-rs; files = touched/total):")
    rows = []
    for o in outcomes:
        w = o.workload
        rows.append(
            [
                f"({w.key}) {w.title}",
                f"{o.expected.source_rows:,}",
                secs(o.engine_s),
                secs(o.deltars_s),
                f"{o.ratio:.2f}" if o.ratio is not None else "-",
                f"{o.engine['cpu_s']:.1f}/{o.deltars['cpu_s']:.1f}" if o.engine and o.deltars else "-",
                f"{o.cpu_ratio:.2f}" if o.cpu_ratio is not None else "-",
                target_text(w),
                files_engine(o)[1],
                files_deltars(o, ctx.total_files[w.cdf]),
                mb(o.engine["peak_rss"]) if o.engine else "-",
                mb(o.deltars["peak_rss"]) if o.deltars else "-",
                mb(o.jvm_peak),
                verdict(o),
            ]
        )
    print_table(
        [
            "workload",
            "source rows",
            "engine s",
            "delta-rs s",
            "ratio",
            "CPU s eng/d-rs",
            "CPU ratio",
            "target",
            "files engine",
            "files delta-rs",
            "engine py MB",
            "delta-rs MB",
            "JVM MB",
            "verdict",
        ],
        rows,
        right={1, 2, 3, 4, 5, 6, 10, 11, 12},
    )
    print(
        "CPU s = user+system CPU seconds of the timed part: for the engine, its Python process plus the Spark "
        "server JVM (all its threads, so other sessions' work would count too); for delta-rs, its process. Less "
        "sensitive than wall time to other load on the machine; the targets are on wall time."
    )
    print(
        f"Memory target: engine Python process < {MEMORY_TARGET_MB:.0f} MB peak RSS (checked in every verdict). "
        f"JVM MB = the Spark Connect server's peak RSS while the engine's merge ran (a JVM seldom gives heap back, "
        f"so it carries over from earlier workloads; driver heap configured as "
        f"spark.driver.memory={ctx.args.driver_memory}" + (")." if ctx.jvm_pid else "; not sampled: --remote).")
    )

    print()
    print(
        "Where the time goes (seconds). Engine phases from on_progress (prep src+skip: source, resolution and data "
        "skipping with the source key range); metrics from result.metrics; delta-rs from its metrics:"
    )
    rows = []
    for o in outcomes:
        if o.engine is None:
            continue
        e = o.engine
        marks = [("snapshot", 0.0), *((p, t) for p, t in e["phases"])]
        spans = {
            name: (marks[i + 1][1] if i + 1 < len(marks) else e["wall_s"]) - t for i, (name, t) in enumerate(marks)
        }
        m = e["metrics"]
        d = o.deltars["metrics"] if o.deltars else {}
        rows.append(
            [
                f"({o.workload.key})",
                secs(spans.get("snapshot")),
                secs(spans.get("preparing_source")),
                secs(spans.get("finding_touched_files")),
                secs(spans.get("writing")),
                secs(spans.get("committing")),
                f"{m.get('materializeSourceTimeMs', 0) / 1000:.2f}",
                f"{m.get('scanTimeMs', 0) / 1000:.2f}",
                f"{m.get('rewriteTimeMs', 0) / 1000:.2f}",
                f"{m.get('executionTimeMs', 0) / 1000:.2f}",
                f"{m.get('numTargetFilesAfterSkipping')}/{m.get('numTargetFilesBeforeSkipping')}",
                secs(o.deltars.get("source_read_s")) if o.deltars else "-",
                f"{d.get('scan_time_ms', 0) / 1000:.2f}" if d else "-",
                f"{d.get('rewrite_time_ms', 0) / 1000:.2f}" if d else "-",
                f"{d.get('execution_time_ms', 0) / 1000:.2f}" if d else "-",
            ]
        )
    if rows:
        print_table(
            [
                "wl",
                "snapshot",
                "prep src+skip",
                "find touched",
                "writing",
                "commit",
                "materializeSrc",
                "scan",
                "rewrite",
                "execution",
                "after skip",
                "d-rs src read",
                "d-rs scan",
                "d-rs rewrite",
                "d-rs execution",
            ],
            rows,
            right=set(range(1, 15)),
        )

    for o in outcomes:
        if o.workload.cdf:
            print()
            print("Change Data Feed (issue 6), workload (1) on tables with delta.enableChangeDataFeed = true:")
            if o.unsupported:
                print(f"  NOT SUPPORTED: the engine refuses CDF tables: {o.unsupported}")
                continue
            plain = o.baseline
            if o.cdf_overhead is not None and plain is not None:
                print(
                    f"  engine {secs(o.engine_s)} s with CDF vs {secs(plain.engine_s)} s without: overhead "
                    f"{o.cdf_overhead:.2f}x (target <= {o.workload.cdf_overhead_target:g}x): {verdict(o)}"
                )
            if o.deltars_s is not None and plain is not None and plain.deltars_s:
                print(
                    f"  delta-rs {secs(o.deltars_s)} s with CDF vs {secs(plain.deltars_s)} s without: "
                    f"{o.deltars_s / plain.deltars_s:.2f}x; engine/delta-rs with CDF: "
                    + (f"{o.ratio:.2f}" if o.ratio is not None else "-")
                )
            if o.change_counts:
                print(f"  change rows: engine {o.change_counts[0]}, delta-rs {o.change_counts[1]}")

    bad = [o for o in outcomes if o.problems or o.crashed]
    for o in bad:
        print()
        print(f"({o.workload.key}) {o.workload.title}:")
        for p in o.crashed:
            print(f"  CRASH {p}")
        for p in o.problems:
            print(f"  WRONG {p}")


# --- main ----------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=5_000_000, help="target rows (default 5,000,000)")
    p.add_argument("--files", type=int, default=20, help="target files (default 20)")
    p.add_argument("--only", default="", help="workloads to run, e.g. 3 or 1,4 (default: 1-5)")
    p.add_argument("--repeat", type=int, default=3, help="timed rounds; each side's best time counts (default 3)")
    p.add_argument("--cdf", action="store_true", help="add workload (1) on CDF-enabled tables (issue 6)")
    p.add_argument("--dir", type=Path, default=Path("/tmp/merge-bench"), help="work folder (default /tmp/merge-bench)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--driver-memory", default="4g", help="spark.driver.memory of the Connect server (default 4g)")
    p.add_argument("--remote", default="", help="an existing Spark Connect server (sc://host:port) to use")
    p.add_argument(
        "--deltars-streamed-exec",
        choices=("true", "false"),
        default="true",
        help="delta-rs merge's streamed_exec (its default, true)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="untimed rounds of every workload before the timed ones (default 2; 0 measures a cold Spark server)",
    )
    p.add_argument("--child", nargs=2, metavar=("SIDE", "JOB"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rows < 100 or args.files < 1 or args.repeat < 1 or args.warmup < 0:
        p.error("--rows must be at least 100, --files and --repeat at least 1, --warmup at least 0")
    keys = [k.strip() for k in args.only.split(",") if k.strip()] or ["1", "2", "3", "4", "5"]
    unknown = [k for k in keys if k not in WORKLOADS]
    if unknown:
        p.error(f"unknown workload(s) {unknown}; choose from 1-5 (and --cdf)")
    if args.cdf:
        keys = [k for k in keys if k != "1c"]
        keys = [*(["1"] if "1" not in keys else []), *keys, "1c"]
    args.keys = sorted(dict.fromkeys(keys), key=list(WORKLOADS).index)
    return args


def prepare_workdir(path: Path) -> Path:
    path = path.resolve()
    if path.exists():
        if not (path / MARKER).exists() and any(path.iterdir()):
            raise SystemExit(f"{path} exists, is not empty and was not made by this benchmark; choose another --dir")
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / MARKER).write_text("work folder of bench/merge_bench.py; removed at the end unless --keep\n")
    return path


@contextmanager
def spark_server(args: argparse.Namespace, workdir: Path) -> Iterator[tuple[str, int | None]]:
    if args.remote:
        yield args.remote, None
        return
    from engine.spark_server import start_connect_server

    server = start_connect_server(conf={"spark.driver.memory": args.driver_memory}, log_dir=workdir / "spark-logs")
    try:
        yield f"sc://127.0.0.1:{server.port}", server.process.pid
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(*args.child)
    from deltalake import write_deltalake

    from engine.spark_server import SERVER_CONF

    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {msg}", flush=True)

    workdir = prepare_workdir(args.dir)
    rng = np.random.default_rng(args.seed)
    workloads = [WORKLOADS[k] for k in args.keys]
    conf = {**SERVER_CONF, "spark.driver.memory": args.driver_memory}
    print(
        f"MERGE benchmark: engine vs deltalake (delta-rs) merge; {os.cpu_count()} cores; target {args.rows:,} rows "
        f"in {args.files} files sorted by id (even ids; new keys are odd); work folder {workdir}"
    )
    print(
        "Timed: snapshot load, reading the source Delta table and the merge, on both sides; each side in its own "
        "process, on a fresh copy of the target."
    )
    if args.remote:
        print(f"Spark Connect server: {args.remote} (not started here; its driver memory is whatever it was given)")
    else:
        print(
            f"Spark Connect server: local[2], spark.driver.memory={conf['spark.driver.memory']}, "
            f"spark.sql.shuffle.partitions={conf['spark.sql.shuffle.partitions']}, "
            f"adaptive={conf['spark.sql.adaptive.enabled']}; one server for the whole run"
        )
    print(f"delta-rs merge: streamed_exec={args.deltars_streamed_exec}")
    print(f"load average at start: {load_average()}")
    outcomes: list[Outcome] = []
    try:
        log("building the target table(s)")
        bases = {False: workdir / "base"}
        total_files = {False: build_target(bases[False], args.rows, args.files, rng)}
        if args.cdf:
            bases[True] = workdir / "base-cdf"
            total_files[True] = build_target(bases[True], args.rows, args.files, rng, cdf=True)
        log(f"target: {args.rows:,} rows in {total_files[False]} files")
        sources: dict[str, tuple[Path, Expected]] = {}
        for w in workloads:
            if w.key == "1c" and "1" in sources:
                sources[w.key] = sources["1"]
                continue
            path = workdir / "sources" / f"w{w.key}"
            sources[w.key] = (path, build_source(path, w, args.rows, rng))
        write_deltalake(str(workdir / "warm-table"), pa.table({"id": pa.array([1, 2], pa.int64())}))
        log("sources written")
        with spark_server(args, workdir) as (remote, jvm_pid):
            log(f"Spark Connect server up at {remote}")
            ctx = Context(args, workdir, remote, jvm_pid, bases, total_files)
            for w in workloads:
                log(f"workload ({w.key}) {w.title}: {sources[w.key][1].source_rows:,} source rows")
            outcomes = run_rounds(ctx, [(w, *sources[w.key]) for w in workloads], log)
        for o in outcomes:
            if o.workload.cdf:
                o.baseline = next((p for p in outcomes if p.workload.key == "1"), None)
        log(f"done; load average {load_average()} (other processes on the machine slow both sides)")
        report(ctx, outcomes)
    finally:
        if args.keep:
            print(f"\nkept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if any(o.problems or o.crashed for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
