"""Which engine runs a job, chosen per job (``"engine"`` in the body) or by the deployment
(``MERGE_SERVICE_DEFAULT_ENGINE``): the service's own (``builtin``, docs/engine.md), or Delta Lake's own
``MERGE INTO`` on the Spark Connect cluster's Delta (``delta``). Both run on the same queue, in the same per-table
order, under the same leases, fencing, cancel and ``txn``; only the call that merges differs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, get_args

import engine
from service.errors import RequestValidationProblem
from service.schemas import EngineName

ENGINES: tuple[str, ...] = get_args(EngineName)
DEFAULT_ENGINE: EngineName = "builtin"


def chosen_engine(requested: str | None, default: str) -> str:
    """The job's engine: the body's, else the deployment's default."""
    return requested or default


def check_engine(name: str, *, dry_run: bool, auto_cdc: bool = False) -> None:
    """What one engine cannot do is refused at submission, by name."""
    if name == "delta" and auto_cdc:
        raise RequestValidationProblem(
            "engine",
            "engine: AUTO CDC batches run on the builtin engine (its two merges share the job's txn); submit it "
            'with "engine": "builtin".',
        )
    if name == "delta" and dry_run:
        raise RequestValidationProblem(
            "dry_run",
            "dry_run: Delta's MERGE INTO has no dry run (it always commits what it computes); "
            'submit the dry run with "engine": "builtin".',
        )


def stored_body(body: dict[str, Any], name: str) -> dict[str, Any]:
    """The body kept with the job names its engine, the deployment's default filled in; a builtin job's body is
    stored as it was before engines could be chosen, so an Idempotency-Key replayed across that change still
    matches."""
    stored = {k: v for k, v in body.items() if k != "engine"}
    if name != DEFAULT_ENGINE:
        stored["engine"] = name
    return stored


def stored_engine(stored: dict[str, Any]) -> str:
    """The engine of a stored body: bodies stored before engines could be chosen ran on the builtin one."""
    return str(stored.get("engine") or DEFAULT_ENGINE)


def merge_function(name: str) -> Callable[..., Any]:
    """The engine call that runs a job; both take (spark, spec, txn=, on_progress=, dry_run=)."""
    return engine.run_delta_merge if name == "delta" else engine.run_merge


def all_metrics(name: str) -> bool:
    """Whether a job's result shows every metric the engine reports (the builtin engine's), or exactly those its
    commit recorded (Delta's, whose others show only in its UI)."""
    return name != "delta"


def commit_interruptible(name: str) -> bool:
    """Whether an attempt may be interrupted while it commits. Delta's MERGE is one statement that may commit at
    any moment, so its whole run counts as committing; after an interrupted statement the engine reads the log for
    the job's txn, so a cancel that came too late ends as the commit did, and one in time leaves the table
    unchanged. The builtin engine's commit is never interrupted."""
    return name == "delta"
