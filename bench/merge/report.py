"""What the bench prints: per workload the peers' best times and their ratios, CPU, files touched, memory and a
verdict; where the engine's time went; the Change Data Feed, scale and read-overhead figures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.merge.runner import PEER_NAMES, Context, Outcome
from bench.merge.workloads import SCALE_KEY, SCALE_TARGET_ROWS, Workload

MEMORY_TARGET_MB = 500.0


def mb(n: int | None) -> str:
    return f"{n / 2**20:,.0f}" if n else "-"


def secs(s: float | None) -> str:
    return f"{s:.2f}" if s is not None else "-"


def touched_files(o: Outcome) -> int | None:
    """Files the engine's merge touched: removed, or given a deletion vector (merge-on-read)."""
    if o.engine is None:
        return None
    m = o.engine["metrics"]
    return int(m.get("numTargetFilesRemoved", 0)) + int(m.get("numTargetDeletionVectorsAdded", 0))


def files_engine(o: Outcome) -> str:
    if o.engine is None:
        return "-"
    return f"{touched_files(o)}/{o.engine['metrics'].get('numTargetFilesBeforeSkipping')}"


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
    ratio = o.ratio()
    if ratio is None:
        return "-"
    w = o.workload
    misses = []
    if w.target_ratio is not None and has_time_target(o) and ratio > w.target_ratio:
        misses.append("time")
    if w.cdf_overhead_target is not None and (o.cdf_overhead is None or o.cdf_overhead > w.cdf_overhead_target):
        misses.append("CDF overhead")
    touched = touched_files(o)
    if w.max_files_touched is not None and (touched is None or touched > w.max_files_touched):
        misses.append("files")
    if o.engine is not None and o.engine["peak_rss"] / 2**20 >= MEMORY_TARGET_MB:
        misses.append("memory")
    return "MISS (" + ", ".join(misses) + ")" if misses else "PASS"


def has_time_target(o: Outcome) -> bool:
    """The scale workload's target holds only from SCALE_TARGET_ROWS rows."""
    return o.workload.key != SCALE_KEY or o.rows >= SCALE_TARGET_ROWS


def target_text(w: Workload, *, time_target: bool = True) -> str:
    if w.cdf_overhead_target is not None:
        return f"<= {w.cdf_overhead_target:g}x of (1)"
    if w.target_ratio is None or not time_target:
        return "-"
    text = f"<= {w.target_ratio:.2g}"
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


def _label(o: Outcome, ctx: Context) -> str:
    size = f" @ {o.rows / 1e6:g}M" if o.rows != ctx.args.rows or o.workload.key == SCALE_KEY else ""
    return f"({o.workload.key}) {o.workload.title}{size}"


def results(ctx: Context, outcomes: Sequence[Outcome], *, delta: bool) -> None:
    print()
    print(
        f"Results (seconds are best of {ctx.args.repeat}; ratio = engine / delta-rs"
        + ("; eng/Delta = engine / Delta on Spark" if delta else "")
        + "; files = touched/total):"
    )
    rows = []
    for o in outcomes:
        ratio, cpu_ratio = o.ratio(), o.cpu_ratio
        row = [_label(o, ctx), f"{o.expected.source_rows:,}", secs(o.seconds("engine")), secs(o.seconds("deltars"))]
        row.append(f"{ratio:.2f}" if ratio is not None else "-")
        if delta:
            delta_ratio = o.ratio("delta")
            row += [secs(o.seconds("delta")), f"{delta_ratio:.2f}" if delta_ratio is not None else "-"]
        row += [
            f"{o.engine['cpu_s']:.1f}/{o.deltars['cpu_s']:.1f}" if o.engine and o.deltars else "-",
            f"{cpu_ratio:.2f}" if cpu_ratio is not None else "-",
            target_text(o.workload, time_target=has_time_target(o)),
            files_engine(o),
            files_deltars(o, o.total_files),
            mb(o.engine["peak_rss"]) if o.engine else "-",
            mb(o.deltars["peak_rss"]) if o.deltars else "-",
            mb(o.jvm_peak),
            verdict(o),
        ]
        rows.append(row)
    headers = ["workload", "source rows", "engine s", "delta-rs s", "ratio"]
    headers += ["Delta s", "eng/Delta"] if delta else []
    headers += ["CPU s eng/d-rs", "CPU ratio", "target", "files engine", "files delta-rs"]
    headers += ["engine py MB", "delta-rs MB", "JVM MB", "verdict"]
    numeric = {"source rows", "engine s", "delta-rs s", "ratio", "Delta s", "eng/Delta", "CPU s eng/d-rs"}
    numeric |= {"CPU ratio", "engine py MB", "delta-rs MB", "JVM MB"}
    print_table(headers, rows, right={i for i, h in enumerate(headers) if h in numeric})
    print(
        "CPU s = user+system CPU seconds of the timed part: for the engine, its Python process plus the Spark "
        "server JVM (all its threads, so other sessions' work would count too); for delta-rs, its process. Less "
        "sensitive than wall time to other load on the machine; the targets are on wall time."
    )
    print(
        f"Memory target: engine Python process < {MEMORY_TARGET_MB:.0f} MB peak RSS (checked in every verdict). "
        f"JVM MB = the Spark Connect server's peak RSS while the engine's merge ran (a JVM seldom gives heap back, "
        f"so it carries over from earlier workloads; driver heap configured as "
        f"spark.driver.memory={ctx.args.driver_memory}" + (")." if not ctx.args.remote else "; --remote).")
    )


