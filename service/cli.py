"""``merge-service``: serve (API and workers in one process), api, worker, migrate, demo; and, as a client of a
running service, submit, wait, status, cancel, list."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import structlog

from service import client_cli
from service.errors import DatabaseUnavailableError
from service.logs import configure_logging
from service.manager import JobManager
from service.metrics import ServiceMetrics
from service.settings import Settings, default_api_processes

log = structlog.get_logger("merge-service")
SCHEMA_WAIT_SECONDS = 60.0
# Shares of the lease that a stopping service gives to: open HTTP requests, running attempts finishing on their
# own, interrupted attempts reaching a safe point (at least ABANDON_MIN_SECONDS, for Spark to cancel what it
# runs), the embedded Spark server's exit. With the default 30 s lease the whole stop fits in the lease (a
# deployment's stop grace period); a job whose attempt is left running is taken back by another worker once its
# lease lapses, and its Delta txn keeps it from being applied twice.
HTTP_SHUTDOWN_SHARE = 0.1
DRAIN_SHARE = 0.35
ABANDON_SHARE = 0.2
ABANDON_MIN_SECONDS = 10.0
SPARK_STOP_SHARE = 0.15


def _manager(settings: Settings) -> JobManager:
    return JobManager.from_url(settings.database_url, lease_seconds=settings.lease_seconds)


def _wait_for_schema(manager: JobManager, timeout: float = SCHEMA_WAIT_SECONDS) -> None:
    """``api`` and ``worker`` do not migrate (a deployment runs ``migrate`` once); they wait for it instead."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if manager.schema_at_head():
                return
            why = "the job database is not at the newest migration (run `merge-service migrate`)"
        except DatabaseUnavailableError as exc:
            why = str(exc)
        if time.monotonic() > deadline:
            raise SystemExit(f"merge-service: {why}")
        log.info("waiting for the job database", reason=why)
        time.sleep(2.0)


def _serve_http(app: Any, host: str, port: int, settings: Settings, processes: int = 1) -> None:
    """Serve ``app`` here, or with ``processes`` > 1 start that many API processes on one listening socket, each
    building its app from the environment (``service.app:create_process_app``); this process then supervises
    them (restarts one that dies, stops them all on SIGTERM)."""
    import uvicorn

    from service.supervisor import HEALTH_PING_SECONDS, ApiSupervisor

    # log_config=None: uvicorn's loggers propagate to the root handler that ``configure_logging`` installed.
    options: dict[str, Any] = {
        "host": host,
        "port": port,
        "log_level": settings.log_level.lower(),
        "access_log": settings.access_log,
        "log_config": None,
        # At SIGTERM, requests still open after this are cut: the whole stop must fit in the lease.
        "timeout_graceful_shutdown": max(1, round(settings.lease_seconds * HTTP_SHUTDOWN_SHARE)),
    }
    if processes <= 1:
        uvicorn.Server(uvicorn.Config(app, **options)).run()
        return
    config = uvicorn.Config(
        "service.app:create_process_app",
        factory=True,
        workers=processes,
        timeout_worker_healthcheck=HEALTH_PING_SECONDS,
        **options,
    )
    ApiSupervisor(config, sockets=[config.bind_socket()]).run()


def cmd_migrate(settings: Settings) -> int:
    manager = _manager(settings)
    try:
        manager.migrate()
    finally:
        manager.dispose()
    log.info("job database at the newest migration")
    return 0


def _workers(settings: Settings, manager: JobManager, metrics: ServiceMetrics, count: int) -> list[Any]:
    from service.worker import Worker

    return [Worker(settings, manager=manager, metrics=metrics) for _ in range(count)]


def _stop(workers: list[Any], settings: Settings) -> None:
    """Stop within the lease: running attempts get part of it to finish, then are interrupted before their
    commit and handed back to the queue; then the Spark session closes and the embedded server stops."""
    from engine.spark_server import stop_embedded
    from service.worker import stop_workers

    lease = settings.lease_seconds
    try:
        stop_workers(workers, drain=lease * DRAIN_SHARE, abandon_after=max(ABANDON_MIN_SECONDS, lease * ABANDON_SHARE))
    finally:
        stop_embedded(timeout=lease * SPARK_STOP_SHARE)


def cmd_serve(
    settings: Settings, host: str, port: int, *, with_api: bool = True, migrate: bool = True, api_processes: int = 1
) -> int:
    """With several API processes, the merge workers run in this process, which supervises the API processes;
    their /readyz then answers for the job database only."""
    from service.app import create_app

    manager = _manager(settings)
    if migrate:
        manager.migrate()
    else:
        _wait_for_schema(manager)
    count = settings.workers if with_api else max(1, settings.workers)
    metrics = ServiceMetrics(workers=count > 0)
    workers = _workers(settings, manager, metrics, count)
    app = create_app(settings, manager=manager, metrics=metrics, workers=workers, include_merges=with_api)
    for worker in workers:
        worker.start()
    try:
        _serve_http(app, host, port, settings, api_processes if with_api else 1)
    finally:
        _stop(workers, settings)
        manager.dispose()
    return 0


