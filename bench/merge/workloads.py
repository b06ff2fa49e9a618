"""Which merges the bench runs, the keys each one's source holds, and what a correct merge must report.

Target ids are the even numbers ``0, 2, ..., 2*(rows-1)``; "new" keys are odd, so they fall between existing keys
all over the key range instead of after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Kind = Literal["upsert", "insert", "delete"]

SCALE_KEY = "6"
"""The scale workload: 1,000 scattered upserts, at every size of ``--scale-rows``."""
SCALE_TARGET_ROWS = 20_000_000
"""The scale workload's target (at least 3x as fast as delta-rs) is set at this size and above; smaller sizes show
how each peer's time grows."""


@dataclass(frozen=True)
class Workload:
    key: str
    title: str
    kind: Kind
    target_ratio: float | None
    """The engine's time over delta-rs's, at most."""
    max_files_touched: int | None = None
    cdf: bool = False
    cdf_overhead_target: float | None = None
    """For the CDF variant: its engine time over the engine's time for the same merge without CDF."""
    dv: bool = False
    """The engine (and Delta on Spark) merge a copy with deletion vectors enabled; delta-rs the plain table."""

    @property
    def data_key(self) -> str:
        """The workload whose source keys this one merges: the variants share the plain workload's data."""
        return self.key.rstrip("cv") if self.key != SCALE_KEY else "2"


def _dv(w: Workload, target_ratio: float) -> Workload:
    return Workload(f"{w.key}v", f"{w.title}, deletion vectors", w.kind, target_ratio, w.max_files_touched, dv=True)


_PLAIN = (
    Workload("1", "upsert, random keys", "upsert", 3.0),
    Workload("2", "upsert, random keys (small)", "upsert", 4.0),
    Workload("3", "upsert, newest 5% of keys", "upsert", 3.0, max_files_touched=2),
    Workload("4", "insert-only, new keys", "insert", 2.0),
    Workload("5", "delete 1% by key", "delete", 3.0),
)

WORKLOADS: dict[str, Workload] = {
    w.key: w
    for w in (
        *_PLAIN,
        Workload("1c", "upsert, random keys, CDF on", "upsert", None, cdf=True, cdf_overhead_target=1.5),
        # Issue 20: merge-on-read against delta-rs's copy-on-write of the same data.
        *(_dv(w, 0.5 if w.kind == "delete" else 1.0) for w in _PLAIN),
        Workload(SCALE_KEY, "scale: 1,000 scattered upserts, deletion vectors", "upsert", 1 / 3, dv=True),
    )
}


@dataclass
class Expected:
    source_rows: int
    updated: int = 0
    inserted: int = 0
    deleted: int = 0


def sample(rng: np.random.Generator, population: int, n: int) -> np.ndarray:
    return rng.choice(population, size=min(n, population), replace=False).astype(np.int64)


def source_keys(workload: Workload, rows: int, rng: np.random.Generator) -> tuple[np.ndarray, Expected]:
    """Source ids for a workload, and the counts a correct merge must report."""
    key = workload.data_key
    if key in ("1", "2"):
        n = min(1000, rows) if key == "2" else max(rows // 10, 1)
        existing = 2 * sample(rng, rows, n // 2)
        new = 2 * sample(rng, rows, n - len(existing)) + 1
    elif key == "3":
        n = max(rows // 10, 1)
        first = rows - max(rows // 20, 1)  # index of the first row in the newest 5% of the key range
        existing = 2 * (first + sample(rng, rows - first, n // 2))
        new = 2 * (first + sample(rng, rows - first, n - len(existing))) + 1
    elif key == "4":
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
