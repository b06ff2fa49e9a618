"""A randomized fault campaign against the whole service (issue 24, "Prove it").

Real processes, kept up across runs: a PostgreSQL server (the service tests' ``PostgresServer``, Debian's
package), a Spark Connect server (``engine.spark_server.start_connect_server``), the API (``merge-service api``) and
``--workers`` merge workers (``merge-service worker``), over ``--tables`` small Delta tables (every other one with
deletion vectors enabled) on a lake that is a small tmpfs of its own (when run as root; a plain directory otherwise,
and then no disk-full fault).

One run: a few merges submitted through the HTTP API with idempotency keys (a submission that fails is sent again
with the same key), one fault injected at a random moment among them, whatever was killed started again, then
every job of the run waited for until terminal (a deadline; a job still not terminal is "wedged"). After each run
every table is checked against the job table:

- each succeeded job's commit is in its table's Delta log exactly once (the ``txn`` action: app id and job seq),
  at the ``table_version`` the job reports, and a table's succeeded jobs committed in submission order;
- a failed or cancelled job left no commit; the log holds no commit that is not some job's;
- every accepted submission is in the job table;
- the table's live rows (deletion vectors applied) are its first three and one new id per commit, each id once.

Throughout, a poller asks every process that should be up for ``/healthz`` every half second, answered within
1 s or counted as a miss (a process is exempt while the campaign has it killed or stopped on purpose).

Faults (``--kinds``): ``worker_kill`` (SIGKILL, started again), ``worker_restart`` (SIGTERM, started again),
``spark_kill`` (SIGKILL of the Connect server's JVM, started again on its port), ``postgres_kill`` (SIGKILL of the
postmaster and its backends, started again), ``postgres_restart`` (a fast shutdown, started again), ``api_kill``
and ``api_restart``, ``disk_full`` (the lake's tmpfs filled for a few seconds, then freed) and the slow disk:
``stall_spark`` and ``stall_worker`` (SIGSTOP of the process that writes, SIGCONT a few seconds later; a stalled
worker may outlive its lease, so another worker takes its job over meanwhile). The slow disk is a stopped writer
because this machine has no device-mapper (no ``dm-delay``), no FUSE library, and cgroup io throttling does not
apply to tmpfs, which has no block device: a writer frozen mid-write is what a disk that stops answering does to
it.

Writes ``--out`` (JSON: the counts, the faults hit by kind, every run) and prints one summary line; the exit code
is 1 when anything was lost, doubled or wedged, or a health check was missed.

    python -m bench.fault_campaign --runs 1000 --seed 1 --out var/fault-campaign.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder, write_deltalake

from engine.spark_server import SparkProcess, free_port, start_connect_server
from tests.e2e.harness import answers, upsert_body, wait_ready
from tests.engine.delta.dv_tables import enable_deletion_vectors
from tests.full_disk import can_mount, fill, mount_tmpfs, unmount
from tests.service.conftest import PostgresServer

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
APP_ID = "merge-service-fault-campaign"
TOKEN = "fault-campaign-token"
LEASE_SECONDS = 8.0
START_TIMEOUT = 180.0
HEALTH_TIMEOUT = 1.0
HEALTH_INTERVAL = 0.5
SUBMIT_DEADLINE = 120.0
ALL_KINDS = (
    "worker_kill",
    "worker_restart",
    "spark_kill",
    "postgres_kill",
    "postgres_restart",
    "api_kill",
    "api_restart",
    "disk_full",
    "stall_spark",
    "stall_worker",
)
BAD_COUNTS = (
    "lost",
    "doubled",
    "wedged",
    "out_of_order",
    "wrong_version",
    "failed_but_committed",
    "stray_commits",
    "wrong_rows",
)
"""The counts of a campaign that must stay 0 (``Totals``); a problem's text starts with its kind."""
# Spark takes tens of seconds to start again on two shared cores: its kill is drawn less often.
WEIGHTS = {"spark_kill": 0.4}


