"""Each peer's merge runs in a process of its own, so that its peak memory is its own: a job file in, a result file
out (``python -m bench.merge --child PEER JOB``)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

Peer = str
"""``engine``, ``deltars`` or ``delta`` (Delta on Spark)."""


def _runner(peer: Peer, op: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    from bench.merge import peer_delta, peer_deltars, peer_engine

    modules = {"engine": peer_engine, "deltars": peer_deltars, "delta": peer_delta}
    return getattr(modules[peer], op)  # type: ignore[no-any-return]


def child_main(peer: Peer, job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    out = _runner(peer, job.get("op", "merge"))(job)
    Path(job["out"]).write_text(json.dumps(out, default=str))
    return 0


def run_child(peer: Peer, job: dict[str, Any], workdir: Path, tag: str) -> dict[str, Any]:
    job_path = workdir / f"job-{tag}-{peer}.json"
    out_path = workdir / f"out-{tag}-{peer}.json"
    log_path = workdir / f"log-{tag}-{peer}.txt"
    out_path.unlink(missing_ok=True)
    job_path.write_text(json.dumps({**job, "out": str(out_path)}))
    with open(log_path, "wb") as log:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.merge", "--child", peer, str(job_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            check=False,
        )
    if proc.returncode != 0 or not out_path.exists():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        return {"status": "error", "error": f"{peer} process exited with code {proc.returncode}:\n{tail}"}
    return dict(json.loads(out_path.read_text()))
