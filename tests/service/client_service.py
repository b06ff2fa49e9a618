"""What the client and CLI tests share: a real ``merge-service serve`` process (API and one worker) against the
run's Spark Connect server, on a fresh lake, and small Delta tables to merge into."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pyarrow as pa
from deltalake import write_deltalake

from tests.e2e.harness import Home, open_home, wait_for

SCHEMA = "id BIGINT, name STRING"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Service:
    url: str
    home: Home
    log: Path

    def table(self, name: str, rows: int = 3) -> str:
        """A Delta table of ``rows`` rows (ids 1..rows) under the lake, written by deltalake."""
        path = self.home.lake / name
        data = pa.table({"id": pa.array(range(1, rows + 1), pa.int64()), "name": [f"n{i}" for i in range(1, rows + 1)]})
        write_deltalake(str(path), data)
        return str(path)


def running_service(directory: Path, spark_remote: str, **env: str) -> Iterator[Service]:
    """``env``: more ``MERGE_SERVICE_*`` settings for the service process."""
    home = open_home(directory, spark_remote)
    port = free_port()
    settings = {"MERGE_SERVICE_WORKERS": "1", **env}
    proc, log = home.spawn([sys.executable, "-m", "service.cli", "serve", "--port", str(port)], "serve", **settings)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(ready, "merge-service serve ready", 120.0, alive_all=[proc], logs=[log])
        yield Service(url, home, log)
    finally:
        home.close()


def run_cli(
    *args: str, url: str, stdin: str | None = None, timeout: float = 120.0, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args, "--url", url],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or Path(__file__).resolve().parents[2],
    )
