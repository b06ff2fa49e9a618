"""Real worker processes (``tests.service.proc_worker``) for the process tests, started and stopped as a group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcesses:
    """Worker processes on one job database, their ledger in ``ledger``; ``settings`` are further environment
    variables every one of them gets (``MERGE_SERVICE_*`` settings)."""

    def __init__(self, database_url: str, ledger: Path, settings: Mapping[str, str] | None = None) -> None:
        self.database_url = database_url
        self.ledger = ledger
        self.settings = dict(settings or {})
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *, crash_at: dict[str, str] | None = None, step: float = 0.0) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "MERGE_SERVICE_DATABASE_URL": self.database_url,
            "MERGE_SERVICE_LEASE_SECONDS": "1.5",
            "MERGE_SERVICE_HEARTBEAT_SECONDS": "0.3",
            "MERGE_SERVICE_POLL_INTERVAL_SECONDS": "0.02",
            **self.settings,
            "LEDGER_DIR": str(self.ledger),
            "CRASH_AT": json.dumps(crash_at or {}),
            "STEP_SECONDS": str(step),
        }
        proc = subprocess.Popen([sys.executable, "-m", "tests.service.proc_worker"], cwd=ROOT, env=env)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
