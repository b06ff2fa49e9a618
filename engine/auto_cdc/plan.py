"""The Spark SQL an AUTO CDC batch compiles to: its events, the merge source each SCD type needs, and the clauses of
the merges into the target and the tombstones table. docs/auto-cdc.md walks through it."""

from __future__ import annotations

from dataclasses import dataclass

from engine.auto_cdc.columns import Columns, Fields
from engine.auto_cdc.spec import DELETE_AT, END_AT, EVENT_AT, IS_DELETE, START_AT
from engine.delta.names import quote_identifier as q
from engine.spec import DeleteAction, InsertAction, MergeClause, UpdateAction

SEQ = "__cdc_seq"
DEL = "__cdc_del"
TRUNC = "__cdc_trunc"
TRUNCATED = "__cdc_truncated"
RESET = "__cdc_reset"
DROP = "__cdc_drop"
ALL_PRECEDING = "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"


@dataclass(frozen=True)
class Views:
    """The temporary views the compiled SQL reads: the batch, the target and the state table."""

    batch: str
    target: str
    state: str


def events_sql(columns: Columns, sequence: str, delete: str | None, truncate: str | None, batch: str) -> str:
    """One row per event: the kept columns, its sequence, whether it deletes its key and whether it truncates the
    table (a null condition is false: an upsert, as in Spark's AutoCDC)."""
    kept = ", ".join(q(c) for c in columns.kept)
    deletes = f"coalesce(({delete}), false)" if delete else "false"
    truncates = f"coalesce(({truncate}), false)" if truncate else "false"
    return f"SELECT {kept}, ({sequence}) AS {SEQ}, {deletes} AS {DEL}, {truncates} AS {TRUNC} FROM {q(batch)}"


def _marks(columns: Columns, views: Views) -> str:
    """The newest truncate: the table's mark in the tombstones table (the row whose keys are all null) or the
    batch's own."""
    no_key = " AND ".join(f"{q(k)} IS NULL" for k in columns.keys)
    return f"""marks AS (
  SELECT max(__cdc_mark) AS {TRUNCATED} FROM (
    SELECT {q(DELETE_AT)} AS __cdc_mark FROM {q(views.state)} WHERE {no_key}
    UNION ALL
    SELECT {SEQ} FROM e WHERE {TRUNC}
  )
)"""


def _after_truncate(alias: str) -> str:
    """An event that is not a truncate and not older than the newest one (an upsert at its sequence wins)."""
    return f"NOT {alias}.{TRUNC} AND (marks.{TRUNCATED} IS NULL OR {alias}.{SEQ} >= marks.{TRUNCATED})"


def sequence_sql(expressions: tuple[str, ...], names: tuple[str, ...]) -> str:
    """One expression as it is; several as a struct compared field by field, in order."""
    if len(expressions) == 1:
        return expressions[0]
    fields = ", ".join(f"'{n}', ({e})" for n, e in zip(names, expressions, strict=True))
    return f"named_struct({fields})"


def _same(columns: Columns, column: str, left: str, right: str) -> str:
    """Whether two values of a value column are the same, nulls included (as JSON where Spark cannot compare)."""
    if column in columns.unordered:
        return f"to_json({left}) <=> to_json({right})"
    return f"{left} <=> {right}"


def _keys(columns: Columns, left: str, right: str) -> str:
    return " AND ".join(f"{left}.{q(k)} = {right}.{q(k)}" for k in columns.keys)


def _partition(columns: Columns, *extra: str) -> str:
    return ", ".join([*(q(k) for k in columns.keys), *extra])


def _filled(columns: Columns, order: str) -> str:
    """The value columns, each null-kept one as the last non-null value since the key's last delete (a struct's
    fields each so: the struct is null only while no event gave it a value)."""
    window = f"OVER (PARTITION BY {_partition(columns, '__cdc_seg')} ORDER BY {order} {ALL_PRECEDING})"

    def last(value: str, fields: Fields | None) -> str:
        # A delete's own values say nothing of the row: they never lend a value.
        latest = f"last(CASE WHEN NOT {DEL} THEN {value} END, true) {window}"
        if not fields:
            return latest
        inner = ", ".join(f"'{_quote_text(f)}', {last(f'{value}.{q(f)}', sub)}" for f, sub in fields.items())
        return f"CASE WHEN {latest} IS NULL THEN NULL ELSE named_struct({inner}) END"

    parts = [
        f"{last(q(c), columns.structs.get(c))} AS {q(c)}" if c in columns.null_kept else q(c) for c in columns.values
    ]
    return ", ".join([*(q(k) for k in columns.keys), *parts])


