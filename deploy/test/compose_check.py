"""The deployment, end to end: `docker compose up` from this checkout and a user's first hour with it.

Builds the base images' stand-ins when no registry can give the official ones (build-stand-ins.sh), builds the
product image, starts the stack with two merge workers and waits for every healthcheck; then, through the API
only: a structured merge and a SQL merge with Change Data Feed, their rows and changes read back with deltalake
(not Spark) from the lake volume; proof that the tasks ran on the standalone cluster's executors; a merge worker
killed mid-merge whose job still ends `succeeded`, committed exactly once; the readiness reason and metric when
the cluster has no executors; and `down` / `up` keeping jobs (PostgreSQL volume) and tables (lake volume).

Run as root or a user of the docker group: `make compose-check`. It prints how long each step took, and removes
the stack and its volumes at the end unless --keep is given.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PROJECT = "merge-service-check"
BASE_IMAGES = ("python:3.11-slim-bookworm", "postgres:16-bookworm")
LAKE = "/lake/check"
COUNTER_ROWS = 2_000_000
WORKERS = 2
APT_LOCK = str(Path(tempfile.gettempdir()) / "merge-service-apt.lock")
"""The lock tests/debian.py takes around apt-get."""
NO_DOCKERD = 77
"""Exit status when this machine cannot run dockerd (an unprivileged container, say): nothing was checked."""


class CheckFailed(AssertionError):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, probe: Callable[[], Any], timeout: float, interval: float = 2.0) -> Any:
    """Polls ``probe`` until it returns something truthy; its last answer or exception explains a timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
            if last:
                return last
        except (OSError, ValueError, subprocess.CalledProcessError, CheckFailed) as exc:
            last = exc
        time.sleep(interval)
    raise CheckFailed(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def docker(*args: str, capture: bool = True, check_rc: bool = True, **kw: Any) -> str:
    done = subprocess.run(["docker", *args], capture_output=capture, text=True, check=False, **kw)
    if check_rc and done.returncode != 0:
        raise CheckFailed(f"docker {' '.join(args)} failed: {done.stderr if capture else done.returncode}")
    return done.stdout if capture else ""


def container_logs(container: str) -> str:
    done = subprocess.run(["docker", "logs", container], capture_output=True, text=True, check=False)
    return done.stdout + done.stderr


def compose_command() -> list[str]:
    if subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise SystemExit("compose check: needs `docker compose` or `docker-compose`")


class Stack:
    def __init__(self, api_port: int) -> None:
        self.base = [
            *compose_command(),
            "-p",
            PROJECT,
            "-f",
            str(ROOT / "docker-compose.yml"),
            "-f",
            str(HERE / "compose.check.yml"),
        ]
        self.env = {
            **os.environ,
            "API_PORT": str(api_port),
            "SPARK_MASTER_UI_PORT": str(free_port()),
            "SPARK_WORKER_MEMORY": "3g",
            "SPARK_EXECUTOR_MEMORY": "2g",
        }
        self.api = f"http://127.0.0.1:{api_port}"

    def compose(self, *args: str, stdin: str | None = None, capture: bool = True, nice: bool = False) -> str:
        command = [*(["nice", "-n", "10"] if nice else []), *self.base, *args]
        done = subprocess.run(
            command, input=stdin, capture_output=capture, text=True, env=self.env, cwd=ROOT, check=False
        )
        if done.returncode != 0:
            raise CheckFailed(f"{' '.join(args)} failed ({done.returncode}): {done.stderr if capture else ''}")
        return done.stdout if capture else ""

    def containers(self, service: str) -> list[str]:
        return self.compose("ps", "-q", service).split()

    def run_in(self, service: str, *command: str, stdin: str | None = None) -> str:
        return self.compose("exec", "-T", service, *command, stdin=stdin)

    def up(self) -> None:
        self.compose("up", "-d", "--scale", f"worker={WORKERS}", capture=False)

    def up_healthy(self) -> None:
        self.up()
        wait_for("every service to be healthy", self.all_healthy, 900, interval=3)

    def all_healthy(self) -> bool:
        """Every container with a healthcheck healthy, migrate exited 0; a ValueError names what is not."""
        pending = []
        for cid in self.compose("ps", "-q").split():
            state = json.loads(docker("inspect", "-f", "{{json .State}}", cid))
            name = docker("inspect", "-f", "{{.Name}}", cid).strip()
            if "migrate" in name:
                if state["Status"] == "exited" and state["ExitCode"] != 0:
                    raise CheckFailed(f"{name} exited {state['ExitCode']}: {docker('logs', '--tail', '30', cid)}")
                continue
            health = state.get("Health", {}).get("Status")
            if state["Status"] != "running" or health != "healthy":
                pending.append(f"{name}: {state['Status']}/{health}")
        if pending:
            raise ValueError(", ".join(pending))
        return True

    def http(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.api + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            raise CheckFailed(f"{method} {path}: {exc.code} {exc.read().decode(errors='replace')}") from exc

    def submit(self, body: dict[str, Any]) -> str:
        return str(self.http("POST", "/merges", body)["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.http("GET", f"/merges/{job_id}"))

    def finished(self, job_id: str, timeout: float = 600) -> dict[str, Any]:
        job = wait_for(
            f"job {job_id} to finish",
            lambda: (j := self.job(job_id))["status"] in ("succeeded", "failed", "cancelled") and j,
            timeout,
            interval=1.0,
        )
        check(job["status"] == "succeeded", f"job {job_id} ended {job['status']}: {job.get('error')}")
        return dict(job)

    def lake_dir(self) -> Path:
        return Path(docker("volume", "inspect", "-f", "{{.Mountpoint}}", f"{PROJECT}_lake").strip()) / "check"

    def spark_app(self) -> dict[str, Any]:
        """The Connect server's application, its executors and stages, from its driver's API (as a worker sees it)."""
        probe = (
            "import json, urllib.request as u\n"
            "get = lambda p: json.load(u.urlopen('http://spark-connect:4040/api/v1/' + p, timeout=10))\n"
            "app = get('applications')[0]\n"
            "base = f\"applications/{app['id']}/\"\n"
            "executors, stages = get(base + 'allexecutors'), get(base + 'stages')\n"
            "print(json.dumps({'id': app['id'], 'executors': executors, 'stages': stages}))\n"
        )
        return dict(json.loads(self.run_in("api", "python", "-", stdin=probe)))

    def worker_metric(self, container: str, name: str) -> float | None:
        text = docker("exec", container, "python", "-c", _METRICS_PROBE)
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def worker_readiness(self, container: str) -> dict[str, Any]:
        return dict(json.loads(docker("exec", container, "python", "-c", _READYZ_PROBE)))


_METRICS_PROBE = (
    "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8001/metrics', timeout=10).read().decode())"
)
_READYZ_PROBE = (
    "import urllib.request as u, urllib.error as e\n"
    "try:\n    print(u.urlopen('http://127.0.0.1:8001/readyz', timeout=30).read().decode())\n"
    "except e.HTTPError as x:\n    print(x.read().decode())\n"
)


# --- steps ---------------------------------------------------------------------------------------------------


def docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


def start_dockerd() -> subprocess.Popen[bytes] | None:
    """A dockerd of our own when none answers and this machine allows one (root, Debian's packages installable):
    installs docker.io, docker-compose and debootstrap when missing. Returns the process to stop at the end."""
    if docker_answers():
        return None
    if os.geteuid() != 0:
        print("compose check: no dockerd answers, and only root can start one", file=sys.stderr)
        raise SystemExit(NO_DOCKERD)
    if not all(shutil.which(tool) for tool in ("dockerd", "debootstrap")) or not compose_available():
        # One apt-get at a time: the test suite installs its packages beside this, on the same lock file.
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        apt = ["flock", APT_LOCK, "apt-get", "-o", "DPkg::Lock::Timeout=600"]
        subprocess.run([*apt, "update", "-qq"], check=True, env=env, capture_output=True)
        packages = ["docker.io", "docker-compose", "debootstrap"]
        subprocess.run([*apt, "install", "-y", "-qq", *packages], check=True, env=env, capture_output=True)
    log = open("/tmp/merge-service-dockerd.log", "ab")  # noqa: SIM115 (the daemon writes to it until it stops)
    daemon = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for("dockerd to answer", docker_answers, 60, interval=1)
    except CheckFailed:
        daemon.terminate()
        print("compose check: dockerd does not start here (see /tmp/merge-service-dockerd.log)", file=sys.stderr)
        raise SystemExit(NO_DOCKERD) from None
    return daemon


def compose_available() -> bool:
    try:
        compose_command()
    except SystemExit:
        return False
    return True


def ensure_base_images() -> None:
    """The official images when this machine has them or can pull them; the stand-ins otherwise."""
    missing = [
        image
        for image in BASE_IMAGES
        if subprocess.run(["docker", "image", "inspect", image], capture_output=True, check=False).returncode != 0
    ]
    for image in list(missing):
        pulled = subprocess.run(["timeout", "120", "docker", "pull", image], capture_output=True, check=False)
        if pulled.returncode == 0:
            missing.remove(image)
    if missing:
        print(f"  no registry gives {missing}: building the stand-ins (deploy/test/build-stand-ins.sh)", flush=True)
        subprocess.run([str(HERE / "build-stand-ins.sh")], check=True)


def check_lake_writable(stack: Stack) -> None:
    """The lake volume belongs to uid 1000, the user every container runs as: `merge-service demo` writes there."""
    out = stack.run_in("api", "merge-service", "demo")
    check("/lake/demo/customers" in out, f"merge-service demo: {out}")
    stack.run_in("api", "python", "-", LAKE, str(COUNTER_ROWS), stdin=(HERE / "seed.py").read_text())


def rows(table: Path, key: str = "id") -> list[dict[str, Any]]:
    return sorted(DeltaTable(str(table)).to_pyarrow_table().to_pylist(), key=lambda r: r[key])


def structured_and_sql_merges(stack: Stack) -> dict[str, str]:
    structured = stack.submit(
        {
            "target": f"{LAKE}/customers",
            "source": {
                "rows": [{"id": 2, "name": "Grace", "visits": 7}, {"id": 5, "name": "Alan", "visits": 1}],
                "schema": "id BIGINT, name STRING, visits BIGINT",
            },
            "target_alias": "t",
            "source_alias": "s",
            "on": "t.id = s.id",
            "when_matched": [{"action": "update_all"}],
            "when_not_matched": [{"action": "insert_all"}],
        }
    )
    job = stack.finished(structured)
    check(job["table_version"] == 1, f"structured merge committed version {job['table_version']}, not 1")
    sql = stack.submit(
        {
            "sql": f"MERGE INTO delta.`{LAKE}/customers` AS t USING parquet.`{LAKE}/incoming/customers.parquet` AS s "
            "ON t.id = s.id WHEN MATCHED THEN UPDATE SET visits = t.visits + s.visits WHEN NOT MATCHED THEN INSERT *"
        }
    )
    job = stack.finished(sql)
    check(job["table_version"] == 2, f"SQL merge committed version {job['table_version']}, not 2")

    table = stack.lake_dir() / "customers"
    expected = [
        {"id": 1, "name": "Ada", "visits": 1},
        {"id": 2, "name": "Grace", "visits": 7},
        {"id": 3, "name": "Edsger", "visits": 6},
        {"id": 4, "name": "Barbara", "visits": 1},
        {"id": 5, "name": "Alan", "visits": 1},
    ]
    check(rows(table) == expected, f"customers after both merges: {rows(table)}")
    cdf = DeltaTable(str(table)).load_cdf(starting_version=2, ending_version=2)
    changes = pa.RecordBatchReader.from_stream(cdf).read_all().to_pylist()
    seen = sorted((c["_change_type"], c["id"], c["visits"]) for c in changes)
    check(
        seen == [("insert", 4, 1), ("update_postimage", 3, 6), ("update_preimage", 3, 1)],
        f"Change Data Feed of version 2: {seen}",
    )
    return {"structured": structured, "sql": sql}


def completed_tasks_on_executors(app: dict[str, Any]) -> int:
    return sum(e["completedTasks"] for e in app["executors"] if e["id"] != "driver")


def check_cluster_executors(stack: Stack, tasks_before: int) -> None:
    """The merges' tasks ran in executor JVMs on the spark-worker containers, not in the Connect server, in the
    workers' own scheduler pools."""
    app = stack.spark_app()
    driver = next(e for e in app["executors"] if e["id"] == "driver")
    check(driver["totalCores"] == 0, f"the driver runs tasks itself: {driver}")
    worker_ips = {
        docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", c).strip()
        for c in stack.containers("spark-worker")
    }
    executors = [e for e in app["executors"] if e["id"] != "driver"]
    hosts = {e["hostPort"].rsplit(":", 1)[0] for e in executors}
    check(bool(executors) and hosts <= worker_ips, f"executors on {hosts}, spark-worker containers {worker_ips}")
    done = completed_tasks_on_executors(app)
    check(done > tasks_before, f"no task completed on an executor during the merges ({tasks_before} -> {done})")
    pools = {stage.get("schedulingPool") for stage in app["stages"]}
    check(
        any(str(pool).startswith("merge-worker-") for pool in pools),
        f"no merge ran in a worker's scheduler pool: {pools}",
    )


def kill_a_worker_mid_merge(stack: Stack) -> str:
    """A merge worker dies (SIGKILL) while its job runs; the other takes the job back once the lease expires,
    and the retried attempt commits once: every counter ends at exactly 1."""
    table = stack.lake_dir() / "counters"
    version_before = DeltaTable(str(table)).version()
    job_id = stack.submit(
        {
            "target": f"{LAKE}/counters",
            "source": {"format": "parquet", "path": f"{LAKE}/incoming/bumps.parquet"},
            "target_alias": "t",
            "source_alias": "s",
            "on": "t.id = s.id",
            "when_matched": [{"action": "update", "set": {"n": "t.n + s.bump"}}],
        }
    )
    wait_for(
        f"job {job_id} to start its merge",
        lambda: stack.job(job_id)["phase"] in ("preparing_source", "finding_touched_files", "writing"),
        120,
        interval=0.2,
    )
    running_on = [c for c in stack.containers("worker") if job_id in container_logs(c)]
    check(len(running_on) == 1, f"job {job_id} appears in the logs of {len(running_on)} worker containers")
    phase = stack.job(job_id)["phase"]
    check(phase != "committing" and stack.job(job_id)["status"] == "running", f"too late to kill: {phase}")
    docker("kill", running_on[0])
    print(f"  killed worker container {running_on[0][:12]} during phase {phase}", flush=True)
    job = stack.finished(job_id, timeout=900)
    check(job["attempts"] >= 2, f"the job finished in {job['attempts']} attempt(s): the kill came too late")
    dt = DeltaTable(str(table))
    merges = [h for h in dt.history() if h["version"] > version_before]
    check(len(merges) == 1, f"{len(merges)} commits after the kill test: {merges}")
    counts = dt.to_pyarrow_table(columns=["n"]).column("n").value_counts().to_pylist()
    check(counts == [{"values": 1, "counts": COUNTER_ROWS}], f"counters after one merge: {counts}")
    docker("start", running_on[0])
    return job_id


def no_executors_is_visible(stack: Stack) -> None:
    """Without Spark workers, a merge worker says why it is not ready, and its metric reads 0 executors."""
    worker = stack.containers("worker")[0]
    stack.compose("stop", "spark-worker")
    try:
        ready = wait_for(
            "a worker to report that Spark has no executors",
            lambda: "no executors" in json.dumps(r := stack.worker_readiness(worker)) and r,
            180,
        )
        print(f"  worker /readyz: {ready['checks']}", flush=True)
        check(stack.worker_metric(worker, "merge_spark_executors") == 0, "merge_spark_executors is not 0")
    finally:
        stack.compose("start", "spark-worker")
    wait_for("the workers to see executors again", lambda: stack.worker_metric(worker, "merge_spark_executors"), 300)


def restart_keeps_state(stack: Stack, jobs: dict[str, str]) -> None:
    table = stack.lake_dir() / "customers"
    version = DeltaTable(str(table)).version()
    stack.compose("down", capture=False)
    stack.up_healthy()
    for name, job_id in jobs.items():
        check(stack.job(job_id)["status"] == "succeeded", f"the {name} job did not survive down/up")
    check(DeltaTable(str(table)).version() == version, "the customers table changed across down/up")
    check(len(rows(table)) == 5, "the customers table lost rows across down/up")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the stack and its volumes running")
    parser.add_argument(
        "--start-dockerd", action="store_true", help="when no dockerd answers, start one (root; stopped at the end)"
    )
    args = parser.parse_args(argv)
    daemon = start_dockerd() if args.start_dockerd else None
    if daemon is None and not docker_answers():
        raise SystemExit("compose check: no dockerd answers (--start-dockerd starts one as root)")
    stack = Stack(api_port=free_port())
    started = time.monotonic()
    timings: list[tuple[str, float]] = []

    def step(name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.monotonic()
        print(f"- {name}", flush=True)
        result = fn()
        timings.append((name, time.monotonic() - t0))
        print(f"  ok ({timings[-1][1]:.0f} s)", flush=True)
        return result

    stack.compose("down", "-v", "--remove-orphans")
    try:
        step("base images", ensure_base_images)
        step("build the image", lambda: stack.compose("build", "api", capture=False, nice=True))
        step("up, every healthcheck healthy", lambda: stack.up_healthy())
        step("the lake is writable by the service's user", lambda: check_lake_writable(stack))
        tasks_before = completed_tasks_on_executors(stack.spark_app())
        jobs = step("a structured merge and a SQL merge with CDF", lambda: structured_and_sql_merges(stack))
        step("the tasks ran on the cluster's executors", lambda: check_cluster_executors(stack, tasks_before))
        jobs["killed"] = step("a merge worker killed mid-merge", lambda: kill_a_worker_mid_merge(stack))
        step("no executors: readiness and metric say so", lambda: no_executors_is_visible(stack))
        step("down and up keep jobs and tables", lambda: restart_keeps_state(stack, jobs))
    except CheckFailed as exc:
        print(f"compose check FAILED: {exc}", file=sys.stderr)
        subprocess.run([*stack.base, "ps"], env=stack.env, check=False)
        subprocess.run([*stack.base, "logs", "--tail", "40"], env=stack.env, check=False)
        return 1
    finally:
        if not args.keep:
            subprocess.run([*stack.base, "down", "-v"], env=stack.env, capture_output=True, check=False)
        if daemon is not None and not args.keep:
            daemon.terminate()
            daemon.wait(timeout=60)
    print(f"compose check passed in {time.monotonic() - started:.0f} s")
    for name, seconds in timings:
        print(f"  {seconds:6.0f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
