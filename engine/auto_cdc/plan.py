"""The Spark SQL an AUTO CDC batch compiles to: its events, the merge source each SCD type needs, and the clauses of
the merges into the target and the tombstones table. docs/auto-cdc.md walks through it."""

from __future__ import annotations

from dataclasses import dataclass

from engine.auto_cdc.columns import Columns
from engine.auto_cdc.spec import DELETE_AT, END_AT, START_AT
from engine.delta.names import quote_identifier as q
from engine.spec import DeleteAction, InsertAction, MergeClause, UpdateAction

SEQ = "__cdc_seq"
DEL = "__cdc_del"
RESET = "__cdc_reset"
DROP = "__cdc_drop"
ALL_PRECEDING = "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"


@dataclass(frozen=True)
class Views:
    """The temporary views the compiled SQL reads: the batch, the target and the tombstones table."""

    batch: str
    target: str
    tombstones: str


def events_sql(columns: Columns, sequence: str, delete: str | None, batch: str) -> str:
    """One row per event: the kept columns, its sequence and whether it deletes its key (a null condition is an
    upsert, as in Spark's AutoCDC)."""
    kept = ", ".join(q(c) for c in columns.kept)
    deletes = f"coalesce(({delete}), false)" if delete else "false"
    return f"SELECT {kept}, ({sequence}) AS {SEQ}, {deletes} AS {DEL} FROM {q(batch)}"


def sequence_sql(expressions: tuple[str, ...], names: tuple[str, ...]) -> str:
    """One expression as it is; several as a struct compared field by field, in order."""
    if len(expressions) == 1:
        return expressions[0]
    fields = ", ".join(f"'{n}', ({e})" for n, e in zip(names, expressions, strict=True))
    return f"named_struct({fields})"


def _keys(columns: Columns, left: str, right: str) -> str:
    return " AND ".join(f"{left}.{q(k)} = {right}.{q(k)}" for k in columns.keys)


def _partition(columns: Columns, *extra: str) -> str:
    return ", ".join([*(q(k) for k in columns.keys), *extra])


def _filled(columns: Columns, order: str) -> str:
    """The value columns, each null-kept one as the last non-null value since the key's last delete."""
    parts = []
    for c in columns.values:
        if c in columns.null_kept:
            window = f"PARTITION BY {_partition(columns, '__cdc_seg')} ORDER BY {order} {ALL_PRECEDING}"
            parts.append(f"last({q(c)}, true) OVER ({window}) AS {q(c)}")
        else:
            parts.append(q(c))
    return ", ".join([*(q(k) for k in columns.keys), *parts])


def scd1_source_sql(columns: Columns, events: str, views: Views) -> str:
    """Per key, the batch's last event that is not older than the row the target holds or the key's tombstone;
    ``__cdc_reset`` when a delete in the batch came before it (its nulls then keep nothing of the old row)."""
    keys = ", ".join(q(k) for k in columns.keys)
    order = f"{SEQ}, {DEL} DESC"  # at one sequence a delete comes first: the upsert wins
    return f"""
WITH e AS ({events}),
eff AS (
  SELECT e.* FROM e
  LEFT JOIN (SELECT {keys}, {q(START_AT)} AS __cdc_cur FROM {q(views.target)}) c ON {_keys(columns, "e", "c")}
  LEFT JOIN (SELECT {keys}, {q(DELETE_AT)} AS __cdc_tomb FROM {q(views.tombstones)}) d ON {_keys(columns, "e", "d")}
  WHERE (d.__cdc_tomb IS NULL OR e.{SEQ} >= d.__cdc_tomb)
    AND (c.__cdc_cur IS NULL OR e.{SEQ} > c.__cdc_cur OR (NOT e.{DEL} AND e.{SEQ} = c.__cdc_cur))
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


def scd1_target_clauses(columns: Columns) -> tuple[tuple[MergeClause, ...], tuple[MergeClause, ...]]:
    """Matched: a delete removes the row, an upsert overwrites it; not matched: an upsert inserts."""
    updates = {}
    for c in columns.values:
        s, t = f"source.{q(c)}", f"target.{q(c)}"
        updates[q(c)] = (
            f"CASE WHEN source.{RESET} THEN {s} ELSE coalesce({s}, {t}) END" if c in columns.null_kept else s
        )
    updates[q(START_AT)] = f"source.{SEQ}"
    inserts = {q(c): f"source.{q(c)}" for c in columns.kept}
    inserts[q(START_AT)] = f"source.{SEQ}"
    matched = (
        MergeClause("matched", DeleteAction(), condition=f"source.{DEL}"),
        MergeClause("matched", UpdateAction(set=updates)),
    )
    not_matched = (MergeClause("notMatched", InsertAction(values=inserts), condition=f"NOT source.{DEL}"),)
    return matched, not_matched


def scd1_tombstone_clauses(columns: Columns) -> tuple[tuple[MergeClause, ...], tuple[MergeClause, ...]]:
    """A key's tombstone holds its newest delete; an upsert as new as it revives the key and drops it."""
    matched = (
        MergeClause(
            "matched",
            UpdateAction(set={q(DELETE_AT): f"source.{SEQ}"}),
            condition=f"source.{DEL} AND source.{SEQ} > target.{q(DELETE_AT)}",
        ),
        MergeClause("matched", DeleteAction(), condition=f"NOT source.{DEL}"),
    )
    values = {q(k): f"source.{q(k)}" for k in columns.keys}
    values[q(DELETE_AT)] = f"source.{SEQ}"
    return matched, (MergeClause("notMatched", InsertAction(values=values), condition=f"source.{DEL}"),)