def cmd_api(settings: Settings, host: str, port: int, processes: int = 1) -> int:
    from service.app import create_app

    manager = _manager(settings)
    _wait_for_schema(manager)
    if processes > 1:
        manager.dispose()
        _serve_http(None, host, port, settings, processes)
        return 0
    _serve_http(create_app(settings, manager=manager), host, port, settings)
    manager.dispose()
    return 0


def cmd_demo(settings: Settings, url: str) -> int:
    """A small Delta table under the first lake root, and the curl command that upserts into it."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    root = Path(settings.lake_roots[0]).resolve()
    table = root / "demo" / "customers"
    if (table / "_delta_log").is_dir():
        print(f"The demo table exists: {table} (version {DeltaTable(str(table)).version()})")
    else:
        table.mkdir(parents=True, exist_ok=True)
        data = pa.table(
            {
                "id": pa.array([1, 2, 3], pa.int64()),
                "name": ["Ada", "Grace", "Edsger"],
                "city": ["London", "Arlington", "Nuenen"],
            }
        )
        write_deltalake(str(table), data)
        print(f"Created the Delta table {table} with 3 rows (version 0).")
    body = {
        "target": str(table),
        "source": {
            "rows": [{"id": 2, "name": "Grace", "city": "New York"}, {"id": 4, "name": "Barbara", "city": "Boston"}],
            "schema": "id BIGINT, name STRING, city STRING",
        },
        "target_alias": "t",
        "source_alias": "s",
        "on": "t.id = s.id",
        "when_matched": [{"action": "update_all"}],
        "when_not_matched": [{"action": "insert_all"}],
    }
    # With tokens configured every request needs one; the command reads it from the client's variable.
    auth = (
        f' -H "Authorization: Bearer ${client_cli.ENV_TOKEN}"' if settings.api_tokens or settings.admin_tokens else ""
    )
    print("\nUpsert two rows (one update, one insert):\n")
    print(f"curl -s -X POST {url}/merges{auth} -H 'Content-Type: application/json' -d {shlex.quote(json.dumps(body))}")
    print(f"\nThen poll the job it answers:\n\ncurl -s{auth} {url}/merges/<id>")
    return 0


def demo_url(settings: Settings) -> str:
    """Where this deployment answers: the client's ``MERGE_SERVICE_URL``, else the configured host and port (a
    wildcard bind is reached on loopback)."""
    if url := os.environ.get(client_cli.ENV_URL):
        return url.rstrip("/")
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    return f"http://{f'[{host}]' if ':' in host else host}:{settings.port}"


def _install_sigterm() -> None:
    def _raise(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="merge-service", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text, port_setting in (
        ("serve", "the API and its workers in one process", "MERGE_SERVICE_PORT, else 8000"),
        ("api", "the API only", "MERGE_SERVICE_PORT, else 8000"),
        ("worker", "merge workers, with /healthz, /readyz and /metrics", "MERGE_SERVICE_WORKER_PORT, else 8001"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--host", default=None, help="default: MERGE_SERVICE_HOST, else 127.0.0.1")
        p.add_argument("--port", type=int, default=None, help=f"default: {port_setting}")
        if name != "worker":
            p.add_argument(
                "--api-processes",
                type=int,
                default=None,
                metavar="N",
                help="API server processes (default: MERGE_SERVICE_API_PROCESSES, else 1 for serve "
                "and one per CPU, at most 4, for api)",
            )
    sub.add_parser("migrate", help="bring the job database's schema up to date")
    demo = sub.add_parser("demo", help="create a small Delta table and print a merge to try")
    demo.add_argument(
        "--url", default=None, help="the service (default: MERGE_SERVICE_URL, else MERGE_SERVICE_HOST and _PORT)"
    )
    client_cli.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in client_cli.COMMANDS:
        return client_cli.main(args)
    settings = Settings()
    configure_logging(settings.log_level, json=settings.log_json)
    if args.command in ("serve", "api", "worker"):
        _install_sigterm()
    try:
        if args.command == "migrate":
            return cmd_migrate(settings)
        if args.command in ("serve", "api"):
            processes = next(
                n
                for n in (
                    args.api_processes,
                    settings.api_processes,
                    default_api_processes(args.command, settings.database_url),
                )
                if n is not None
            )
            if processes < 1:
                raise SystemExit("merge-service: --api-processes must be at least 1")
            host, port = args.host or settings.host, args.port or settings.port
            if args.command == "serve":
                return cmd_serve(settings, host, port, api_processes=processes)
            return cmd_api(settings, host, port, processes)
        if args.command == "worker":
            host, port = args.host or settings.host, args.port or settings.worker_port
            return cmd_serve(settings, host, port, with_api=False, migrate=False)
        if args.command == "demo":
            return cmd_demo(settings, args.url or demo_url(settings))
    except KeyboardInterrupt:
        return 0
    except DatabaseUnavailableError as exc:
        print(f"merge-service: {exc}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
