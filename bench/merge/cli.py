"""The command line: which workloads, peers and sizes; building the data; the Spark servers; the report."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.merge import read_overhead, report
from bench.merge.children import Peer, child_main
from bench.merge.data import build_delete_source, build_source, build_target, enable_deletion_vectors
from bench.merge.measure import load_average
from bench.merge.runner import Context, Outcome, check_outcome, run_rounds
from bench.merge.workloads import SCALE_KEY, WORKLOADS, Expected

MARKER = ".merge-bench"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    import bench.merge

    doc = bench.merge.__doc__ or ""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=5_000_000, help="target rows (default 5,000,000)")
    p.add_argument("--files", type=int, default=20, help="target files (default 20)")
    p.add_argument("--only", default="", help="workloads to run, e.g. 3 or 1,4 or 6 (default: 1-5)")
    p.add_argument("--repeat", type=int, default=3, help="timed rounds; each peer's best time counts (default 3)")
    p.add_argument("--cdf", action="store_true", help="add workload (1) on CDF-enabled tables (issue 6)")
    p.add_argument(
        "--dv",
        action="store_true",
        help="the workloads' deletion-vector variants: the engine merges a copy with deletion vectors enabled; "
        "adds the read-overhead scans (issue 20)",
    )
    p.add_argument("--scale", action="store_true", help="add workload (6): 1,000 scattered upserts at --scale-rows")
    p.add_argument(
        "--scale-rows",
        default="5000000,20000000",
        help="target sizes of workload (6), each in files of --rows/--files rows (default 5000000,20000000)",
    )
    p.add_argument("--read", action="store_true", help="the read-overhead scans without --dv")
    p.add_argument(
        "--delta", action="store_true", help="add Delta on Spark's own MERGE INTO as a third peer (issue 29)"
    )
    p.add_argument("--dir", type=Path, default=Path("/tmp/merge-bench"), help="work folder (default /tmp/merge-bench)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--driver-memory", default="4g", help="spark.driver.memory of each Spark server (default 4g)")
    p.add_argument("--remote", default="", help="an existing Spark Connect server (sc://host:port) for the engine")
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
    p.add_argument("--child", nargs=2, metavar=("PEER", "JOB"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return args
    if args.rows < 100 or args.files < 1 or args.repeat < 1 or args.warmup < 0:
        p.error("--rows must be at least 100, --files and --repeat at least 1, --warmup at least 0")
    try:
        args.scale_sizes = sorted({int(n) for n in args.scale_rows.split(",") if n.strip()})
    except ValueError:
        p.error(f"--scale-rows takes target sizes separated by commas, not {args.scale_rows!r}")
    if not args.scale_sizes or min(args.scale_sizes) < 1000:
        p.error("--scale-rows needs sizes of at least 1,000 rows")
    keys = [k.strip() for k in args.only.split(",") if k.strip()] or ["1", "2", "3", "4", "5"]
    unknown = [k for k in keys if k not in WORKLOADS]
    if unknown:
        p.error(f"unknown workload(s) {unknown}; choose from {', '.join(WORKLOADS)}")
    if args.dv:
        keys = [f"{k}v" if f"{k}v" in WORKLOADS else k for k in keys]
    if args.cdf:
        keys = [k for k in keys if k != "1c"]
        keys = [*(["1"] if "1" not in keys else []), *keys, "1c"]
    if args.scale:
        keys.append(SCALE_KEY)
    args.keys = sorted(dict.fromkeys(keys), key=list(WORKLOADS).index)
    args.read = args.read or args.dv
    return args


def prepare_workdir(path: Path) -> Path:
    path = path.resolve()
    if path.exists():
        if not (path / MARKER).exists() and any(path.iterdir()):
            raise SystemExit(f"{path} exists, is not empty and was not made by this benchmark; choose another --dir")
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / MARKER).write_text("work folder of the merge bench (bench/merge); removed at the end unless --keep\n")
    return path


@contextmanager
def engine_server(args: argparse.Namespace, workdir: Path) -> Iterator[tuple[str, int | None]]:
    if args.remote:
        yield args.remote, None
        return
    from engine.spark_server import start_connect_server

    server = start_connect_server(conf={"spark.driver.memory": args.driver_memory}, log_dir=workdir / "spark-logs")
    try:
        yield f"sc://127.0.0.1:{server.port}", server.process.pid
    finally:
        server.stop()


@contextmanager
def delta_server(args: argparse.Namespace, workdir: Path) -> Iterator[tuple[str, int | None]]:
    """Delta's Spark with the engine server's resources: local[2], the same driver memory and server settings."""
    from tests.oracle.delta_spark import prepare, start_delta_connect_server

    server = start_delta_connect_server(
        prepare(), log_dir=workdir / "delta-spark-logs", conf={"spark.driver.memory": args.driver_memory}
    )
    try:
        yield f"sc://127.0.0.1:{server.port}", server.process.pid
    finally:
        server.stop()


@dataclass
class Plan:
    """One target size's tables and the workloads run on them."""

    ctx: Context
    outcomes: list[Outcome]