def scd2_source_sql(columns: Columns, events: str, views: Views) -> str:
    """The whole history of every key the batch names, recomputed from the versions the target holds, the key's
    tombstones and the batch's events; each target version it no longer has is marked ``__cdc_drop``."""
    keys = ", ".join(q(k) for k in columns.keys)
    values = ", ".join(q(c) for c in columns.values)
    vals = f", {values}" if values else ""
    nulls = "".join(f", NULL AS {q(c)}" for c in columns.values)
    tracked = " AND ".join(f"lag({q(c)}) OVER w <=> {q(c)}" for c in columns.tracked) or "true"
    same_version = f"coalesce(lag({DEL}) OVER w, true) OR NOT ({tracked})"
    return f"""
WITH e AS ({events}),
ks AS (SELECT DISTINCT {keys} FROM e),
ev AS (
  SELECT {keys}{vals}, {SEQ}, {DEL}, 1 AS __cdc_new FROM e
  UNION ALL
  SELECT {keys}{vals}, {q(START_AT)}, false, 0 FROM {q(views.target)} t
    LEFT SEMI JOIN ks ON {_keys(columns, "t", "ks")}
  UNION ALL
  SELECT {keys}{nulls}, {q(DELETE_AT)}, true, 0 FROM {q(views.tombstones)} d
    LEFT SEMI JOIN ks ON {_keys(columns, "d", "ks")}
),
one AS (
  SELECT * FROM (
    SELECT *, row_number() OVER (PARTITION BY {keys}, {SEQ} ORDER BY {DEL} ASC, __cdc_new DESC) AS __cdc_dup FROM ev
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


def scd2_target_clauses(columns: Columns) -> tuple[tuple[MergeClause, ...], tuple[MergeClause, ...]]:
    """Matched on key and ``__START_AT``: a dropped version is deleted, a changed one updated; new ones inserted."""
    same = " AND ".join(f"target.{q(c)} <=> source.{q(c)}" for c in (*columns.values, END_AT))
    updates = {q(c): f"source.{q(c)}" for c in (*columns.values, END_AT)}
    inserts = {q(c): f"source.{q(c)}" for c in (*columns.kept, START_AT, END_AT)}
    matched = (
        MergeClause("matched", DeleteAction(), condition=f"source.{DROP}"),
        MergeClause("matched", UpdateAction(set=updates), condition=f"NOT ({same})"),
    )
    return matched, (MergeClause("notMatched", InsertAction(values=inserts), condition=f"NOT source.{DROP}"),)


def scd2_target_on(columns: Columns) -> str:
    return f"{_keys(columns, 'target', 'source')} AND target.{q(START_AT)} = source.{q(START_AT)}"


def scd2_tombstones_sql(columns: Columns, events: str) -> str:
    """Every delete event of the batch: SCD 2 keeps them all, since a late upsert may fall before any of them."""
    keys = ", ".join(q(k) for k in columns.keys)
    return f"SELECT DISTINCT {keys}, {SEQ} FROM ({events}) WHERE {DEL}"


def scd2_tombstone_on(columns: Columns) -> str:
    return f"{_keys(columns, 'target', 'source')} AND target.{q(DELETE_AT)} = source.{SEQ}"


def scd2_tombstone_clauses(columns: Columns) -> tuple[MergeClause, ...]:
    values = {q(k): f"source.{q(k)}" for k in columns.keys}
    values[q(DELETE_AT)] = f"source.{SEQ}"
    return (MergeClause("notMatched", InsertAction(values=values)),)


def keys_on(columns: Columns) -> str:
    return _keys(columns, "target", "source")
