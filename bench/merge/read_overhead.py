"""What deletion vectors cost a reader: a full scan (count, and a sum over ``value``) of a table with a tenth of
its rows deleted by deletion vectors, against the same live rows rewritten without vectors.

The first table is the target with deletion vectors enabled after the engine's merge-on-read delete of 10% of the
ids at random (every file gets a vector); the second is delta-rs's copy-on-write delete of the same ids. Each peer
scans both in alternation, a warm-up scan first, and the best time of each counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.merge.children import Peer, run_child
from bench.merge.data import fresh_copy
from bench.merge.runner import PEER_NAMES, Context

FRACTION = 0.1


@dataclass
class ReadOverhead:
    source: Path
    deleted: int
    with_vectors: Path
    rewritten: Path
    best: dict[tuple[Peer, bool], float] = field(default_factory=dict)
    """Best scan seconds by (peer, deletion vectors)."""
    answers: dict[tuple[Peer, bool], tuple[int, float]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    load: dict[Peer, str] = field(default_factory=dict)


def prepare(ctx: Context, overhead: ReadOverhead, log: Callable[[str], None]) -> None:
    """The two tables, written through the engine's Spark server (so it must be up)."""
    from bench.merge.peer_deltars import merge as deltars_merge

    fresh_copy(ctx.bases["dv"], overhead.with_vectors)
    job = _job(ctx, overhead, "engine", overhead.with_vectors, op="merge")
    out = run_child("engine", job, ctx.workdir, "read-prep")
    if out["status"] != "ok":
        overhead.problems.append(f"the engine's delete of {overhead.deleted:,} rows failed: {out['error']}")
        return
    fresh_copy(ctx.bases["plain"], overhead.rewritten)
    out = deltars_merge({**_job(ctx, overhead, "deltars", overhead.rewritten, op="merge")})
    if out["status"] != "ok":
        overhead.problems.append(f"delta-rs's delete failed: {out['error']}")
    log(f"read overhead: {overhead.deleted:,} rows deleted by deletion vectors and by a rewrite")


def _job(ctx: Context, overhead: ReadOverhead, peer: Peer, target: Path, *, op: str) -> dict[str, Any]:
    return {
        "op": op,
        "kind": "delete",
        "source": str(overhead.source),
        "target": str(target),
        "remote": ctx.remote,
        "session_id": ctx.session_id(peer),
        "jvm_pid": ctx.jvm_pid,
        "warm_table": str(ctx.workdir / "warm-table"),
        "streamed_exec": True,
        "repeat": 1,
    }


def measure(ctx: Context, overhead: ReadOverhead, peer: Peer, log: Callable[[str], None]) -> None:
    """``peer`` scans both tables, alternating, one warm-up round then ``--repeat`` timed ones."""
    from bench.merge.measure import load_average

    if overhead.problems:
        return
    for number in range(1 + ctx.args.repeat):
        for vectors, path in ((True, overhead.with_vectors), (False, overhead.rewritten)):
            out = run_child(peer, _job(ctx, overhead, peer, path, op="scan"), ctx.workdir, "read")
            if out["status"] != "ok":
                overhead.problems.append(f"{PEER_NAMES[peer]} scan failed: {out['error']}")
                return
            seconds = float(out["times"][0])
            log(f"  read overhead, {PEER_NAMES[peer]}, {'vectors' if vectors else 'rewritten'}: {seconds:.2f} s")
            overhead.answers[(peer, vectors)] = (int(out["rows"]), float(out["sum"]))
            if number > 0:
                overhead.best[(peer, vectors)] = min(seconds, overhead.best.get((peer, vectors), seconds))
    overhead.load[peer] = load_average()


def check(overhead: ReadOverhead, rows: int) -> None:
    """Every scan counts the live rows; all sums agree (to rounding: Spark adds in any order)."""
    want = rows - overhead.deleted
    sums = [s for _, s in overhead.answers.values()]
    for (peer, vectors), (count, _) in overhead.answers.items():
        if count != want:
            overhead.problems.append(
                f"{PEER_NAMES[peer]} counts {count:,} live rows {'with' if vectors else 'without'} vectors, "
                f"expected {want:,}"
            )
    if sums and max(sums) - min(sums) > 1e-9 * max(abs(s) for s in sums):
        overhead.problems.append(f"the sums of value differ: {sums}")


def report(overhead: ReadOverhead, rows: int) -> None:
    print()
    print(
        f"Read overhead (issue 20): full scan (count + sum(value)) of {rows:,} rows with {overhead.deleted:,} "
        f"({FRACTION:.0%}) deleted, best of the timed scans, snapshot load included:"
    )
    for peer in ("engine", "delta"):
        dv, plain = overhead.best.get((peer, True)), overhead.best.get((peer, False))
        if dv is None or plain is None:
            continue
        print(
            f"  {PEER_NAMES[peer]:<15} deletion vectors {dv:6.2f} s, rewritten {plain:6.2f} s: "
            f"overhead {dv / plain:.2f}x (load average after: {overhead.load.get(peer, '-')})"
        )
    for problem in overhead.problems:
        print(f"  WRONG {problem}")