class ServiceProcess:
    """One ``merge-service`` command (``api`` or ``worker``) on its own port, started again after a fault."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], port: int, log_dir: Path) -> None:
        self.name = name
        self.args = args
        self.env = env
        self.port = port
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*self.args, "--port", str(self.port)], cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def stop(self, timeout: float) -> float:
        """SIGTERM; seconds until it exited (SIGKILL after ``timeout``)."""
        started = time.monotonic()
        self.signal(signal.SIGTERM)
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return time.monotonic() - started

    def healthy(self) -> bool:
        return answers(self.url, "/healthz", HEALTH_TIMEOUT)

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        wait_ready(self.url, self.proc, self.log_path, what=self.name, timeout=timeout, interval=0.5, request_timeout=5)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""


class HealthPoller:
    """Asks each process that should be up for /healthz every ``HEALTH_INTERVAL``; a process the campaign has
    down on purpose is exempt (``down``)."""

    def __init__(self, processes: list[ServiceProcess]) -> None:
        self.processes = processes
        self.down: set[str] = set()
        self.lock = threading.Lock()
        self.checks = 0
        self.misses: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="health-poller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @contextlib.contextmanager
    def exempt(self, name: str) -> Any:
        with self.lock:
            self.down.add(name)
        try:
            yield
        finally:
            with self.lock:
                self.down.discard(name)

    def _loop(self) -> None:
        while not self._stop.wait(HEALTH_INTERVAL):
            for process in self.processes:
                with self.lock:
                    if process.name in self.down:
                        continue
                started = time.monotonic()
                ok = process.healthy()
                with self.lock:
                    if process.name in self.down:  # went down on purpose while we asked
                        continue
                    self.checks += 1
                    if not ok:
                        self.misses.append(
                            {"process": process.name, "at": time.time(), "seconds": time.monotonic() - started}
                        )


@dataclass
class Submitted:
    id: str
    table: int
    key: str
    run: int


@dataclass
class RunRecord:
    run: int
    kind: str
    seconds: float
    submitted: int
    unsubmitted: int
    statuses: dict[str, int]
    problems: list[str] = field(default_factory=list)
    detail: str = ""


@dataclass
class Totals:
    runs: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    submitted: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    unsubmitted: int = 0
    lost: int = 0
    doubled: int = 0
    wedged: int = 0
    out_of_order: int = 0
    wrong_version: int = 0
    failed_but_committed: int = 0
    wrong_rows: int = 0
    stray_commits: int = 0
    health_checks: int = 0
    health_misses: int = 0


class Campaign:
    def __init__(self, work: Path, *, tables: int, workers: int, seed: int, tmpfs_mb: int) -> None:
        self.work = work
        self.rng = random.Random(seed)
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.lake = work / "lake"
        self.lake.mkdir(exist_ok=True)
        self.tmpfs = can_mount()
        if self.tmpfs:
            mount_tmpfs(self.lake, tmpfs_mb)
        self.tables = [self.lake / f"t{i}" for i in range(tables)]
        self.next_id = 1000
        self.jobs: list[Submitted] = []
        self.log_cache: dict[Path, dict[int, list[tuple[str, int]]]] = {t: {} for t in self.tables}
        self.reported: set[str] = set()
        self.pg = PostgresServer()
        name = "campaign"
        self.pg._admin(f'CREATE DATABASE "{name}"')
        # The tests' server runs with synchronous_commit=off, which may forget the last commits at a crash; a
        # deployment's job database does not, and a killed server is the point here.
        self.pg._admin(f'ALTER DATABASE "{name}" SET synchronous_commit = on')
        self.database_url = f"postgresql+psycopg://postgres@127.0.0.1:{self.pg.port}/{name}"
        self.dsn = f"host=127.0.0.1 port={self.pg.port} user=postgres dbname={name} connect_timeout=5"
        self.spark_port = free_port()
        self.spark: SparkProcess = self._start_spark()
        env = {
            **os.environ,
            "MERGE_SERVICE_DATABASE_URL": self.database_url,
            "MERGE_SERVICE_SPARK_REMOTE": f"sc://127.0.0.1:{self.spark_port}",
            "MERGE_SERVICE_LAKE_ROOTS": str(self.lake),
            "MERGE_SERVICE_API_TOKENS": TOKEN,
            "MERGE_SERVICE_APP_ID": APP_ID,
            "MERGE_SERVICE_WORKERS": "1",
            "MERGE_SERVICE_LEASE_SECONDS": str(LEASE_SECONDS),
            "MERGE_SERVICE_HEARTBEAT_SECONDS": "1",
            "MERGE_SERVICE_MAX_ATTEMPTS": "20",
            "MERGE_SERVICE_BACKOFF_BASE_SECONDS": "0.5",
            "MERGE_SERVICE_BACKOFF_MAX_SECONDS": "4",
            "MERGE_SERVICE_POLL_INTERVAL_SECONDS": "0.2",
            "MERGE_SERVICE_ACCESS_LOG": "false",
        }
        subprocess.run([str(BIN / "merge-service"), "migrate"], cwd=ROOT, env=env, check=True, capture_output=True)
        self.api = ServiceProcess(
            "api", [str(BIN / "merge-service"), "api", "--api-processes", "1"], env, free_port(), self.logs
        )
        self.workers = [
            ServiceProcess(f"worker-{i}", [str(BIN / "merge-service"), "worker"], env, free_port(), self.logs)
            for i in range(workers)
        ]
        self.base_versions: dict[Path, int] = {}
        for number, table in enumerate(self.tables):
            table.mkdir()
            write_deltalake(str(table), pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}))
            if number % 2:  # merge-on-read: the updates mark the old rows in deletion vectors
                enable_deletion_vectors(table)
            self.base_versions[table] = DeltaTable(str(table)).version()
        for process in self.processes:
            process.start()
        for process in self.processes:
            process.wait_ready()
        self.health = HealthPoller(self.processes)
        self.health.start()
        self.client = httpx.Client(base_url=self.api.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)

    @property
    def processes(self) -> list[ServiceProcess]:
        return [self.api, *self.workers]

    def _start_spark(self) -> SparkProcess:
        return start_connect_server(port=self.spark_port, log_dir=self.logs / "spark")

    def close(self) -> None:
        self.health.stop()
        self.client.close()
        for process in self.processes:
            process.stop(LEASE_SECONDS * 2)
        self.spark.stop(10)
        self.pg.stop()
        if self.tmpfs:
            unmount(self.lake)

    # --- merges ---------------------------------------------------------------------------------------------

    def body(self, table: int) -> dict[str, Any]:
        """An upsert that always inserts a new row (so every merge commits) and updates an existing one."""
        self.next_id += 1
        rows = [{"id": self.next_id, "v": f"n{self.next_id}"}, {"id": self.rng.randint(1, 3), "v": f"u{self.next_id}"}]
        return upsert_body(self.tables[table], rows, "id BIGINT, v STRING")

    def submit(self, run: int, table: int) -> Submitted | None:
        """POST until accepted, the same idempotency key every time; None if never accepted by the deadline."""
        key = uuid.uuid4().hex
        body = self.body(table)
        deadline = time.monotonic() + SUBMIT_DEADLINE
        while time.monotonic() < deadline:
            try:
                response = self.client.post("/merges", json=body, headers={"Idempotency-Key": key})
                if response.status_code in (200, 202):
                    job = Submitted(str(response.json()["id"]), table, key, run)
                    self.jobs.append(job)
                    return job
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        return None

    def job_rows(self) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with psycopg.connect(self.dsn) as conn:
                    rows = conn.execute(
                        "SELECT id, seq, status, target, table_version FROM merge_jobs WHERE NOT dry_run"
                    ).fetchall()
                return {r[0]: {"seq": r[1], "status": r[2], "target": r[3], "table_version": r[4]} for r in rows}
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def wait_terminal(self, jobs: list[Submitted], timeout: float) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            rows = self.job_rows()
            pending = [j for j in jobs if rows.get(j.id, {}).get("status") in ("queued", "running")]
            if not pending or time.monotonic() > deadline:
                return rows
            time.sleep(0.5)

    # --- faults ---------------------------------------------------------------------------------------------

    def fault(self, kind: str) -> str:
        """Inject ``kind`` and recover from it; a line saying what was done."""
        if kind in ("worker_kill", "worker_restart", "stall_worker"):
            worker = self.rng.choice(self.workers)
            with self.health.exempt(worker.name):
                if kind == "stall_worker":
                    seconds = self.rng.uniform(2, LEASE_SECONDS * 1.5)
                    worker.signal(signal.SIGSTOP)
                    time.sleep(seconds)
                    worker.signal(signal.SIGCONT)
                    return f"{worker.name} stopped {seconds:.1f} s"
                if kind == "worker_kill":
                    worker.kill()
                    what = "killed"
                else:
                    what = f"stopped by SIGTERM in {worker.stop(LEASE_SECONDS * 3):.1f} s"
                time.sleep(self.rng.uniform(0, 2))
                worker.start()
                worker.wait_ready()
            return f"{worker.name} {what}"
        if kind in ("api_kill", "api_restart"):
            with self.health.exempt(self.api.name):
                if kind == "api_kill":
                    self.api.kill()
                else:
                    self.api.stop(LEASE_SECONDS)
                time.sleep(self.rng.uniform(0, 2))
                self.api.start()
                self.api.wait_ready()
            return "api " + ("killed" if kind == "api_kill" else "restarted")
        if kind == "spark_kill":
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.spark.process.pid, signal.SIGKILL)
            self.spark.process.wait()
            self.spark._stopped = True
            time.sleep(self.rng.uniform(0, 3))
            self.spark = self._start_spark()
            return "spark killed"
        if kind == "stall_spark":
            seconds = self.rng.uniform(2, 10)
            jvm = psutil.Process(self.spark.process.pid)
            group = [jvm, *jvm.children(recursive=True)]
            for p in group:
                with contextlib.suppress(psutil.Error):
                    p.suspend()
            time.sleep(seconds)
            for p in group:
                with contextlib.suppress(psutil.Error):
                    p.resume()
            return f"spark stopped {seconds:.1f} s"
        if kind in ("postgres_kill", "postgres_restart"):
            down = self.rng.uniform(0.5, 4)
            if kind == "postgres_kill":
                pid = int((self.pg.data / "postmaster.pid").read_text().split()[0])
                postmaster = psutil.Process(pid)
                group = [postmaster, *postmaster.children(recursive=True)]
                for p in group:
                    with contextlib.suppress(psutil.Error):
                        p.kill()
                psutil.wait_procs(group, timeout=10)
            else:
                self.pg._run("pg_ctl", "-D", str(self.pg.data), "-m", "fast", "-w", "stop")
            time.sleep(down)
            self._start_postgres()
            return f"postgres {'killed' if kind == 'postgres_kill' else 'restarted'}, down {down:.1f} s"
        if kind == "disk_full":
            if not self.tmpfs:
                raise ValueError("disk_full needs the lake on a tmpfs of its own (run as root)")
            seconds = self.rng.uniform(1, 6)
            filler = self.lake / "filler"
            try:
                left = fill(filler)
                time.sleep(seconds)
            finally:
                filler.unlink(missing_ok=True)
            return f"lake full ({left} bytes free) for {seconds:.1f} s"
        raise ValueError(f"unknown fault kind {kind!r}")

    def _start_postgres(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                self.pg._run(
                    "pg_ctl",
                    "-D",
                    str(self.pg.data),
                    "-o",
                    self.pg.options,
                    "-l",
                    str(self.pg.dir / "server.log"),
                    "-w",
                    "-t",
                    "60",
                    "start",
                )
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    # --- one run --------------------------------------------------------------------------------------------

    def run(self, index: int, kind: str, totals: Totals) -> RunRecord:
        started = time.monotonic()
        count = self.rng.randint(2, 4)
        fault_at = self.rng.randint(0, count)  # before the first merge, between two, or after the last
        jobs: list[Submitted] = []
        unsubmitted = 0
        detail = ""
        fault_error: BaseException | None = None
        fault_thread: threading.Thread | None = None

        def inject() -> None:
            nonlocal detail, fault_error
            try:
                time.sleep(self.rng.uniform(0, 1.5))
                detail = self.fault(kind)
            except BaseException as exc:
                fault_error = exc

        for i in range(count + 1):
            if i == fault_at:
                fault_thread = threading.Thread(target=inject, name=f"fault-{index}", daemon=True)
                fault_thread.start()
            if i < count:
                job = self.submit(index, self.rng.randrange(len(self.tables)))
                if job is None:
                    unsubmitted += 1
                else:
                    jobs.append(job)
                time.sleep(self.rng.uniform(0, 1))
        assert fault_thread is not None
        fault_thread.join()
        if fault_error is not None:
            raise RuntimeError(f"run {index}: injecting {kind} failed") from fault_error
        totals.faults[kind] += 1
        rows = self.wait_terminal(jobs, timeout=3 * LEASE_SECONDS + 90)
        problems = self.check(rows, totals)
        statuses = Counter(rows.get(j.id, {}).get("status", "missing") for j in jobs)
        totals.runs += 1
        totals.submitted += len(jobs)
        totals.unsubmitted += unsubmitted
        for status in ("succeeded", "failed", "cancelled"):
            setattr(totals, status, getattr(totals, status) + statuses.get(status, 0))
        return RunRecord(
            index, kind, round(time.monotonic() - started, 2), len(jobs), unsubmitted, dict(statuses), problems, detail
        )

    # --- checks ---------------------------------------------------------------------------------------------

    def txns(self, table: Path) -> dict[int, list[tuple[str, int]]]:
        """Version -> the ``txn`` actions of that commit, read straight from the commit files (cached: a
        committed version never changes)."""
        cache = self.log_cache[table]
        for path in sorted((table / "_delta_log").glob("*.json")):
            version = int(path.stem)
            if version in cache:
                continue
            actions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            cache[version] = [(a["txn"]["appId"], int(a["txn"]["version"])) for a in actions if "txn" in a]
        return cache

    def check_rows(self, number: int, table: Path, where: dict[int, list[int]]) -> list[str]:
        """The table's live rows (deletion vectors applied, by delta-rs's query engine): each committed merge
        inserted one new id, so three plus one per commit, every id once (an updated row that its vector failed to
        hide would be there twice)."""
        query = "SELECT count(*) AS n, count(DISTINCT id) AS ids FROM t"
        found = pa.table(QueryBuilder().register("t", DeltaTable(str(table))).execute(query).read_all()).to_pylist()[0]
        expected = 3 + len(where)
        if (found["n"], found["ids"]) != (expected, expected):
            return [f"wrong rows: t{number} holds {found['n']} rows, {found['ids']} ids; its commits leave {expected}"]
        return []

    def check(self, rows: dict[str, dict[str, Any]], totals: Totals) -> list[str]:
        """Every job ever submitted against every table's log; new problems only are counted (a problem stays
        reported on later runs, so each is counted once, by its text)."""
        problems: list[str] = []
        by_seq: dict[int, tuple[Submitted, dict[str, Any]]] = {}
        for job in self.jobs:
            row = rows.get(job.id)
            if row is None:
                problems.append(f"lost: job {job.id} (run {job.run}) is not in the job table")
                continue
            by_seq[row["seq"]] = (job, row)
        for number, table in enumerate(self.tables):
            log = self.txns(table)
            where: dict[int, list[int]] = {}
            for version, txns in sorted(log.items()):
                ours = [seq for app, seq in txns if app == APP_ID]
                if version > self.base_versions[table] and not ours:
                    problems.append(f"stray commit: t{number} v{version} carries no job's txn")
                for seq in ours:
                    where.setdefault(seq, []).append(version)
            last_version = 0
            for seq, (job, row) in sorted(by_seq.items()):
                if job.table != number:
                    continue
                versions = where.get(seq, [])
                if len(versions) > 1:
                    problems.append(f"doubled: job {job.id} seq {seq} in t{number} at versions {versions}")
                if row["status"] in ("queued", "running"):
                    problems.append(f"wedged: job {job.id} (run {job.run}) still {row['status']}")
                    continue
                if row["status"] == "succeeded":
                    if not versions:
                        problems.append(f"lost: job {job.id} succeeded but its merge is not in t{number}")
                        continue
                    if row["table_version"] != versions[0]:
                        problems.append(
                            f"wrong version: job {job.id} says v{row['table_version']}, t{number} has it at "
                            f"v{versions[0]}"
                        )
                    if versions[0] <= last_version:
                        problems.append(f"out of order: job {job.id} at v{versions[0]} after v{last_version}")
                    last_version = max(last_version, versions[0])
                elif versions:
                    problems.append(f"failed but committed: job {job.id} ({row['status']}) at t{number} {versions}")
            for seq in where:
                if seq not in by_seq:
                    problems.append(f"stray commit: t{number} holds seq {seq}, no job the campaign submitted")
            problems += self.check_rows(number, table, where)
        new = [p for p in problems if p not in self.reported]
        self.reported.update(new)
        for problem in new:
            kind = problem.split(":", 1)[0].replace(" ", "_")
            count = "stray_commits" if kind == "stray_commit" else kind
            if count in BAD_COUNTS:
                setattr(totals, count, getattr(totals, count) + 1)
        return new


def campaign(
    *,
    runs: int,
    seed: int,
    kinds: tuple[str, ...] = ALL_KINDS,
    tables: int = 8,
    workers: int = 2,
    work: Path | None = None,
    out: Path | None = None,
    tmpfs_mb: int = 96,
    until: float | None = None,
    schedule: list[str] | None = None,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run up to ``runs`` fault runs (stopping earlier at the epoch time ``until``), each with a fault drawn from
    ``kinds`` (or, given ``schedule``, those kinds in that order); the result as a dict."""
    work = work or Path(tempfile.mkdtemp(prefix="merge-service-faults-"))
    rng = random.Random(seed)
    started = time.monotonic()
    totals = Totals()
    records: list[RunRecord] = []
    c = Campaign(work, tables=tables, workers=workers, seed=seed, tmpfs_mb=tmpfs_mb)
    usable = [k for k in kinds if k != "disk_full" or c.tmpfs]
    error = ""
    try:
        for index in range(runs):
            if until is not None and time.time() > until:
                break
            if schedule is not None:
                if index >= len(schedule):
                    break
                kind = schedule[index]
            else:
                kind = rng.choices(usable, weights=[WEIGHTS.get(k, 1.0) for k in usable])[0]
            record = c.run(index, kind, totals)
            records.append(record)
            echo(
                f"run {index} {kind}: {record.seconds:.1f} s {record.statuses} {record.detail}"
                + (f" PROBLEMS {record.problems}" if record.problems else "")
            )
            if out is not None and index % 10 == 0:
                _write(out, seed, started, totals, records, c, error)
    except KeyboardInterrupt:
        echo("campaign stopped by a signal")
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        echo(f"campaign stopped: {error}")
        raise
    finally:
        totals.health_checks = c.health.checks
        totals.health_misses = len(c.health.misses)
        result = _write(out, seed, started, totals, records, c, error)
        c.close()
    return result