def _bases(
    workdir: Path, rows: int, files: int, rng: np.random.Generator, *, cdf: bool, dv: bool
) -> tuple[dict[str, Path], dict[str, int]]:
    bases = {"plain": workdir / "base"}
    total = {"plain": build_target(bases["plain"], rows, files, rng)}
    if cdf:
        bases["cdf"] = workdir / "base-cdf"
        total["cdf"] = build_target(bases["cdf"], rows, files, rng, cdf=True)
    if dv:
        bases["dv"] = workdir / "base-dv"
        enable_deletion_vectors(bases["plain"], bases["dv"])
        total["dv"] = total["plain"]
    return bases, total


def build_plans(
    args: argparse.Namespace, workdir: Path, rng: np.random.Generator, log: Callable[[str], None]
) -> list[Plan]:
    plans = []
    main_keys = [k for k in args.keys if k != SCALE_KEY]
    if main_keys or args.read:
        workloads = [WORKLOADS[k] for k in main_keys]
        bases, total = _bases(
            workdir,
            args.rows,
            args.files,
            rng,
            cdf=any(w.cdf for w in workloads),
            dv=args.read or any(w.dv for w in workloads),
        )
        log(f"target: {args.rows:,} rows in {total['plain']} files")
        ctx = Context(args, workdir, bases, total)
        sources: dict[str, tuple[Path, Expected]] = {}
        for w in workloads:
            if w.data_key not in sources:
                path = workdir / "sources" / f"w{w.data_key}"
                sources[w.data_key] = (path, build_source(path, w, args.rows, rng))
        plans.append(
            Plan(
                ctx,
                [
                    Outcome(
                        w,
                        sources[w.data_key][1],
                        sources[w.data_key][0],
                        args.rows,
                        total_files=total["cdf" if w.cdf else "plain"],
                    )
                    for w in workloads
                ],
            )
        )
    if SCALE_KEY in args.keys:
        per_file = max(args.rows // args.files, 1)
        for size in args.scale_sizes:
            folder = workdir / f"scale-{size}"
            bases, total = _bases(folder, size, max(size // per_file, 1), rng, cdf=False, dv=True)
            log(f"scale target: {size:,} rows in {total['plain']} files")
            ctx = Context(args, folder, bases, total, tag=f"s{size}-")
            w = WORKLOADS[SCALE_KEY]
            source = folder / "source"
            plans.append(
                Plan(ctx, [Outcome(w, build_source(source, w, size, rng), source, size, total_files=total["plain"])])
            )
    return plans


def run(args: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> int:
    from deltalake import write_deltalake

    rng = np.random.default_rng(args.seed)
    log("building the target table(s) and sources")
    plans = build_plans(args, workdir, rng, log)
    write_deltalake(str(workdir / "warm-table"), pa.table({"id": pa.array([1, 2], pa.int64())}))
    for plan in plans:
        plan.ctx.workdir.mkdir(parents=True, exist_ok=True)
        if plan.ctx.workdir != workdir:
            shutil.copytree(workdir / "warm-table", plan.ctx.workdir / "warm-table")
    overhead = None
    if args.read:
        main = plans[0].ctx
        source = workdir / "sources" / "read-overhead"
        deleted = build_delete_source(source, args.rows, read_overhead.FRACTION, rng)
        overhead = read_overhead.ReadOverhead(source, deleted, workdir / "read-dv", workdir / "read-rewritten")
    log("data written")

    phases: list[tuple[Sequence[Peer], Callable[..., object]]] = [(("engine", "deltars"), engine_server)]
    if args.delta:
        phases.append((("delta",), delta_server))
    for peers, server in phases:
        with server(args, workdir) as (remote, jvm_pid):
            log(f"{' and '.join(peers)}: Spark Connect server up at {remote}; load average {load_average()}")
            for plan in plans:
                plan.ctx.remote, plan.ctx.jvm_pid = remote, jvm_pid
                if plan.outcomes:
                    run_rounds(plan.ctx, plan.outcomes, peers, log)
            if overhead is not None:
                main.remote, main.jvm_pid = remote, jvm_pid
                if peers[0] == "engine":
                    read_overhead.prepare(main, overhead, log)
                read_overhead.measure(main, overhead, peers[0], log)
        log(f"{' and '.join(peers)} done; load average {load_average()}")

    all_peers: list[Peer] = ["engine", "deltars", *(["delta"] if args.delta else [])]
    outcomes = []
    for plan in plans:
        for outcome in plan.outcomes:
            check_outcome(plan.ctx, outcome, all_peers)
            outcomes.append(outcome)
    for o in outcomes:
        if o.workload.cdf:
            o.baseline = next((p for p in outcomes if p.workload.key == "1"), None)
    log(f"checked; load average {load_average()} (other processes on the machine slow every peer)")
    if outcomes:
        ctx = plans[0].ctx
        report.results(ctx, outcomes, delta=args.delta)
        report.phases(outcomes, delta=args.delta)
        report.cdf(outcomes)
        report.scale(outcomes, all_peers)
        report.problems(outcomes, ctx)
    if overhead is not None:
        read_overhead.check(overhead, args.rows)
        read_overhead.report(overhead, args.rows)
    failed = any(o.problems or o.crashed for o in outcomes) or bool(overhead and overhead.problems)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(*args.child)
    from engine.spark_server import SERVER_CONF

    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {msg} [load {os.getloadavg()[0]:.1f}]", flush=True)

    workdir = prepare_workdir(args.dir)
    conf = {**SERVER_CONF, "spark.driver.memory": args.driver_memory}
    peers = "engine vs deltalake (delta-rs) merge" + (" and Delta on Spark's MERGE INTO" if args.delta else "")
    print(
        f"MERGE benchmark: {peers}; {os.cpu_count()} cores; target {args.rows:,} rows in {args.files} files sorted "
        f"by id (even ids; new keys are odd); workloads {', '.join(args.keys)}; work folder {workdir}"
    )
    print(
        "Timed: snapshot load, reading the source Delta table and the merge, for every peer; each in its own "
        "process, on a fresh copy of the target."
    )
    if args.remote:
        print(f"engine's Spark Connect server: {args.remote} (not started here; its driver memory is its own)")
    else:
        print(
            f"Spark Connect server(s): local[2], spark.driver.memory={conf['spark.driver.memory']}, "
            f"spark.sql.shuffle.partitions={conf['spark.sql.shuffle.partitions']}, "
            f"adaptive={conf['spark.sql.adaptive.enabled']}; one server per Spark for the whole run"
            + ("; Delta on Spark runs after the engine and delta-rs, on its own server" if args.delta else "")
        )
    print(f"delta-rs merge: streamed_exec={args.deltars_streamed_exec}")
    print(f"load average at start: {load_average()}")
    try:
        return run(args, workdir, lambda msg: log(msg))
    finally:
        if args.keep:
            print(f"\nkept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
