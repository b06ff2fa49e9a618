"""The client half of ``merge-service``: ``submit``, ``wait``, ``status``, ``cancel``, ``list`` against a running
service, through ``service.client``. Exit codes are for scripts (``docs/client.md``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from service.client import (
    DEFAULT_URL,
    Job,
    MergeClient,
    MergeServiceError,
    RefusedError,
    UnavailableError,
    WaitTimeoutError,
)

EXIT_SUCCEEDED = 0
EXIT_USAGE = 2  # as argparse exits on arguments it cannot parse
EXIT_FAILED = 3
EXIT_CANCELLED = 4
EXIT_TIMED_OUT = 5
EXIT_REFUSED = 6
EXIT_UNREACHABLE = 7
EXIT_ERROR = 8  # any other answer: 401, 404, 409...
EXIT_UNFINISHED = 9  # `status` of a job still queued or running
EXIT_BY_STATUS = {"succeeded": EXIT_SUCCEEDED, "failed": EXIT_FAILED, "cancelled": EXIT_CANCELLED}
COMMANDS = ("submit", "wait", "status", "cancel", "list")
# Read by the client commands, not by the service: they say where the service is and who calls it.
ENV_URL = "MERGE_SERVICE_URL"
ENV_TOKEN = "MERGE_SERVICE_TOKEN"
CLIENT_VARIABLES = frozenset({ENV_URL, ENV_TOKEN})


def add_parsers(sub: Any) -> None:
    """The client subcommands, for ``service.cli.build_parser``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=None, help=f"the service (default: MERGE_SERVICE_URL, else {DEFAULT_URL})")
    common.add_argument("--token", default=None, help="bearer token (default: MERGE_SERVICE_TOKEN)")
    waiting = argparse.ArgumentParser(add_help=False)
    waiting.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait (default 3600)")

    submit = sub.add_parser("submit", parents=[common, waiting], help="submit a merge (JSON spec or SQL)")
    submit.add_argument("file", nargs="?", help='a JSON body (structured spec or {"sql": ...}); - for stdin')
    submit.add_argument("--sql", metavar="TEXT|FILE", help="the merge as MERGE INTO text, or a file holding it")
    submit.add_argument("--idempotency-key", default=None, help="default: a fresh key per invocation")
    submit.add_argument("--wait", action="store_true", help="wait for the job to end; exit as it ends")
    wait = sub.add_parser("wait", parents=[common, waiting], help="wait for a job to end; exit as it ends")
    wait.add_argument("id")
    for name, text in (("status", "print a job"), ("cancel", "cancel a job")):
        sub.add_parser(name, parents=[common], help=text).add_argument("id")
    listing = sub.add_parser("list", parents=[common], help="list jobs, newest first")
    listing.add_argument("--status", choices=["queued", "running", "succeeded", "failed", "cancelled"])
    listing.add_argument("--target", default=None)
    listing.add_argument("--limit", type=_positive, default=50, help="at most this many jobs (default 50)")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


class UsageError(Exception):
    """Arguments argparse accepts but that cannot make a request together."""


def _read(name: str) -> str:
    return sys.stdin.read() if name == "-" else Path(name).read_text()


def _request(args: argparse.Namespace) -> Any:
    if args.sql is not None:
        if args.file is not None:
            raise UsageError("give a FILE or --sql, not both")
        return _sql_text(args.sql)
    if args.file is None:
        raise UsageError("give a FILE (- for stdin) or --sql")
    return json.loads(_read(args.file))


def _sql_text(value: str) -> str:
    """``--sql`` names a file when one is there (``merge.sql`` is a name, not a statement; ``-`` is stdin), else
    it is the statement. A value with no space in it cannot be a statement: it is a file, missing or not."""
    if value == "-" or Path(value).is_file() or not any(c.isspace() for c in value.strip()):
        return _read(value)
    return value


class Progress:
    """One line per change of phase; on a terminal, one line redrawn in place with the elapsed time."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.start = time.monotonic()
        self.last: tuple[str, str] | None = None

    def __call__(self, job: Job) -> None:
        elapsed = time.monotonic() - self.start
        rows = (job.metrics or {}).get("numSourceRows")
        line = f"{job.id} {job.status} {job.phase} {elapsed:.0f}s" + (f" rows={rows}" if rows is not None else "")
        if self.tty:
            self.out.write("\r\x1b[2K" + line + ("\n" if job.finished else ""))
        elif self.last != (job.status, job.phase):
            self.out.write(line + "\n")
        self.last = (job.status, job.phase)
        self.out.flush()


def _print_job(job: Job) -> None:
    print(json.dumps(job.raw, indent=2))


def _wait(client: MergeClient, job_id: str, timeout: float) -> int:
    job = client.wait(job_id, timeout=timeout, raise_on_failure=False, on_poll=Progress(sys.stderr))
    _print_job(job)
    return EXIT_BY_STATUS[job.status]


def _run(args: argparse.Namespace, client: MergeClient) -> int:
    if args.command == "submit":
        handle = client.submit(_request(args), idempotency_key=args.idempotency_key)
        if args.wait:
            return _wait(client, handle.id, args.timeout)
        _print_job(handle.job)
        return EXIT_SUCCEEDED
    if args.command == "wait":
        return _wait(client, args.id, args.timeout)
    if args.command == "status":
        job = client.get(args.id)
        _print_job(job)
        return EXIT_BY_STATUS.get(job.status, EXIT_UNFINISHED)
    if args.command == "cancel":
        _print_job(client.cancel(args.id))
        return EXIT_SUCCEEDED
    jobs = client.list(status=args.status, target=args.target, limit=min(args.limit, 200))
    for n, job in enumerate(jobs):
        if n >= args.limit:
            break
        print(f"{job.id}\t{job.status}\t{job.phase}\t{job.raw.get('submitted_at')}\t{job.target}")
    return EXIT_SUCCEEDED


def main(args: argparse.Namespace) -> int:
    """Run one client subcommand; map each outcome to its exit code, with the problem on stderr."""
    url = args.url or os.environ.get(ENV_URL) or DEFAULT_URL
    token = args.token or os.environ.get(ENV_TOKEN) or None
    try:
        with MergeClient(url, token) as client:
            return _run(args, client)
    except UsageError as exc:
        print(f"merge-service {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except WaitTimeoutError as exc:
        print(f"\nmerge-service: {exc}", file=sys.stderr)
        return EXIT_TIMED_OUT
    except MergeServiceError as exc:
        print(f"merge-service: {exc}", file=sys.stderr)
        if exc.problem:
            print(json.dumps(exc.problem, indent=2), file=sys.stderr)
        if isinstance(exc, RefusedError):
            return EXIT_REFUSED
        if isinstance(exc, UnavailableError):
            return EXIT_UNREACHABLE
        return EXIT_ERROR
    except (OSError, ValueError) as exc:
        print(f"merge-service: {exc}", file=sys.stderr)
        return EXIT_ERROR
