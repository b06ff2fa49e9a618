"""Many merges at once (issue 25): small-merge latency and CPU, throughput across tables, the first merge after a
worker reports ready, and how a large merge on one table holds up the small merges of the others.

Real processes, as a deployment runs them: a PostgreSQL server (the service tests' ``PostgresServer``), one Spark
Connect server (``engine.spark_server``, ``local[2]``), ``merge-service api`` and ``--workers`` processes of
``merge-service worker`` sharing that server, over ``--tables`` small Delta tables (3 rows each) and, for the
interference run, one table of ``--large-rows`` rows.

Runs, in order:

  first    the first worker's first merge once it reports ready (a 1-row upsert into a small table), against the
           small merges' warm p50 afterwards, one at a time (the ``fewer`` run with one worker). The other workers
           start after that merge: any worker running could claim it.
  small    ``--merges`` 1-row upserts submitted at once, round-robin over the tables: merges per minute (first
           submission to last finish), submit-to-finished p50/p95, engine time (``executionTimeMs``) p50/p95, and
           CPU seconds per merge (Spark JVM + workers + API, from /proc, over the run).
  fewer    the small merges again once all but ``--fewer-workers`` workers have stopped,
  again    and once more after they started again: more workers must never merge fewer a minute than fewer
           workers. The server's JIT goes on compiling long after the warm-up, so a later run is faster by
           that alone: ``small`` and ``again`` bracket ``fewer``, and their rate together is compared.
  medium   ``--medium`` upserts of 1,000 source rows into a table of ``--medium-rows`` rows, after
           ``--medium-warmup`` untimed ones (their engine times printed): engine time p50;
  medium-dv  the same into a copy with deletion vectors enabled (merge-on-read, Databricks' default for new tables).
  beside   the same small merges with one large merge (an upsert of ``--large-rows``/10 rows into the large table)
           submitted first: the small merges' p95 against the ``small`` run's.

Every job must succeed and every table must hold the rows its merges wrote (checked with deltalake): a fast wrong
answer fails the bench (exit 1). Targets are printed PASS or MISS, never failed. The mean of each job's
``timings`` segments is printed, so that where the wall time goes is visible beside the engine's own time.

    .venv/bin/python bench/throughput_bench.py [--tables 40] [--merges 400] [--workers 4] [--large-rows 5000000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
import pyarrow as pa  # noqa: E402
from deltalake import DeltaTable, write_deltalake  # noqa: E402

from bench.fault_campaign import ServiceProcess  # noqa: E402
from engine.spark_server import SparkProcess, free_port, start_connect_server  # noqa: E402
from service.timeline import SEGMENTS  # noqa: E402
from tests.e2e.harness import upsert_body  # noqa: E402
from tests.service.conftest import PostgresServer  # noqa: E402

BIN = Path(sys.executable).parent
SCHEMA = "id BIGINT, v STRING"
FINAL = {"succeeded", "failed", "cancelled"}
WATCHED_JOBS = 8  # unfinished jobs read per pass of ``Stack.wait``


@dataclass
class Finished:
    """A job as it ended, with its size class."""

    kind: str
    doc: dict[str, Any]

    @property
    def wall(self) -> float:
        return (_time(self.doc["finished_at"]) - _time(self.doc["submitted_at"])).total_seconds()

    @property
    def engine(self) -> float:
        return float(self.doc["metrics"]["executionTimeMs"]) / 1000


@dataclass
class RunFigures:
    name: str
    jobs: list[Finished]
    seconds: float
    cpu_seconds: float
    notes: list[str] = field(default_factory=list)
    cpu_split: dict[str, float] = field(default_factory=dict)
    """CPU seconds of the run by process: the Spark server, the workers, the API."""

    def of(self, kind: str) -> list[Finished]:
        return [j for j in self.jobs if j.kind == kind]


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)


def percentile(values: Sequence[float], p: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), p)) if values else float("nan")


class Stack:
    """PostgreSQL, a Spark Connect server, the API and the workers, over a lake of small tables."""

    def __init__(self, work: Path, *, tables: int, workers: int, driver_memory: str) -> None:
        self.work = work
        self.lake = work / "lake"
        self.lake.mkdir(parents=True)
        logs = work / "logs"
        logs.mkdir()
        self.pg = PostgresServer()
        self.pg._admin('CREATE DATABASE "throughput"')
        self.spark_port = free_port()
        self.spark: SparkProcess = start_connect_server(
            port=self.spark_port, log_dir=logs / "spark", conf={"spark.driver.memory": driver_memory}
        )
        self.env = {
            **os.environ,
            "MERGE_SERVICE_DATABASE_URL": f"postgresql+psycopg://postgres@127.0.0.1:{self.pg.port}/throughput",
            "MERGE_SERVICE_SPARK_REMOTE": f"sc://127.0.0.1:{self.spark_port}",
            "MERGE_SERVICE_LAKE_ROOTS": str(self.lake),
            "MERGE_SERVICE_ACCESS_LOG": "false",
            "MERGE_SERVICE_LOG_LEVEL": "WARNING",
            "MERGE_SERVICE_POLL_INTERVAL_SECONDS": "0.05",
        }
        subprocess.run([str(BIN / "merge-service"), "migrate"], cwd=ROOT, env=self.env, check=True, capture_output=True)
        self.tables = [self.lake / f"t{i:03d}" for i in range(tables)]
        for table in self.tables:
            write_deltalake(str(table), pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}))
        self.api = ServiceProcess(
            "api", [str(BIN / "merge-service"), "api", "--api-processes", "1"], self.env, free_port(), logs
        )
        self.workers = [
            ServiceProcess(f"worker-{i}", [str(BIN / "merge-service"), "worker"], self.env, free_port(), logs)
            for i in range(workers)
        ]
        self.api.start()
        self.api.wait_ready()
        self.client = httpx.Client(base_url=self.api.url, timeout=30)
        self.next_id = 100

    def cpu_seconds(self) -> float:
        return sum(self.cpu_split().values())

    def cpu_split(self) -> dict[str, float]:
        """CPU seconds so far of the Spark server, the workers (those running) and the API, children included."""
        kinds = {
            "spark": [self.spark.process.pid],
            "workers": [w.proc.pid for w in self.workers if w.proc is not None],
            "api": [self.api.proc.pid] if self.api.proc is not None else [],
        }
        split = dict.fromkeys(kinds, 0.0)
        for kind, pids in kinds.items():
            for pid in pids:
                try:
                    proc = psutil.Process(pid)
                    for p in [proc, *proc.children(recursive=True)]:
                        times = p.cpu_times()
                        split[kind] += times.user + times.system
                except psutil.Error:
                    continue
        return split

    def upsert(self, table: Path, rows: list[dict[str, Any]]) -> str:
        response = self.client.post("/merges", json=upsert_body(table, rows, SCHEMA))
        if response.status_code != 202:
            raise RuntimeError(f"submission refused: {response.status_code} {response.text}")
        return str(response.json()["id"])

    def one_row(self, table: Path) -> tuple[str, int]:
        self.next_id += 1
        return self.upsert(table, [{"id": self.next_id, "v": f"n{self.next_id}"}]), self.next_id

    def wait(self, ids: Iterable[str], timeout: float) -> dict[str, dict[str, Any]]:
        """Each job's final document. Like a client draining its own queue, only the ``WATCHED_JOBS`` oldest unfinished
        jobs are read on each pass: reading all 400 every tenth of a second cost the API more CPU than the merges'
        own requests, on the cores the merges run on."""
        pending = list(dict.fromkeys(ids))
        done: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(pending)} jobs not finished in {timeout:.0f} s")
            for job_id in pending[:WATCHED_JOBS]:
                doc = self.client.get(f"/merges/{job_id}").json()
                if doc["status"] in FINAL:
                    if doc["status"] != "succeeded":
                        raise RuntimeError(f"job {job_id} ended {doc['status']}: {doc.get('error')}")
                    done[job_id] = doc
            pending = [job_id for job_id in pending if job_id not in done]
            time.sleep(0.1)
        return done

    def close(self) -> None:
        self.client.close()
        for process in [*self.workers, self.api]:
            process.stop(30)
        self.spark.stop(10)
        self.pg.stop()


def first_merges(stack: Stack, timeout: float) -> list[Finished]:
    """Each worker started and waited for until ready; the first, alone, given one 1-row merge."""
    finished: list[Finished] = []
    for i, worker in enumerate(stack.workers):
        worker.start()
        worker.wait_ready(timeout)
        if i == 0:
            job_id, _ = stack.one_row(stack.tables[0])
            finished += [Finished("first", doc) for doc in stack.wait([job_id], timeout).values()]
    return finished


def small_run(stack: Stack, name: str, merges: int, timeout: float, *, beside: Path | None = None) -> RunFigures:
    """``merges`` 1-row upserts at once, round-robin over the tables; with ``beside``, one large upsert (a tenth of
    that table's ids updated, as many inserted) submitted just before them."""
    split0 = stack.cpu_split()
    kinds: dict[str, str] = {}
    if beside is not None:
        count = DeltaTable(str(beside)).to_pyarrow_dataset().count_rows()
        rows = [{"id": int(i), "v": "large"} for i in np.linspace(0, 2 * count, count // 10, dtype=np.int64)]
        kinds[stack.upsert(beside, rows)] = "large"
    for i in range(merges):
        job_id, _ = stack.one_row(stack.tables[i % len(stack.tables)])
        kinds[job_id] = "small"
    done = stack.wait(kinds, timeout)
    split = {kind: cpu - split0.get(kind, 0.0) for kind, cpu in stack.cpu_split().items()}
    jobs = [Finished(kinds[job_id], doc) for job_id, doc in done.items()]
    # The service's own clock: first submission to last finish, not when the bench happened to look.
    seconds = (
        max(_time(j.doc["finished_at"]) for j in jobs) - min(_time(j.doc["submitted_at"]) for j in jobs)
    ).total_seconds()
    return RunFigures(name, jobs, seconds, sum(split.values()), cpu_split=split)


def medium_run(
    stack: Stack, rows: int, count: int, timeout: float, *, warmup: int = 0, deletion_vectors: bool = False
) -> RunFigures:
    """``count`` upserts of 1,000 rows (half updates, half inserts) into a table of ``rows`` rows, one at a time,
    after ``warmup`` such upserts not timed: the server has then run this kind of merge (a fresh server takes
    several to compile their hot paths). ``deletion_vectors``: the table has them enabled (as Databricks creates
    tables), so the merges are merge-on-read. The table must then hold every key once, each upserted key with the
    upsert's value."""
    kind = "medium-dv" if deletion_vectors else "medium"
    table = stack.lake / kind
    data = pa.table({"id": pa.array(np.arange(0, 2 * rows, 2), pa.int64()), "v": pa.array(["m"] * rows)})
    if deletion_vectors:
        from bench.merge.data import enable_deletion_vectors

        base = stack.lake / f"{kind}-base"
        write_deltalake(str(base), data)
        enable_deletion_vectors(base, table)
    else:
        write_deltalake(str(table), data)
    rng = np.random.default_rng(7)
    upserted: set[int] = set()

    def upsert() -> list[Finished]:
        keys = [int(k) for k in rng.choice(2 * rows, 1000, replace=False)]
        upserted.update(keys)
        job_id = stack.upsert(table, [{"id": k, "v": "u"} for k in keys])
        return [Finished(kind, doc) for doc in stack.wait([job_id], timeout).values()]

    warm = [j for _ in range(warmup) for j in upsert()]
    cpu0, t0 = stack.cpu_seconds(), time.monotonic()
    jobs = [j for _ in range(count) for j in upsert()]
    figures = RunFigures(kind, jobs, time.monotonic() - t0, stack.cpu_seconds() - cpu0)
    if warm:
        figures.notes.append("warm-up engine times (s): " + ", ".join(f"{j.engine:.3f}" for j in warm))
    new_keys = sum(1 for k in upserted if k % 2)
    check_contents(table, rows + new_keys, len(upserted))
    return figures


def check_contents(table: Path, rows: int, upserted: int) -> None:
    """The table holds ``rows`` distinct keys, ``upserted`` of them with the upserts' value (read through
    delta-rs's query engine, which applies deletion vectors)."""
    from deltalake import QueryBuilder

    query = "SELECT count(*) AS n, count(DISTINCT id) AS keys, count(*) FILTER (WHERE v = 'u') AS u FROM t"
    found = pa.table(QueryBuilder().register("t", DeltaTable(str(table))).execute(query).read_all()).to_pylist()[0]
    if (found["n"], found["keys"], found["u"]) != (rows, rows, upserted):
        raise RuntimeError(
            f"{table.name} holds {found['n']} rows, {found['keys']} keys, {found['u']} upserted, where its merges "
            f"leave {rows} rows and keys, {upserted} upserted"
        )


def check_tables(stack: Stack, expected_rows: dict[Path, int]) -> None:
    for table, rows in expected_rows.items():
        found = DeltaTable(str(table)).to_pyarrow_dataset().count_rows()
        if found != rows:
            raise RuntimeError(f"{table.name} holds {found} rows where its merges leave {rows}")


def target_line(name: str, value: float, limit: float, unit: str, *, at_least: bool = False) -> str:
    ok = value >= limit if at_least else value <= limit
    sign = ">=" if at_least else "<="
    return f"  {'PASS' if ok else 'MISS'}  {name}: {value:.3f}{unit} (target {sign} {limit:g}{unit})"


def segments_line(jobs: Sequence[Finished]) -> str:
    means = {s: statistics.fmean(j.doc.get("timings", {}).get(s, 0) for j in jobs) / 1000 for s in SEGMENTS if jobs}
    walls = statistics.fmean(j.wall for j in jobs) if jobs else float("nan")
    parts = ", ".join(f"{s} {v:.3f}" for s, v in means.items() if v > 0)
    return f"    mean wall {walls:.3f} s = {parts} s"


def report(runs: dict[str, RunFigures], args: argparse.Namespace) -> list[str]:
    lines = ["", "run       jobs  secs   merges/min  wall p50/p95 (s)   engine p50/p95 (s)   CPU s/merge"]
    for run in runs.values():
        for kind in ("first", "small", "medium", "medium-dv", "large"):
            jobs = run.of(kind)
            if not jobs:
                continue
            walls, engines = [j.wall for j in jobs], [j.engine for j in jobs]
            rate = len(jobs) / run.seconds * 60
            # The first run's CPU is mostly the workers' start and warm-up: not a merge's cost.
            cpu = run.cpu_seconds / len(run.jobs) if run.name != "first" else float("nan")
            lines.append(
                f"{run.name + '/' + kind:<16}{len(jobs):>4} {run.seconds:6.1f} {rate:10.1f}   "
                f"{percentile(walls, 50):6.3f} {percentile(walls, 95):6.3f}      "
                f"{percentile(engines, 50):6.3f} {percentile(engines, 95):6.3f}       {cpu:6.3f}"
            )
            lines.append(segments_line(jobs))
            if run.cpu_split and kind == "small":
                parts = ", ".join(f"{k} {v / len(run.jobs):.3f}" for k, v in run.cpu_split.items())
                lines.append(f"    CPU s/merge by process: {parts}")
        lines += [f"    {note}" for note in run.notes]
    small = runs["small"].of("small")
    # A merge's own latency is measured where merges run one at a time (the one-worker run when there is one):
    # with four at once on two cores, each one's engine time also counts the others' turns on the cores.
    alone = runs["fewer"].of("small") if "fewer" in runs and args.fewer_workers == 1 else small
    warm_p50 = percentile([j.engine for j in alone], 50)
    at_once = percentile([j.engine for j in small], 50)
    lines.append("")
    lines.append("targets")
    if "medium" in runs:
        medium = percentile([j.engine for j in runs["medium"].of("medium")], 50)
        what = f"medium merge engine p50 ({args.medium_rows:,} rows, 1,000 source)"
        lines.append(target_line(what, medium, 0.5, " s"))
    if "medium-dv" in runs:
        medium = percentile([j.engine for j in runs["medium-dv"].of("medium-dv")], 50)
        what = f"medium merge engine p50, deletion vectors ({args.medium_rows:,} rows, 1,000 source)"
        lines.append(target_line(what, medium, 0.5, " s"))
    which = "one at a time" if alone is not small else f"{args.workers} workers"
    lines.append(target_line(f"1-row merge into a small table, engine p50 ({which})", warm_p50, 0.3, " s"))
    if alone is not small:
        lines.append(f"        (with {args.workers} workers at once: {at_once:.3f} s)")
    first = runs["first"].of("first")
    if first:
        what = f"first merge after ready / warm p50 ({which})"
        lines.append(target_line(what, first[0].engine / warm_p50, 1.5, "x"))
    lines.append(target_line("CPU per 1-row merge", runs["small"].cpu_seconds / len(small), 0.3, " s"))
    rate = len(small) / runs["small"].seconds * 60
    what = f"merges per minute ({len(small)} over {args.tables} tables, {args.workers} workers)"
    lines.append(target_line(what, rate, 250, "", at_least=True))
    if "beside" in runs:
        p95 = percentile([j.wall for j in small], 95)
        beside = percentile([j.wall for j in runs["beside"].of("small")], 95)
        lines.append(target_line("small merges' p95 beside a large merge / without", beside / p95, 2.0, "x"))
    if "fewer" in runs and "again" in runs:
        fewer, again = runs["fewer"], runs["again"]
        fewer_rate = len(fewer.of("small")) / fewer.seconds * 60
        more_rate = (len(small) + len(again.of("small"))) / (runs["small"].seconds + again.seconds) * 60
        what = f"merges per minute with {args.workers} workers (small and again) / with {args.fewer_workers}"
        lines.append(target_line(what, more_rate / fewer_rate, 1.0, "x", at_least=True))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tables", type=int, default=40)
    p.add_argument("--merges", type=int, default=400, help="1-row merges per run (default 400)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--medium", type=int, default=5, help="1,000-row upserts into the medium table (0: none)")
    p.add_argument("--medium-rows", type=int, default=1_000_000)
    p.add_argument("--medium-warmup", type=int, default=3, help="untimed upserts before the medium runs' own")
    p.add_argument("--large-rows", type=int, default=5_000_000, help="the large table's rows (0: no 'beside' run)")
    p.add_argument(
        "--fewer-workers", type=int, default=1, help="workers of the 'fewer' run (0, or --workers or more: no such run)"
    )
    p.add_argument("--driver-memory", default="4g")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds a run may take")
    p.add_argument("--out", type=Path, help="write the figures as JSON")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="throughput-bench-") as tmp:
        stack = Stack(Path(tmp), tables=args.tables, workers=args.workers, driver_memory=args.driver_memory)
        try:
            runs: dict[str, RunFigures] = {}
            t0, cpu0 = time.monotonic(), stack.cpu_seconds()
            runs["first"] = RunFigures("first", first_merges(stack, args.timeout), 0.0, 0.0)
            runs["first"].seconds, runs["first"].cpu_seconds = time.monotonic() - t0, stack.cpu_seconds() - cpu0
            print(f"workers ready; first merge took {runs['first'].jobs[0].engine:.3f} s of engine time", flush=True)
            runs["small"] = small_run(stack, "small", args.merges, args.timeout)
            print(f"small: {args.merges} merges in {runs['small'].seconds:.1f} s", flush=True)
            if 0 < args.fewer_workers < args.workers:
                stopped = stack.workers[args.fewer_workers :]
                for worker in stopped:
                    worker.stop(60)
                runs["fewer"] = small_run(stack, "fewer", args.merges, args.timeout)
                print(f"fewer: {args.merges} merges in {runs['fewer'].seconds:.1f} s", flush=True)
                for worker in stopped:
                    worker.start()
                for worker in stopped:
                    worker.wait_ready(args.timeout)
                runs["again"] = small_run(stack, "again", args.merges, args.timeout)
                print(f"again: {args.merges} merges in {runs['again'].seconds:.1f} s", flush=True)
            if args.medium:
                for kind in ("medium", "medium-dv"):
                    runs[kind] = medium_run(
                        stack,
                        args.medium_rows,
                        args.medium,
                        args.timeout,
                        warmup=args.medium_warmup,
                        deletion_vectors=kind == "medium-dv",
                    )
            if args.large_rows:
                large = stack.lake / "large"
                ids = np.arange(0, 2 * args.large_rows, 2, dtype=np.int64)
                write_deltalake(str(large), pa.table({"id": ids, "v": pa.array(["l"] * args.large_rows)}))
                runs["beside"] = small_run(stack, "beside", args.merges, args.timeout, beside=large)
            merged = [j.doc["target"] for r in runs.values() for j in r.jobs]
            check_tables(stack, {t: 3 + merged.count(str(t)) for t in stack.tables})
        finally:
            stack.close()
    for line in report(runs, args):
        print(line)
    if args.out:
        args.out.write_text(json.dumps({name: [j.doc for j in r.jobs] for name, r in runs.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
