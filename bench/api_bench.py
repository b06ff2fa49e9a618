"""API benchmark: request latency of ``POST /merges`` and ``GET /merges/{id}`` at a steady 200 requests/s, and the
time from submit to claim, on SQLite and on PostgreSQL (issue 5).

Per backend: a fresh job database (a SQLite file in a temp dir; a database on a throwaway PostgreSQL server started
the way the service tests start it), migrated; the real ``merge-service api`` command serving on 127.0.0.1 (its
default number of API processes unless ``--api-processes`` is given); one
worker process running the real ``Worker`` (default settings: 0.2 s poll interval) with a stand-in runner that
walks the engine's phases (each one a job-row update, as with the real engine) instead of running Spark. For the
claim run it returns at once, so submit-to-claim measures the queue, not Spark. For the POST and GET runs it takes
``--job-seconds`` (default 1 s) per job, as a real merge does (the engine's smallest merges take about 2 s here):
the worker claims, heartbeats and records outcomes against the same database at the pace of a real deployment,
instead of draining 200 jobs a second on the two cores the API is measured on.

Load is open-loop: request ``i`` is scheduled at ``start + i / rate`` whatever happened to the earlier ones, and
its latency is measured from that scheduled moment to the end of the response (so a stalled server or client
cannot hide its stall); the latency from the actual send is shown beside it. The load comes from a small keep-alive
HTTP/1.1 client (``LoadClient``) on uvloop rather than httpx, whose per-request CPU at this rate was larger than the
API's own and came out of the same two cores. "API CPU" is the CPU time of the API command and all its processes
over the run, per request. Runs:

  claim   submit-to-claim: jobs submitted at a steady ``--claim-rate`` (default 5/s) on an idle queue;
          ``started_at - submitted_at`` from the job rows, both stamped by the service.
  POST    ``--count`` (default 2,000) submissions at ``--rate`` (default 200/s) over 20 tables, the worker
          claiming and running them meanwhile.
  GET     ``--count`` reads of those jobs at ``--rate``.

Targets on the reference machine: POST p99 <= 25 ms, GET p99 <= 10 ms, submit-to-claim p50 <= 200 ms. A miss is
reported, not failed (requests that fail or time out are counted in the note): the exit code is 0 unless the
benchmark itself could not run.

    .venv/bin/python bench/api_bench.py [--backends sqlite,postgresql] [--rate 200] [--count 2000] [--api-processes N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import select  # noqa: E402

from service.jobs import ClaimedJob  # noqa: E402
from service.manager import JobManager  # noqa: E402
from service.models import jobs as jobs_table  # noqa: E402
from tests.e2e.harness import upsert_body, wait_ready  # noqa: E402
from tests.service import stand_in  # noqa: E402

BIN = Path(sys.executable).parent
TABLES = 20
PHASES = ("preparing_source", "finding_touched_files", "writing", "committing")
REQUEST_TIMEOUT = 30.0
JOB_SECONDS_ENV = "API_BENCH_JOB_SECONDS"
TARGETS = {"POST": ("p99", 25.0), "GET": ("p99", 10.0), "claim": ("p50", 200.0)}


# --- the worker process ------------------------------------------------------------------------------------------


@dataclass
class StandInResult:
    table_version: int | None = 1
    result: dict[str, int] = field(
        default_factory=lambda: {
            "num_affected_rows": 1,
            "num_updated_rows": 0,
            "num_deleted_rows": 0,
            "num_inserted_rows": 1,
        }
    )
    metrics: dict[str, int] = field(default_factory=lambda: {"numSourceRows": 1})
    already_applied: bool = False


class StandInRunner(stand_in.StandInRunner):
    """Reports the engine's phases (each one a job-row update, as with the real engine) over ``job_seconds``
    and succeeds."""

    def __init__(self, job_seconds: float = 0.0) -> None:
        self.job_seconds = job_seconds

    def run(self, job: ClaimedJob, *, txn: Any, on_progress: Callable[[str], None], tag: str) -> StandInResult:
        for phase in PHASES:
            on_progress(phase)
            if self.job_seconds:
                time.sleep(self.job_seconds / len(PHASES))
        return StandInResult()


def worker_main() -> int:
    """``api_bench.py --worker``: the real Worker on the ``MERGE_SERVICE_*`` settings, with the stand-in runner."""
    from service.logs import configure_logging
    from service.settings import Settings
    from service.worker import Worker

    configure_logging("WARNING")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    worker = Worker(Settings(), runner=StandInRunner(float(os.environ.get(JOB_SECONDS_ENV, "0"))))
    worker.start()
    stop.wait()
    worker.stop(timeout=5)
    return 0


# --- processes ---------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def database(backend: str, home: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{home / 'jobs.db'}"
        return
    from tests.service.conftest import PostgresServer  # the service tests' throwaway server

    server = PostgresServer()
    try:
        yield server.create_database()
    finally:
        server.stop()


# --- load -------------------------------------------------------------------------------------------------------


@dataclass
class Run:
    """Open-loop samples in seconds: from the scheduled moment, and from the actual send."""

    name: str
    from_schedule: list[float] = field(default_factory=list)
    from_send: list[float] = field(default_factory=list)
    send_lag: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sent: int = 0
    cpu: float = math.nan
    """CPU seconds the API process spent during the run."""
    send_span: float = 0.0
    """Seconds from the first send to the last: the offered rate is ``(sent - 1) / send_span``."""


class HttpError(Exception):
    """A request that got no complete HTTP answer (refused, reset, malformed, timed out)."""


@dataclass
class Response:
    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


class LoadClient:
    """A small HTTP/1.1 keep-alive client for the measured runs.

    httpx's connection pool spends more CPU per request than the API under test once a few hundred requests
    are in flight (several ms each, measured), and on a 2-core machine that CPU is taken from the server being
    measured. This client does only what the runs need: up to ``max_connections`` keep-alive connections to one
    server, a request with a JSON or empty body, and a Content-Length (or chunked) answer. Waiting for a free
    connection is part of a request's latency, as it was with httpx."""

    def __init__(self, base: str, *, max_connections: int = 256, timeout: float = REQUEST_TIMEOUT) -> None:
        host_port = base.removeprefix("http://").rstrip("/")
        host, _, port = host_port.partition(":")
        self.host, self.port = host, int(port or 80)
        self.timeout = timeout
        self._idle: deque[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = deque()
        self._slots = asyncio.Semaphore(max_connections)
        self._host_header = f"Host: {host_port}\r\n".encode()

    async def get(self, path: str) -> Response:
        return await self.request("GET", path)

    async def post(self, path: str, *, json_body: Any) -> Response:
        return await self.request("POST", path, json.dumps(json_body).encode())

    async def request(self, method: str, path: str, body: bytes | None = None) -> Response:
        head = f"{method} {path} HTTP/1.1\r\n".encode() + self._host_header
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n".encode()
        message = head + b"\r\n" + (body or b"")
        async with self._slots:
            try:
                async with asyncio.timeout(self.timeout):
                    return await self._exchange(message)
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
                raise HttpError(f"{type(exc).__name__}: {exc}") from exc

    async def _exchange(self, message: bytes) -> Response:
        while self._idle:
            reader, writer = self._idle.pop()
            if reader.at_eof() or writer.is_closing():  # the server closed it while idle (keep-alive timeout)
                writer.close()
                continue
            try:
                return await self._send(reader, writer, message)
            except (OSError, asyncio.IncompleteReadError) as exc:
                # A keep-alive connection the server closed just as it was reused: nothing of the request was
                # answered, so it is sent again on a fresh connection (as browsers and httpx do).
                if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                    raise
                break
        reader, writer = await asyncio.open_connection(self.host, self.port)
        return await self._send(reader, writer, message)

    async def _send(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, message: bytes) -> Response:
        try:
            writer.write(message)
            response, keep = await self._read(reader)
        except BaseException:
            writer.close()
            raise
        if keep:
            self._idle.append((reader, writer))
        else:
            writer.close()
        return response

    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> tuple[Response, bool]:
        status_line = await reader.readuntil(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        length = None
        chunked = False
        keep = True
        while True:
            line = await reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                keep = value.strip().lower() != b"close"
        if chunked:
            parts = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                data = await reader.readexactly(size + 2)
                if size == 0:
                    break
                parts.append(data[:-2])
            content = b"".join(parts)
        elif length is not None:
            content = await reader.readexactly(length)
        else:
            content = await reader.read()
            keep = False
        return Response(status, content), keep

    async def close(self) -> None:
        while self._idle:
            _, writer = self._idle.pop()
            writer.close()


async def open_loop(
    name: str,
    count: int,
    rate: float,
    base: str,
    request: Callable[[LoadClient, int], Awaitable[Response]],
    ok: int,
    time_limit: float,
) -> tuple[Run, list[Response]]:
    run = Run(name)
    responses: list[Response | None] = [None] * count
    client = LoadClient(base)
    # time.monotonic, not loop.time(): uvloop's clock has a resolution of 1 ms.
    clock = time.monotonic
    try:

        async def one(i: int, scheduled: float) -> None:
            sent = clock()
            try:
                response = await request(client, i)
            except HttpError as exc:
                run.errors.append(str(exc))
                return
            done = clock()
            if response.status_code != ok:
                run.errors.append(f"{response.status_code}: {response.text[:200]}")
                return
            responses[i] = response
            run.from_schedule.append(done - scheduled)
            run.from_send.append(done - sent)
            run.send_lag.append(sent - scheduled)

        start = clock() + 0.05
        stop_at = start + time_limit
        tasks = []
        for i in range(count):
            scheduled = start + i / rate
            if scheduled > stop_at:
                break
            delay = scheduled - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, scheduled)))
        run.sent = len(tasks)
        run.send_span = clock() - start
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=REQUEST_TIMEOUT + 5)
            for task in late:
                task.cancel()
            run.errors.extend(["no answer"] * len(late))
    finally:
        await client.close()
    return run, [r for r in responses if r is not None]


