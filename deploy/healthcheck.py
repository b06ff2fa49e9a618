"""Container healthchecks, one per role (``merge-service-entrypoint health ROLE``). Each asks the process what it
needs to do its job, not merely whether it runs: exit 0 healthy, 1 not (the reason on stderr)."""

from __future__ import annotations

import json
import os
import socket
import sys
import urllib.request
from typing import Any

TIMEOUT = 4.0


def _json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
        return json.load(response)


def _master_url() -> str:
    return os.environ.get("SPARK_MASTER_WEBUI_URL", "http://spark-master:8080")


def spark_master() -> str | None:
    """The master is ALIVE (not STANDBY or RECOVERING) and answers on its web UI."""
    status = _json("http://127.0.0.1:8080/json/").get("status")
    return None if status == "ALIVE" else f"the Spark master is {status}"


def spark_worker() -> str | None:
    """This worker is registered with the master and ALIVE there (its web UI alone says nothing of the master)."""
    me = _json("http://127.0.0.1:8081/json/")
    workers = _json(f"{_master_url()}/json/").get("workers", [])
    for worker in workers:
        if worker.get("id") == me.get("id"):
            return None if worker.get("state") == "ALIVE" else f"the master sees this worker {worker.get('state')}"
    return f"not registered with the Spark master at {_master_url()}"


def spark_connect() -> str | None:
    """The Connect server's driver has its application running and the gRPC port accepts connections."""
    apps = _json("http://127.0.0.1:4040/api/v1/applications")
    if not apps:
        return "the Spark Connect driver has no application"
    with socket.create_connection(("127.0.0.1", 15002), timeout=TIMEOUT):
        pass
    return None


def _ready(port: int) -> str | None:
    """/readyz answers 200 (job database reachable, schema at head and, for workers, Spark able to run tasks)."""
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=TIMEOUT).close()
    except urllib.error.HTTPError as exc:
        return f"/readyz: {exc.code} {exc.read().decode(errors='replace')}"
    return None


CHECKS = {
    "spark-master": spark_master,
    "spark-worker": spark_worker,
    "spark-connect": spark_connect,
    "api": lambda: _ready(int(os.environ.get("PORT", "8000"))),
    "worker": lambda: _ready(int(os.environ.get("MERGE_SERVICE_WORKER_PORT", "8001"))),
}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in CHECKS:
        print(f"usage: health {{{','.join(CHECKS)}}}", file=sys.stderr)
        return 2
    try:
        problem = CHECKS[argv[0]]()
    except (OSError, ValueError) as exc:
        problem = f"{exc.__class__.__name__}: {exc}"
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
