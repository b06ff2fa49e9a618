"""The AUTO CDC benchmark (issue 23's bench line): a change feed applied as one AUTO CDC batch, beside the plain
MERGE of the same net changes, on copies of one target, in the same run on the same Spark Connect server.

The target has ``--rows`` rows (every ``__START_AT`` 1,000,000). The feed has ``--events`` events over existing and
new keys: ``--deletes`` of them deletes, ``--late`` of them older than the target's rows (so AUTO CDC must drop them),
and about one key in five named by two or three events. The plain MERGE's source is the feed's net change per key,
computed here with Arrow; both must leave the same rows, which the bench checks.

    python -m bench.auto_cdc_bench --rows 5000000 --events 500000 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from engine import (
    AutoCdcSpec,
    DeleteAction,
    InsertAction,
    MergeClause,
    MergeSpec,
    TableSource,
    UpdateAction,
    connect,
    run_auto_cdc,
    run_merge,
)
from engine.spark_server import start_connect_server

BASE_SEQ = 1_000_000
START = {"__START_AT": "source.ts"}


def build_target(path: Path, rows: int, files: int) -> None:
    rng = np.random.default_rng(1)
    per = -(-rows // files)
    for start in range(0, rows, per):
        ids = np.arange(start, min(rows, start + per), dtype=np.int64)
        write_deltalake(
            str(path),
            pa.table(
                {
                    "id": ids,
                    "name": pa.array([f"n{i}" for i in ids]),
                    "amount": rng.integers(0, 10_000, len(ids)),
                    "__START_AT": np.full(len(ids), BASE_SEQ, dtype=np.int64),
                }
            ),
            mode="append",
        )


def build_feed(rows: int, events: int, deletes: float, late: float) -> pa.Table:
    """Events over existing keys and new ones (a tenth), some keys named more than once, shuffled."""
    rng = np.random.default_rng(2)
    keys = rng.integers(0, int(rows * 1.1), int(events * 0.8))
    repeats = rng.choice(keys, events - len(keys))
    ids = np.concatenate([keys, repeats])
    seq = BASE_SEQ + 1 + rng.permutation(events).astype(np.int64)
    is_late = rng.random(events) < late
    seq = np.where(is_late, BASE_SEQ - 1 - rng.integers(0, 1000, events), seq)
    op = np.where(rng.random(events) < deletes, "D", "U")
    order = rng.permutation(events)
    return pa.table(
        {
            "id": ids[order],
            "op": op[order],
            "ts": seq[order],
            "name": pa.array([f"e{i}" for i in range(events)]),
            "amount": rng.integers(0, 10_000, events),
        }
    )


def net_changes(feed: pa.Table, rows: int) -> pa.Table:
    """Per key, the newest event, when it is newer than the target's row (keys from ``rows`` on are new): what
    the plain MERGE applies."""
    fresh = feed.filter(pc.or_(pc.greater(feed["ts"], BASE_SEQ), pc.greater_equal(feed["id"], rows)))
    ordered = fresh.sort_by([("id", "ascending"), ("ts", "descending")])
    ids = ordered["id"].to_numpy()
    first = np.ones(len(ids), dtype=bool)
    first[1:] = ids[1:] != ids[:-1]
    return ordered.filter(pa.array(first))


def plain_merge_spec(target: Path, source: Path) -> MergeSpec:
    return MergeSpec(
        target=str(target),
        source=TableSource(format="parquet", path=str(source)),
        on="target.id = source.id",
        matched=(
            MergeClause("matched", DeleteAction(), condition="source.op = 'D'"),
            MergeClause(
                "matched",
                UpdateAction(set={"name": "source.name", "amount": "source.amount", "__START_AT": "source.ts"}),
            ),
        ),
        not_matched=(
            MergeClause(
                "notMatched",
                InsertAction(
                    values={
                        "id": "source.id",
                        "name": "source.name",
                        "amount": "source.amount",
                        "__START_AT": "source.ts",
                    }
                ),
                condition="source.op <> 'D'",
            ),
        ),
    )


def cdc_spec(target: Path, source: Path) -> AutoCdcSpec:
    return AutoCdcSpec(
        target=str(target),
        source=TableSource(format="parquet", path=str(source)),
        keys=("id",),
        sequence_by=("ts",),
        apply_as_deletes="op = 'D'",
        except_column_list=("op", "ts"),
    )


def table_rows(path: Path) -> pa.Table:
    return DeltaTable(str(path)).to_pyarrow_table(columns=["id", "name", "amount", "__START_AT"]).sort_by("id")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--deletes", type=float, default=0.10)
    parser.add_argument("--late", type=float, default=0.05)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="auto-cdc-bench-"))
    base, feed_dir, net_dir = work / "base", work / "feed", work / "net"
    build_target(base, args.rows, args.files)
    feed = build_feed(args.rows, args.events, args.deletes, args.late)
    net = net_changes(feed, args.rows)
    feed_dir.mkdir()
    net_dir.mkdir()
    import pyarrow.parquet as pq

    pq.write_table(feed, feed_dir / "part-0.parquet")
    pq.write_table(net, net_dir / "part-0.parquet")
    server = start_connect_server(conf={"spark.driver.memory": args.driver_memory}, log_dir=work / "spark-logs")
    times: dict[str, list[float]] = {"auto_cdc": [], "merge": []}
    problems: list[str] = []
    try:
        spark = connect(f"sc://127.0.0.1:{server.port}")
        for round_ in range(args.repeat + 1):  # the first round warms the JVM and is not counted
            for name in ("auto_cdc", "merge"):
                target = work / f"{name}-{round_}"
                shutil.copytree(base, target)
                start = time.monotonic()
                if name == "auto_cdc":
                    run_auto_cdc(spark, cdc_spec(target, feed_dir))
                else:
                    run_merge(spark, plain_merge_spec(target, net_dir))
                seconds = time.monotonic() - start
                if round_:
                    times[name].append(seconds)
                print(f"round {round_} {name}: {seconds:.2f} s", flush=True)
            if round_ == 0 and not table_rows(work / "auto_cdc-0").equals(table_rows(work / "merge-0")):
                problems.append("AUTO CDC and the plain MERGE of the net changes left different rows")
            for name in ("auto_cdc", "merge"):
                shutil.rmtree(work / f"{name}-{round_}")
    finally:
        server.stop()
    auto_cdc, merge = statistics.median(times["auto_cdc"]), statistics.median(times["merge"])
    result: dict[str, Any] = {
        "rows": args.rows,
        "events": args.events,
        "net_changes": net.num_rows,
        "deletes": args.deletes,
        "late": args.late,
        "auto_cdc_seconds": round(auto_cdc, 2),
        "merge_seconds": round(merge, 2),
        "ratio": round(auto_cdc / merge, 2),
        "problems": problems,
    }
    print(
        f"AUTO CDC of {args.events:,} events into {args.rows:,} rows: {auto_cdc:.2f} s; the plain MERGE of its "
        f"{net.num_rows:,} net changes: {merge:.2f} s; ratio {auto_cdc / merge:.2f}"
        + (f"; PROBLEMS {problems}" if problems else ""),
        flush=True,
    )
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