def run_async(coro: Coroutine[Any, Any, Any]) -> Any:
    """The load runs on uvloop where it is installed: less of the machine goes to the client."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process and its descendants (the API's own processes), from /proc (nan
    where that is unavailable). A descendant that ended during the run takes its time with it."""

    def stat(p: int) -> list[str]:
        return Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()

    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError):  # a process that ended meanwhile
                stats[int(entry.name)] = stat(int(entry.name))
    if pid not in stats:
        return math.nan
    children: dict[int, list[int]] = {}
    for p, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(p)
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += int(stats[p][11]) + int(stats[p][12])
        todo.extend(children.get(p, ()))
    return total / os.sysconf("SC_CLK_TCK")


def measured(pid: int, coro: Coroutine[Any, Any, tuple[Run, list[Response]]]) -> tuple[Run, list[Response]]:
    before = cpu_seconds(pid)
    run, responses = run_async(coro)
    run.cpu = cpu_seconds(pid) - before
    return run, responses


def merge_body(lake: Path, i: int) -> dict[str, Any]:
    return upsert_body(
        lake / f"t{i % TABLES:02d}",
        [{"id": i, "name": f"n{i}", "amount": "12.50"}],
        "id BIGINT, name STRING, amount DECIMAL(10,2)",
    )