def kept_value(source: str, target: str, fields: Fields | None) -> str:
    """An update's value where a null keeps the row's: field by field in a struct, as Databricks' null updates
    reach nested fields."""
    if not fields:
        return f"coalesce({source}, {target})"
    inner = ", ".join(
        f"'{_quote_text(f)}', {kept_value(f'{source}.{q(f)}', f'{target}.{q(f)}', sub)}" for f, sub in fields.items()
    )
    return (
        f"CASE WHEN {source} IS NULL THEN {target} WHEN {target} IS NULL THEN {source} ELSE named_struct({inner}) END"
    )


def _quote_text(name: str) -> str:
    return name.replace("\\", "\\\\").replace("'", "\\'")


def scd1_source_sql(columns: Columns, events: str, views: Views) -> str:
    """Per key, the batch's newest event not older than the key's tombstone; ``__cdc_reset`` when a delete in the
    batch came before it (its nulls then keep nothing of the old row). Whether it is newer than the row the target
    holds is the merge's clauses' question, except where nulls keep values: then only events newer than that row
    may lend theirs, so the target's ``__START_AT`` is joined here."""
    keys = ", ".join(q(k) for k in columns.keys)
    order = f"{SEQ}, {DEL} DESC"  # at one sequence a delete comes first: the upsert wins
    current = ""
    newer = ""
    if columns.null_kept:
        current = (
            f"LEFT JOIN (SELECT {keys}, {q(START_AT)} AS __cdc_cur FROM {q(views.target)}) c "
            f"ON {_keys(columns, 'e', 'c')}"
        )
        newer = f"AND (c.__cdc_cur IS NULL OR e.{SEQ} > c.__cdc_cur OR (NOT e.{DEL} AND e.{SEQ} = c.__cdc_cur))"
    return f"""
WITH e AS ({events}),
{_marks(columns, views)},
eff AS (
  SELECT e.* FROM e CROSS JOIN marks
  LEFT JOIN (SELECT {keys}, {q(DELETE_AT)} AS __cdc_tomb FROM {q(views.state)}) d ON {_keys(columns, "e", "d")}
  {current}
  WHERE {_after_truncate("e")} AND (d.__cdc_tomb IS NULL OR e.{SEQ} >= d.__cdc_tomb) {newer}
),
seg AS (
  SELECT *, sum(CAST({DEL} AS INT)) OVER (PARTITION BY {keys} ORDER BY {order} {ALL_PRECEDING}) AS __cdc_seg
  FROM eff
),
filled AS (
  SELECT {_filled(columns, order)}, {SEQ}, {DEL}, __cdc_seg > 0 AS {RESET},
    row_number() OVER (PARTITION BY {keys} ORDER BY {SEQ} DESC, {DEL} ASC) AS __cdc_rank
  FROM seg
)
SELECT * EXCEPT (__cdc_rank) FROM filled WHERE __cdc_rank = 1
"""


def scd1_tombstones_sql(columns: Columns, events: str, views: Views) -> str:
    """Per key, the batch's newest event since the newest truncate (an upsert wins a tie): a delete raises the key's
    tombstone, an upsert as new as the tombstone drops it; and the batch's newest truncate as the row whose keys are
    all null. A delete older than the target's row is recorded too: the tombstone then filters only events the row
    already outdates."""
    keys = ", ".join(q(k) for k in columns.keys)
    nulls = ", ".join(f"NULL AS {q(k)}" for k in columns.keys)
    return f"""
WITH e AS ({events}),
{_marks(columns, views)}
SELECT {keys}, {SEQ}, {DEL} FROM (
  SELECT e.*, row_number() OVER (PARTITION BY {keys} ORDER BY {SEQ} DESC, {DEL} ASC) AS __cdc_rank
  FROM e CROSS JOIN marks WHERE {_after_truncate("e")}
) WHERE __cdc_rank = 1
UNION ALL
SELECT {nulls}, max({SEQ}), true FROM e WHERE {TRUNC} HAVING count(*) > 0
"""


Clauses = tuple[tuple[MergeClause, ...], tuple[MergeClause, ...], tuple[MergeClause, ...]]