def _write(
    out: Path | None,
    seed: int,
    started: float,
    totals: Totals,
    records: list[RunRecord],
    c: Campaign,
    error: str,
) -> dict[str, Any]:
    totals.health_checks = c.health.checks
    totals.health_misses = len(c.health.misses)
    counts = {k: v for k, v in asdict(totals).items() if k != "faults"}
    result = {
        "seed": seed,
        "seconds": round(time.monotonic() - started, 1),
        "counts": counts,
        "faults": dict(sorted(totals.faults.items())),
        "summary": summary(totals),
        "error": error,
        "health_misses": c.health.misses,
        "runs": [asdict(r) for r in records],
        "work": str(c.work),
    }
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out)
    return result


def summary(t: Totals) -> str:
    faults = ", ".join(f"{k} {v}" for k, v in sorted(t.faults.items()))
    return (
        f"{t.runs} runs, {t.submitted} jobs ({t.succeeded} succeeded, {t.failed} failed, {t.cancelled} cancelled, "
        f"{t.unsubmitted} never accepted): {t.lost} lost, {t.doubled} doubled, {t.wedged} wedged, "
        f"{t.out_of_order} out of order, {t.wrong_version} wrong version, {t.failed_but_committed} failed but "
        f"committed, {t.stray_commits} stray commits, {t.wrong_rows} wrong rows; /healthz {t.health_checks} checks, "
        f"{t.health_misses} missed; "
        f"faults: {faults}"
    )