def claim_waits(manager: JobManager, ids: list[str], timeout: float) -> tuple[list[float], int]:
    """Submit-to-claim of ``ids`` from their rows (waiting, bounded, for them to be claimed); and how many were
    still unclaimed when the wait ended."""
    deadline = time.monotonic() + timeout
    wanted = set(ids)
    while True:
        with manager.engine.connect() as conn:
            rows = conn.execute(select(jobs_table.c.id, jobs_table.c.submitted_at, jobs_table.c.started_at)).all()
        stamps: dict[str, tuple[datetime, datetime | None]] = {
            r.id: (r.submitted_at, r.started_at) for r in rows if r.id in wanted
        }
        unclaimed = sum(1 for s, started in stamps.values() if started is None)
        if unclaimed == 0 or time.monotonic() > deadline:
            waits = [
                (started - submitted).total_seconds() for submitted, started in stamps.values() if started is not None
            ]
            return waits, unclaimed
        time.sleep(0.5)


# --- report -----------------------------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value * 1000:.1f}"


def verdict(kind: str, p50: float, p99: float) -> str:
    which, limit = TARGETS[kind]
    value = p50 if which == "p50" else p99
    if math.isnan(value):
        return "n/a"
    return "PASS" if value * 1000 <= limit else "MISS"


@dataclass
class Row:
    backend: str
    what: str
    n: str
    p50: float
    p99: float
    p50_send: float = math.nan
    p99_send: float = math.nan
    target: str = ""
    verdict: str = ""
    note: str = ""


def latency_row(backend: str, kind: str, run: Run, rate: float) -> Row:
    p50, p99 = percentile(run.from_schedule, 50), percentile(run.from_schedule, 99)
    which, limit = TARGETS[kind]
    offered = (run.sent - 1) / run.send_span if run.send_span > 0 else math.nan
    note = f"{offered:.0f} req/s offered; max send lag {ms(max(run.send_lag, default=math.nan))} ms"
    if run.sent and not math.isnan(run.cpu):
        note += f"; API CPU {run.cpu / run.sent * 1000:.1f} ms/request"
    if run.errors:
        note += f"; {len(run.errors)} errors"
    return Row(
        backend,
        run.name,
        f"{len(run.from_schedule)}/{run.sent}",
        p50,
        p99,
        percentile(run.from_send, 50),
        percentile(run.from_send, 99),
        f"{which} <= {limit:g} ms",
        verdict(kind, p50, p99),
        note,
    )


