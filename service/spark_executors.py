"""How many executors (and cores) the Spark Connect server's application has, read from its driver's REST API.

Spark Connect answers ``SELECT 1`` from the driver alone, so a cluster whose executors never registered (a
worker that cannot start them, too little free memory or cores) looks healthy until a merge waits forever for
its first task. The driver's monitoring API (``/api/v1/applications/<id>/executors``, on the web UI port) knows:
a worker asks it, and says so in /readyz and the ``merge_spark_executors`` metric."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

UI_PORT = 4040
TIMEOUT_SECONDS = 1.5
"""Well inside the readiness probe's timeout; a driver answers its API in milliseconds."""


def driver_ui_url(remote: str) -> str | None:
    """``sc://host:15002/;params`` -> ``http://host:4040``; None for an embedded (``local``) Spark."""
    if not remote.startswith("sc://"):
        return None
    host = urlsplit("http://" + remote.removeprefix("sc://").split("/", 1)[0]).hostname
    return f"http://{host}:{UI_PORT}" if host else None


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:
        return json.load(response)


def usable_executors(executors: list[dict[str, Any]]) -> int:
    """Active executors that can run tasks. In local mode the driver is the executor (it has cores); on a
    cluster the driver's entry has none and only the executors the cluster manager started count."""
    return sum(1 for e in executors if e.get("isActive", True) and int(e.get("totalCores", 0)) > 0)


def usable_cores(executors: list[dict[str, Any]]) -> int:
    """The cores of the usable executors: how many tasks the application runs at once."""
    return sum(int(e.get("totalCores", 0)) for e in executors if e.get("isActive", True))


def read_executors(remote: str, app_id: str) -> list[dict[str, Any]] | None:
    """The executors of application ``app_id`` (the session's ``spark.app.id``), or None when its driver's API
    cannot be read (an embedded Spark, a UI that is disabled, not reachable from here, or on another port because
    4040 was taken, so another application answers there): unknown is never reported as none."""
    base = driver_ui_url(remote)
    if base is None:
        return None
    try:
        executors = _get(f"{base}/api/v1/applications/{app_id}/executors")
        usable_executors(executors)  # a page of another shape is not an answer
        return list(executors)
    except (OSError, ValueError, KeyError, TypeError, urllib.error.URLError):
        return None


def count_executors(remote: str, app_id: str) -> int | None:
    """Usable executors of application ``app_id``, or None when its driver's API cannot be read."""
    executors = read_executors(remote, app_id)
    return None if executors is None else usable_executors(executors)


def local_master_cores(master: str | None, cpu_count: int | None) -> int | None:
    """The cores of a ``local``, ``local[N]`` or ``local[*]`` master (``cpu_count``: the server machine's, when
    known); None for a cluster's master, whose cores its executors tell."""
    if master is None:
        return None
    if master == "local":
        return 1
    match = re.fullmatch(r"local\[(\d+|\*)(?:,\s*\d+)?\]", master.strip())
    if match is None:
        return None
    return cpu_count if match.group(1) == "*" else int(match.group(1))