def clean(result: dict[str, Any]) -> bool:
    counts = result["counts"]
    return not result["error"] and counts["health_misses"] == 0 and all(counts[k] == 0 for k in BAD_COUNTS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kinds", default=",".join(ALL_KINDS), help="comma-separated fault kinds")
    parser.add_argument("--out", type=Path, default=ROOT / "var" / "fault-campaign.json")
    parser.add_argument("--work", type=Path, default=None, help="a new directory for the lake, logs and database")
    parser.add_argument("--until", type=float, default=None, help="stop starting runs after this epoch time")
    args = parser.parse_args(argv)
    # Stopped by SIGTERM or SIGINT (also when started in the background, where SIGINT is ignored), the campaign
    # still writes its result and stops every process it started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: signal.default_int_handler(signal.SIGINT, None))
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = set(kinds) - set(ALL_KINDS)
    if unknown:
        parser.error(f"unknown fault kinds: {sorted(unknown)}")
    result = campaign(
        runs=args.runs,
        seed=args.seed,
        kinds=kinds,
        tables=args.tables,
        workers=args.workers,
        work=args.work,
        out=args.out,
        until=args.until,
        echo=lambda line: print(line, flush=True),
    )
    print(result["summary"], flush=True)
    return 0 if clean(result) else 1


if __name__ == "__main__":
    sys.exit(main())