def print_table(rows: list[Row]) -> None:
    header = ("backend", "measure", "n", "p50 ms", "p99 ms", "p50/p99 from send", "target", "", "note")
    lines = [header] + [
        (
            r.backend,
            r.what,
            r.n,
            ms(r.p50),
            ms(r.p99),
            "" if math.isnan(r.p50_send) else f"{ms(r.p50_send)} / {ms(r.p99_send)}",
            r.target,
            r.verdict,
            r.note,
        )
        for r in rows
    ]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    for n, line in enumerate(lines):
        print("  ".join(str(cell).ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


# --- one backend --------------------------------------------------------------------------------------------------


def bench_backend(backend: str, args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix=f"api-bench-{backend}-") as tmp:
        home = Path(tmp)
        lake = home / "lake"
        lake.mkdir()
        with database(backend, home) as url:
            manager = JobManager.from_url(url)
            manager.migrate()
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("MERGE_SERVICE_")},
                "MERGE_SERVICE_DATABASE_URL": url,
                "MERGE_SERVICE_LAKE_ROOTS": str(lake),
            }
            api_log, worker_log = home / "api.log", home / "worker.log"
            api_args = [str(BIN / "merge-service"), "api", "--host", "127.0.0.1", "--port", str(port)]
            if args.api_processes:
                api_args += ["--api-processes", str(args.api_processes)]
            worker_args = [sys.executable, str(Path(__file__).resolve()), "--worker"]
            with process(api_args, env, api_log) as api:
                wait_ready(base, api, api_log, what="the API", timeout=60.0)

                async def post(client: LoadClient, i: int) -> Response:
                    return await client.post("/merges", json_body=merge_body(lake, i))

                with process(worker_args, {**env, JOB_SECONDS_ENV: "0"}, worker_log):
                    # Warm-up (not measured): connections, lazy imports, the database's caches.
                    run_async(open_loop("warm-up", 100, args.rate, base, post, 202, 10))

                    claim_count = max(1, int(args.claim_rate * args.claim_seconds))
                    paced, responses = run_async(
                        open_loop("claim", claim_count, args.claim_rate, base, post, 202, args.claim_seconds + 5)
                    )
                    waits, unclaimed = claim_waits(manager, [r.json()["id"] for r in responses], timeout=30)
                    rows.append(
                        Row(
                            backend,
                            f"submit-to-claim @{args.claim_rate:g}/s",
                            f"{len(waits)}/{paced.sent}",
                            percentile(waits, 50),
                            percentile(waits, 99),
                            target="p50 <= 200 ms",
                            verdict=verdict("claim", percentile(waits, 50), percentile(waits, 99)),
                            note=f"1 worker, poll 0.2 s; {unclaimed} unclaimed"
                            if unclaimed
                            else "1 worker, poll 0.2 s",
                        )
                    )

                with process(worker_args, {**env, JOB_SECONDS_ENV: str(args.job_seconds)}, home / "worker-paced.log"):
                    limit = args.count / args.rate + 20
                    posted, responses = measured(
                        api.pid,
                        open_loop(f"POST /merges @{args.rate:g}/s", args.count, args.rate, base, post, 202, limit),
                    )
                    rows.append(latency_row(backend, "POST", posted, args.rate))
                    ids = [r.json()["id"] for r in responses]

                    async def get(client: LoadClient, i: int) -> Response:
                        return await client.get(f"/merges/{ids[(i * 7919) % len(ids)]}")

                    if ids:
                        got, _ = measured(
                            api.pid,
                            open_loop(
                                f"GET /merges/{{id}} @{args.rate:g}/s", args.count, args.rate, base, get, 200, limit
                            ),
                        )
                        rows.append(latency_row(backend, "GET", got, args.rate))
                for run in (posted,) + ((got,) if ids else ()):
                    for error in run.errors[:3]:
                        print(f"{backend} {run.name}: {error}", file=sys.stderr)
            manager.dispose()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second (POST and GET runs)")
    parser.add_argument("--count", type=int, default=2000, help="requests per run")
    parser.add_argument("--claim-rate", type=float, default=5.0, help="submissions per second (claim run)")
    parser.add_argument("--claim-seconds", type=float, default=20.0)
    parser.add_argument(
        "--job-seconds",
        type=float,
        default=1.0,
        help="how long the stand-in worker takes per job during the POST and GET runs",
    )
    parser.add_argument(
        "--api-processes", type=int, default=None, help="API server processes (default: the service's own default)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main()

    rows: list[Row] = []
    failed = False
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        started = time.monotonic()
        try:
            rows.extend(bench_backend(backend, args))
        except Exception as exc:
            print(f"{backend}: the benchmark could not run: {type(exc).__name__}: {exc}", file=sys.stderr)
            failed = True
        print(f"{backend}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    from service.settings import default_api_processes

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    processes = ", ".join(f"{b} {args.api_processes or default_api_processes('api', b)}" for b in backends)
    print(
        f"\nAPI benchmark: open-loop, latency from the scheduled send; {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}; API processes: {processes}; stand-in jobs take "
        f"{args.job_seconds:g} s during the POST and GET runs\n"
    )
    print_table(rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
