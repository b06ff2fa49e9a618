"""The command line: migrate, demo, and the API process started and stopped as a deployment would."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from deltalake import DeltaTable

from service.cli import main
from service.manager import JobManager


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "MERGE_SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'jobs.db'}",
        "MERGE_SERVICE_LAKE_ROOTS": str(tmp_path / "lake"),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_api(env: dict[str, str], *args: str, timeout: float = 90) -> tuple[subprocess.Popen[bytes], int]:
    """Migrate, start ``merge-service api`` as a deployment would, and wait until it answers /readyz with 200."""
    subprocess.run(
        [sys.executable, "-m", "service.cli", "migrate"], env=env, check=True, timeout=120, capture_output=True
    )
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "api", "--port", str(port), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc, port
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the API did not become ready:\n{proc.stdout.read().decode()}")  # type: ignore[union-attr]
        time.sleep(0.2)


def test_migrate_then_demo(tmp_path: Path, monkeypatch: object, capsys: object) -> None:
    for key, value in _env(tmp_path).items():
        if key.startswith("MERGE_SERVICE_"):
            monkeypatch.setenv(key, value)  # type: ignore[attr-defined]
    assert main(["migrate"]) == 0
    assert JobManager.from_url(f"sqlite:///{tmp_path / 'jobs.db'}").schema_at_head()
    assert main(["demo"]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    table = tmp_path / "lake" / "demo" / "customers"
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 3
    assert "curl -s -X POST http://127.0.0.1:8000/merges" in out and str(table) in out
    assert main(["demo"]) == 0  # a second run keeps the table


def test_demo_prints_commands_for_this_deployment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The printed commands reach the configured port and carry a token when the deployment asks for one."""
    for key, value in _env(tmp_path).items():
        if key.startswith("MERGE_SERVICE_"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("MERGE_SERVICE_PORT", "8611")
    monkeypatch.setenv("MERGE_SERVICE_API_TOKENS", "tok-a")
    monkeypatch.delenv("MERGE_SERVICE_URL", raising=False)
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    post = next(line for line in out.splitlines() if line.startswith("curl -s -X POST"))
    assert post.startswith(
        'curl -s -X POST http://127.0.0.1:8611/merges -H "Authorization: Bearer $MERGE_SERVICE_TOKEN"'
    )
    monkeypatch.setenv("MERGE_SERVICE_URL", "http://merges.internal:9000/")
    assert main(["demo"]) == 0
    assert "curl -s -X POST http://merges.internal:9000/merges " in capsys.readouterr().out


def test_api_process_waits_for_schema_serves_and_stops(tmp_path: Path) -> None:
    proc, port = _start_api(_env(tmp_path))
    try:
        listed = httpx.get(f"http://127.0.0.1:{port}/merges", timeout=5)
        assert listed.json() == {"items": [], "next_cursor": None}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_server_and_access_logs_are_json_lines(tmp_path: Path) -> None:
    proc, port = _start_api(_env(tmp_path))
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/merges/01NOSUCHJOB?x=1", timeout=5).status_code == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    lines = [line for line in proc.stdout.read().decode().splitlines() if line.strip()]  # type: ignore[union-attr]
    records = [json.loads(line) for line in lines]  # every line, uvicorn's included, is one JSON object
    assert all({"event", "level", "timestamp"} <= set(r) for r in records)
    server = [r for r in records if r.get("logger") == "uvicorn.error"]
    assert any("Started server process" in r["event"] for r in server)
    access = [r for r in records if r.get("logger") == "uvicorn.access"]
    assert {"method": "GET", "path": "/merges/01NOSUCHJOB?x=1", "status": 404, "http_version": "1.1"}.items() <= access[
        -1
    ].items()
    assert access[-1]["client"].startswith("127.0.0.1:")


def test_api_with_several_processes_serves_and_stops(tmp_path: Path) -> None:
    import psutil

    env = {**_env(tmp_path), "MERGE_SERVICE_ACCESS_LOG": "false"}
    (tmp_path / "lake" / "t").mkdir(parents=True)
    proc, port = _start_api(env, "--api-processes", "2")
    try:
        servers = [p for p in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(p.cmdline())]
        assert len(servers) == 2
        body = {
            "target": str(tmp_path / "lake" / "t"),
            "source": {"rows": [{"id": 1}], "schema": "id BIGINT"},
            "on": "target.id = source.id",
            "when_not_matched": [{"action": "insert_all"}],
        }
        ids = []
        for _ in range(20):  # new connections, so the kernel spreads them over both processes
            with httpx.Client() as client:
                submitted = client.post(f"http://127.0.0.1:{port}/merges", json=body, timeout=10)
                assert submitted.status_code == 202
                ids.append(submitted.json()["id"])
        with httpx.Client() as client:
            assert all(client.get(f"http://127.0.0.1:{port}/merges/{i}").status_code == 200 for i in ids)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in servers)
    out = proc.stdout.read().decode()  # type: ignore[union-attr]
    records = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert sum("Started server process" in r["event"] for r in records) == 2


@pytest.mark.parametrize(("cpus", "expected"), [(None, 1), (1, 1), (2, 2), (16, 4)])
def test_default_api_processes_follow_the_command_and_the_database(
    monkeypatch: pytest.MonkeyPatch, cpus: int | None, expected: int
) -> None:
    from service.settings import default_api_processes

    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    assert default_api_processes("serve", "postgresql://db/jobs") == 1
    assert default_api_processes("api", "sqlite:///var/jobs.db") == 1  # one writer at a time: no gain, longer tail
    assert default_api_processes("api", "postgresql://db/jobs") == expected  # one per CPU, at most 4