def scd1_target_clauses(columns: Columns, truncated: str | None, absent: frozenset[str] = frozenset()) -> Clauses:
    """Matched and newer than the row: a delete removes it, an upsert overwrites it (an upsert wins a tie); not
    matched: an upsert inserts. With a truncate in the batch (``truncated``, its sequence as a literal), every row
    older than it goes, and no value of such a row is kept for a null. A row without a ``__START_AT`` (one the
    service did not write) is older than any event. ``absent``: value columns the table gains in this merge, whose
    old value is null."""
    start = f"target.{q(START_AT)}"
    older = f"({start} IS NULL OR {start} < {truncated})"
    reset = f"source.{RESET}" if truncated is None else f"(source.{RESET} OR {older})"
    updates = {}
    for c in columns.values:
        s, t = f"source.{q(c)}", f"target.{q(c)}"
        kept = c in columns.null_kept and c not in absent
        updates[q(c)] = f"CASE WHEN {reset} THEN {s} ELSE {kept_value(s, t, columns.structs.get(c))} END" if kept else s
    updates[q(START_AT)] = f"source.{SEQ}"
    inserts = {q(c): f"source.{q(c)}" for c in columns.kept}
    inserts[q(START_AT)] = f"source.{SEQ}"
    matched = (
        MergeClause(
            "matched", DeleteAction(), condition=f"source.{DEL} AND ({start} IS NULL OR source.{SEQ} > {start})"
        ),
        MergeClause(
            "matched",
            UpdateAction(set=updates),
            condition=f"NOT source.{DEL} AND ({start} IS NULL OR source.{SEQ} >= {start})",
        ),
    )
    not_matched = (MergeClause("notMatched", InsertAction(values=inserts), condition=f"NOT source.{DEL}"),)
    by_source = () if truncated is None else (MergeClause("notMatchedBySource", DeleteAction(), older),)
    return matched, not_matched, by_source


def scd1_tombstones_on(columns: Columns) -> str:
    """Keys compared null-safe: the truncate mark is the row whose keys are all null."""
    return " AND ".join(f"target.{q(k)} <=> source.{q(k)}" for k in columns.keys)


def scd1_tombstone_clauses(columns: Columns, truncated: str | None) -> Clauses:
    """A key's tombstone holds its newest delete; an upsert as new as it revives the key and drops it. A truncate
    raises the mark and drops the tombstones older than it (the mark covers them)."""
    matched = (
        MergeClause(
            "matched",
            UpdateAction(set={q(DELETE_AT): f"source.{SEQ}"}),
            condition=f"source.{DEL} AND source.{SEQ} > target.{q(DELETE_AT)}",
        ),
        MergeClause("matched", DeleteAction(), condition=f"NOT source.{DEL} AND source.{SEQ} >= target.{q(DELETE_AT)}"),
    )
    values = {q(k): f"source.{q(k)}" for k in columns.keys}
    values[q(DELETE_AT)] = f"source.{SEQ}"
    by_source: tuple[MergeClause, ...] = ()
    if truncated is not None:
        keyed = " AND ".join(f"target.{q(k)} IS NOT NULL" for k in columns.keys)
        by_source = (
            MergeClause("notMatchedBySource", DeleteAction(), f"{keyed} AND target.{q(DELETE_AT)} < {truncated}"),
        )
    return matched, (MergeClause("notMatched", InsertAction(values=values), condition=f"source.{DEL}"),), by_source


def scd2_source_sql(columns: Columns, events: str, views: Views) -> str:
    """The whole history of every key the batch names, recomputed from every event the key has had (the events
    table, the batch, and the versions the target holds, each read as the upsert that began it and, where it ended,
    a delete at its ``__END_AT``, which the next version's upsert beats: a table not created by the service has no
    events table); each target version it no longer has is marked ``__cdc_drop``."""
    keys = ", ".join(q(k) for k in columns.keys)
    values = ", ".join(q(c) for c in columns.values)
    vals = f", {values}" if values else ""
    tracked = " AND ".join(_same(columns, c, f"lag({q(c)}) OVER w", q(c)) for c in columns.tracked) or "true"
    same_version = f"coalesce(lag({DEL}) OVER w, true) OR NOT ({tracked})"
    return f"""
WITH e AS ({events}),
ks AS (SELECT DISTINCT {keys} FROM e),
ev AS (
  SELECT {keys}{vals}, {SEQ}, {DEL}, 2 AS __cdc_from FROM e
  UNION ALL
  SELECT {keys}{vals}, {q(EVENT_AT)}, {q(IS_DELETE)}, 1 FROM {q(views.state)} j
    LEFT SEMI JOIN ks ON {_keys(columns, "j", "ks")}
  UNION ALL
  SELECT {keys}{vals}, {q(START_AT)}, false, 0 FROM {q(views.target)} t
    LEFT SEMI JOIN ks ON {_keys(columns, "t", "ks")}
  UNION ALL
  SELECT {keys}{vals}, {q(END_AT)}, true, 0 FROM {q(views.target)} t
    LEFT SEMI JOIN ks ON {_keys(columns, "t", "ks")} WHERE t.{q(END_AT)} IS NOT NULL
),
one AS (
  SELECT * FROM (
    SELECT *, row_number() OVER (PARTITION BY {keys}, {SEQ} ORDER BY {DEL} ASC, __cdc_from DESC) AS __cdc_dup FROM ev
  ) WHERE __cdc_dup = 1
),
seg AS (
  SELECT *, sum(CAST({DEL} AS INT)) OVER (PARTITION BY {keys} ORDER BY {SEQ} {ALL_PRECEDING}) AS __cdc_seg FROM one
),
filled AS (SELECT {_filled(columns, SEQ)}, {SEQ}, {DEL} FROM seg),
marked AS (
  SELECT *, NOT {DEL} AND ({same_version}) AS __cdc_start FROM filled
  WINDOW w AS (PARTITION BY {keys} ORDER BY {SEQ})
),
ends AS (
  SELECT *,
    sum(CAST(__cdc_start AS INT)) OVER (PARTITION BY {keys} ORDER BY {SEQ} {ALL_PRECEDING}) AS __cdc_ver,
    lead({SEQ}) OVER w AS __cdc_next,
    coalesce(lead({DEL} OR __cdc_start) OVER w, true) AS __cdc_last
  FROM marked
  WINDOW w AS (PARTITION BY {keys} ORDER BY {SEQ})
),
versions AS (
  SELECT {keys}{vals}, min({SEQ}) OVER (PARTITION BY {keys}, __cdc_ver) AS {q(START_AT)},
    __cdc_next AS {q(END_AT)}, __cdc_last
  FROM ends WHERE NOT {DEL}
),
kept AS (SELECT {keys}{vals}, {q(START_AT)}, {q(END_AT)} FROM versions WHERE __cdc_last)
SELECT *, false AS {DROP} FROM kept
UNION ALL
SELECT {keys}{vals}, {q(START_AT)}, {q(END_AT)}, true FROM {q(views.target)} t
  LEFT SEMI JOIN ks ON {_keys(columns, "t", "ks")}
  LEFT ANTI JOIN kept k ON {_keys(columns, "t", "k")} AND t.{q(START_AT)} = k.{q(START_AT)}
"""


