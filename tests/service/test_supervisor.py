"""``merge-service api`` with several processes: when one dies, the supervisor says why and replaces it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from service.supervisor import HEALTH_PING_SECONDS
from tests.service.conftest import wait_until


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Api:
    """A real ``merge-service api --api-processes 2`` on a migrated SQLite job table; its log lines collected."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = _free_port()
        env = {
            **os.environ,
            "MERGE_SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'jobs.db'}",
            "MERGE_SERVICE_LAKE_ROOTS": str(tmp_path),
            "MERGE_SERVICE_ACCESS_LOG": "false",
        }
        cli = [sys.executable, "-m", "service.cli"]
        subprocess.run([*cli, "migrate"], env=env, check=True, capture_output=True)
        self.proc = subprocess.Popen(
            [*cli, "api", "--api-processes", "2", "--port", str(self.port)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def children(self) -> list[int]:
        """The API processes (multiprocessing's spawned children, not its resource tracker)."""
        kids = psutil.Process(self.proc.pid).children()
        return sorted(k.pid for k in kids if "spawn_main" in " ".join(k.cmdline()))

    def wait_for_log(self, predicate: Callable[[], object], what: str, timeout: float) -> None:
        """Wait for ``predicate``; when it never holds, fail with ``what`` and everything the API logged."""
        try:
            wait_until(predicate, timeout=timeout, interval=0.1)
        except AssertionError:
            raise AssertionError(f"no line says {what}; the API logged:\n{''.join(self.lines)}") from None

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    server = Api(tmp_path)
    try:
        wait_until(lambda: server.answers() and len(server.children()) == 2, timeout=90, interval=0.2)
        yield server
    finally:
        server.stop()


def test_a_killed_api_process_is_logged_with_its_cause_and_replaced(api: Api) -> None:
    victim = api.children()[0]
    os.kill(victim, signal.SIGKILL)

    def logged() -> bool:
        return any(str(victim) in line and "was killed by SIGKILL" in line for line in api.lines)

    # The supervisor pings each live process in turn, each for up to HEALTH_PING_SECONDS, before it reaches the dead
    # one: on a loaded machine the log line may come that late.
    api.wait_for_log(logged, f"process {victim} was killed", timeout=2 * HEALTH_PING_SECONDS + 30)
    wait_until(lambda: len(api.children()) == 2 and victim not in api.children(), timeout=60, interval=0.2)
    deadline = time.monotonic() + 60
    while not api.answers():
        assert time.monotonic() < deadline, "the API stopped answering after one process died"
        time.sleep(0.2)


def test_a_process_killed_while_it_is_pinged_is_replaced_at_once_and_logged_as_killed(api: Api) -> None:
    victim = api.children()[-1]
    os.kill(victim, signal.SIGSTOP)  # it cannot answer a ping now
    time.sleep(2)  # the supervisor pings every half second: it is waiting on the victim's answer
    os.kill(victim, signal.SIGKILL)

    def about_victim() -> list[str]:
        return [line for line in api.lines if str(victim) in line and "starting another" in line]

    # Replaced as soon as it is gone: long before the ping it could not answer would have run out of time.
    api.wait_for_log(about_victim, f"process {victim} was replaced", timeout=HEALTH_PING_SECONDS / 2)
    [line] = about_victim()
    assert "was killed by SIGKILL" in line and "health ping" not in line, line
