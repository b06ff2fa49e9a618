"""How many executors the Spark Connect server's application has, read from its driver's REST API.

Spark Connect answers ``SELECT 1`` from the driver alone, so a cluster whose executors never registered (a
worker that cannot start them, too little free memory or cores) looks healthy until a merge waits forever for
its first task. The driver's monitoring API (``/api/v1/applications/<id>/executors``, on the web UI port) knows:
a worker asks it, and says so in /readyz and the ``merge_spark_executors`` metric."""

from __future__ import annotations

import json
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


def count_executors(remote: str, app_id: str) -> int | None:
    """Usable executors of application ``app_id`` (the session's ``spark.app.id``), or None when its driver's API
    cannot be read (an embedded Spark, a UI that is disabled, not reachable from here, or on another port because
    4040 was taken, so another application answers there): unknown is never reported as zero."""
    base = driver_ui_url(remote)
    if base is None:
        return None
    try:
        return usable_executors(_get(f"{base}/api/v1/applications/{app_id}/executors"))
    except (OSError, ValueError, KeyError, TypeError, urllib.error.URLError):
        return None