def scd2_target_clauses(columns: Columns, absent: frozenset[str] = frozenset()) -> Clauses:
    """Matched on key and ``__START_AT``: a dropped version is deleted, a changed one updated; new ones inserted.
    ``absent``: value columns the table gains in this merge, null in every row it holds."""
    same = " AND ".join(
        f"source.{q(c)} IS NULL" if c in absent else _same(columns, c, f"target.{q(c)}", f"source.{q(c)}")
        for c in (*columns.values, END_AT)
    )
    updates = {q(c): f"source.{q(c)}" for c in (*columns.values, END_AT)}
    inserts = {q(c): f"source.{q(c)}" for c in (*columns.kept, START_AT, END_AT)}
    matched = (
        MergeClause("matched", DeleteAction(), condition=f"source.{DROP}"),
        MergeClause("matched", UpdateAction(set=updates), condition=f"NOT ({same})"),
    )
    return matched, (MergeClause("notMatched", InsertAction(values=inserts), condition=f"NOT source.{DROP}"),), ()


def scd2_target_on(columns: Columns) -> str:
    return f"{_keys(columns, 'target', 'source')} AND target.{q(START_AT)} = source.{q(START_AT)}"


def scd2_events_sql(columns: Columns, events: str) -> str:
    """Every event of the batch, one per key and sequence (an upsert wins a tie): SCD 2 keeps them all, since a
    late event may fall anywhere in a key's history and the versions alone do not say which events made them."""
    keys = ", ".join(q(k) for k in columns.keys)
    return f"""
SELECT * EXCEPT (__cdc_rank) FROM (
  SELECT *, row_number() OVER (PARTITION BY {keys}, {SEQ} ORDER BY {DEL} ASC) AS __cdc_rank FROM ({events})
) WHERE __cdc_rank = 1
"""


def scd2_events_on(columns: Columns) -> str:
    return f"{_keys(columns, 'target', 'source')} AND target.{q(EVENT_AT)} = source.{SEQ}"


def scd2_events_clauses(columns: Columns) -> Clauses:
    """New events are recorded; an upsert replaces a delete recorded at its sequence (the upsert wins the tie)."""
    updates = {q(c): f"source.{q(c)}" for c in columns.values}
    updates[q(IS_DELETE)] = "false"
    values = {q(c): f"source.{q(c)}" for c in columns.kept}
    values[q(EVENT_AT)] = f"source.{SEQ}"
    values[q(IS_DELETE)] = f"source.{DEL}"
    matched = (
        MergeClause("matched", UpdateAction(set=updates), condition=f"target.{q(IS_DELETE)} AND NOT source.{DEL}"),
    )
    return matched, (MergeClause("notMatched", InsertAction(values=values)),), ()


def keys_on(columns: Columns) -> str:
    return _keys(columns, "target", "source")