def _phase_row(o: Outcome) -> list[str]:
    e: dict[str, Any] = o.engine or {}
    marks = [("snapshot", 0.0), *((p, t) for p, t in e["phases"])]
    spans = {name: (marks[i + 1][1] if i + 1 < len(marks) else e["wall_s"]) - t for i, (name, t) in enumerate(marks)}
    m = e["metrics"]
    d = o.deltars["metrics"] if o.deltars else {}
    return [
        f"({o.workload.key})" + (f" {o.rows / 1e6:g}M" if o.workload.key == SCALE_KEY else ""),
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


def phases(outcomes: Sequence[Outcome], *, delta: bool) -> None:
    rows = [_phase_row(o) for o in outcomes if o.engine is not None]
    if not rows:
        return
    print()
    print(
        "Where the time goes (seconds). Engine phases from on_progress (prep src+skip: source, resolution and data "
        "skipping with the source key range); metrics from result.metrics; delta-rs from its metrics:"
    )
    headers = ["wl", "snapshot", "prep src+skip", "find touched", "writing", "commit", "materializeSrc", "scan"]
    headers += ["rewrite", "execution", "after skip", "d-rs src read", "d-rs scan", "d-rs rewrite", "d-rs execution"]
    print_table(headers, rows, right=set(range(1, len(headers))))
    if delta:
        print()
        print("Delta on Spark's own metrics of its best run (operationMetrics, seconds):")
        rows = []
        for o in outcomes:
            m = o.best.get("delta", {}).get("metrics")
            if not m:
                continue
            rows.append(
                [
                    f"({o.workload.key})" + (f" {o.rows / 1e6:g}M" if o.workload.key == SCALE_KEY else ""),
                    secs(o.seconds("delta")),
                    f"{m.get('scanTimeMs', 0) / 1000:.2f}",
                    f"{m.get('rewriteTimeMs', 0) / 1000:.2f}",
                    f"{m.get('executionTimeMs', 0) / 1000:.2f}",
                    f"{m.get('numTargetFilesRemoved', 0)}",
                    f"{m.get('numTargetDeletionVectorsAdded', 0)}",
                    f"{m.get('numTargetRowsCopied', 0):,}",
                ]
            )
        headers = ["wl", "wall", "scan", "rewrite", "execution", "files removed", "DVs added", "rows copied"]
        print_table(headers, rows, right=set(range(1, len(headers))))


def cdf(outcomes: Sequence[Outcome]) -> None:
    for o in outcomes:
        if not o.workload.cdf:
            continue
        print()
        print("Change Data Feed (issue 6), workload (1) on tables with delta.enableChangeDataFeed = true:")
        if o.unsupported:
            print(f"  NOT SUPPORTED: the engine refuses CDF tables: {o.unsupported}")
            continue
        plain = o.baseline
        if o.cdf_overhead is not None and plain is not None:
            print(
                f"  engine {secs(o.seconds('engine'))} s with CDF vs {secs(plain.seconds('engine'))} s without: "
                f"overhead {o.cdf_overhead:.2f}x (target <= {o.workload.cdf_overhead_target:g}x): {verdict(o)}"
            )
        theirs, plain_theirs = o.seconds("deltars"), plain.seconds("deltars") if plain else None
        if theirs is not None and plain_theirs:
            ratio = o.ratio()
            print(
                f"  delta-rs {secs(theirs)} s with CDF vs {secs(plain_theirs)} s without: "
                f"{theirs / plain_theirs:.2f}x; engine/delta-rs with CDF: " + (f"{ratio:.2f}" if ratio else "-")
            )
        if o.change_counts:
            print(f"  change rows: engine {o.change_counts[0]}, delta-rs {o.change_counts[1]}")


def scale(outcomes: Sequence[Outcome], peers: Sequence[str]) -> None:
    """How each peer's time grows with the target's size, for the scale workload."""
    runs = sorted((o for o in outcomes if o.workload.key == SCALE_KEY), key=lambda o: o.rows)
    if len(runs) < 2:
        return
    small, large = runs[0], runs[-1]
    print()
    print(
        f"Scale (issue 20): 1,000 scattered upserts, {small.rows / 1e6:g}M -> {large.rows / 1e6:g}M target rows "
        f"({large.rows / small.rows:g}x the rows):"
    )
    for peer in peers:
        a, b = small.seconds(peer), large.seconds(peer)
        if a and b:
            print(f"  {PEER_NAMES[peer]:<15} {a:7.2f} s -> {b:7.2f} s: {b / a:.2f}x")
    ratio = large.ratio()
    if ratio and has_time_target(large):
        print(
            f"  at {large.rows / 1e6:g}M the engine is {1 / ratio:.2f}x as fast as delta-rs "
            f"(target at least 3x): {verdict(large)}"
        )


def problems(outcomes: Sequence[Outcome], ctx: Context) -> None:
    for o in outcomes:
        if not (o.problems or o.crashed):
            continue
        print()
        print(f"{_label(o, ctx)}:")
        for p in o.crashed:
            print(f"  CRASH {p}")
        for p in o.problems:
            print(f"  WRONG {p}")
