"""``merge-service submit|wait|status|cancel|list`` as scripts run them, against a real ``merge-service serve``:
one exit code per outcome."""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from service.client import Job, MergeClient, merge, rows_source
from service.client_cli import (
    EXIT_CANCELLED,
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_REFUSED,
    EXIT_SUCCEEDED,
    EXIT_TIMED_OUT,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Progress,
)
from tests.service.client_service import SCHEMA, Service, free_port, run_cli, running_service

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, spark_remote: str) -> Iterator[Service]:
    yield from running_service(tmp_path_factory.mktemp("cli"), spark_remote)


def upsert(target: str, key: int) -> dict[str, object]:
    source = rows_source([{"id": key, "name": f"v{key}"}], SCHEMA)
    builder = merge(target, source, "t.id = s.id", target_alias="t", source_alias="s")
    return builder.when_matched_update_all().when_not_matched_insert_all().to_spec()


def test_submit_from_stdin_with_wait_succeeds(service: Service) -> None:
    target = service.table("stdin")
    done = run_cli("submit", "-", "--wait", url=service.url, stdin=json.dumps(upsert(target, 4)))
    assert done.returncode == EXIT_SUCCEEDED, done.stderr
    job = json.loads(done.stdout)
    assert job["status"] == "succeeded" and job["result"]["num_inserted_rows"] == 1
    assert "succeeded done" in done.stderr  # the plain progress lines, not a terminal
    status = run_cli("status", job["id"], url=service.url)
    assert status.returncode == EXIT_SUCCEEDED and json.loads(status.stdout)["id"] == job["id"]
    listed = run_cli("list", "--target", target, "--status", "succeeded", url=service.url)
    assert listed.returncode == EXIT_SUCCEEDED and listed.stdout.split("\t")[0] == job["id"]
    assert DeltaTable(target).version() == 1


def test_sql_from_a_file_that_fails_exits_failed(service: Service, tmp_path: Path) -> None:
    """A file named like a statement (``merge.sql``, relative) is read, not sent as the statement."""
    target = service.table("sqlfile")
    (tmp_path / "merge.sql").write_text(
        f"MERGE INTO delta.`{target}` AS t USING (SELECT 1 AS id) AS s ON t.id = s.nope WHEN MATCHED THEN DELETE"
    )
    done = run_cli("submit", "--sql", "merge.sql", "--wait", url=service.url, cwd=tmp_path)
    assert done.returncode == EXIT_FAILED, done.stderr
    assert json.loads(done.stdout)["error"]["type"] == "urn:merge-service:problem:merge-resolution"


def test_sql_text_that_opens_with_a_comment_is_the_statement(service: Service) -> None:
    target = service.table("sqlcomment")
    sql = f"-- nightly\nMERGE INTO delta.`{target}` AS t USING (SELECT 7 AS id, 'x' AS name) AS s ON t.id = s.id "
    done = run_cli("submit", "--sql", sql + "WHEN NOT MATCHED THEN INSERT *", "--wait", url=service.url)
    assert done.returncode == EXIT_SUCCEEDED, done.stderr
    assert json.loads(done.stdout)["result"]["num_inserted_rows"] == 1


def test_arguments_that_make_no_request_exit_usage(service: Service, tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text("{}")
    for args in (("submit", str(spec), "--sql", "MERGE INTO t"), ("submit",), ("list", "--limit", "0")):
        done = run_cli(*args, url=service.url)
        assert done.returncode == EXIT_USAGE, (args, done.stderr)
        assert done.stderr.strip(), args
    missing = run_cli("submit", "--sql", "nightly.sql", url=service.url, cwd=tmp_path)
    assert missing.returncode == EXIT_ERROR and "nightly.sql" in missing.stderr


def test_refused_unknown_and_unreachable_exit_codes(service: Service) -> None:
    refused = run_cli("submit", "--sql", "MERGE INTO nowhere", url=service.url)
    assert refused.returncode == EXIT_REFUSED
    assert "urn:merge-service:problem:" in refused.stderr
    missing = run_cli("status", "01ARZ3NDEKTSV4RRFFQ69G5FAV", url=service.url)
    assert missing.returncode == EXIT_ERROR and "job-not-found" in missing.stderr
    gone = run_cli("status", "01ARZ3NDEKTSV4RRFFQ69G5FAV", url=f"http://127.0.0.1:{free_port()}")
    assert gone.returncode == EXIT_UNREACHABLE and "cannot be reached" in gone.stderr


@pytest.fixture(scope="module")
def idle_service(tmp_path_factory: pytest.TempPathFactory, spark_remote: str) -> Iterator[Service]:
    """A service with no merge worker: what it queues stays queued, whatever the machine's speed."""
    yield from running_service(tmp_path_factory.mktemp("cli-idle"), spark_remote, MERGE_SERVICE_WORKERS="0")


def test_wait_timeout_cancel_and_cancelled_exit_codes(idle_service: Service) -> None:
    target = idle_service.table("cancel")
    with MergeClient(idle_service.url) as client:
        queued, cancelled_job = (client.submit(upsert(target, 10 + n)).id for n in range(2))
    timed_out = run_cli("wait", queued, "--timeout", "0.1", url=idle_service.url)
    assert timed_out.returncode == EXIT_TIMED_OUT, timed_out.stderr
    assert json.loads(run_cli("status", queued, url=idle_service.url).stdout)["status"] == "queued"
    assert run_cli("cancel", cancelled_job, url=idle_service.url).returncode == EXIT_SUCCEEDED
    cancelled = run_cli("wait", cancelled_job, url=idle_service.url)
    assert cancelled.returncode == EXIT_CANCELLED, cancelled.stderr
    assert DeltaTable(target).version() == 0


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_redraws_one_line_on_a_terminal_and_prints_changes_otherwise() -> None:
    base = {"id": "J", "target": "/t", "attempts": 1}
    states = [
        Job.from_json({**base, "status": "running", "phase": "writing"}),
        Job.from_json({**base, "status": "running", "phase": "writing"}),
        Job.from_json({**base, "status": "succeeded", "phase": "done", "metrics": {"numSourceRows": 7}}),
    ]
    terminal, plain = Terminal(), io.StringIO()
    for out in (terminal, plain):
        progress = Progress(out)
        for job in states:
            progress(job)
    assert terminal.getvalue().count("\r\x1b[2K") == 3 and terminal.getvalue().count("\n") == 1
    assert terminal.getvalue().endswith("rows=7\n")
    assert [line.split()[1:3] for line in plain.getvalue().splitlines()] == [
        ["running", "writing"],
        ["succeeded", "done"],
    ]


def test_the_readme_one_command_merge(service: Service) -> None:
    readme = (ROOT / "README.md").read_text()
    command = next(line for line in readme.splitlines() if line.startswith(".venv/bin/merge-service submit"))
    cwd = service.home.lake / "readme-cli"
    table = cwd / "var" / "lake" / "demo" / "customers"
    data = pa.table(
        {"id": pa.array([1, 2, 3], pa.int64()), "name": ["Ada", "Grace", "Edsger"], "city": ["L", "A", "N"]}
    )
    write_deltalake(str(table), data)
    env = {**os.environ, "MERGE_SERVICE_URL": service.url, "PYTHONPATH": str(ROOT)}
    command = command.replace(".venv/bin/merge-service", f"{shlex.quote(sys.executable)} -m service.cli", 1)
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_SUCCEEDED, done.stderr
    assert json.loads(done.stdout)["result"]["num_inserted_rows"] == 1
    assert sorted(r["id"] for r in DeltaTable(str(table)).to_pyarrow_table().to_pylist()) == [1, 2, 3, 4]
