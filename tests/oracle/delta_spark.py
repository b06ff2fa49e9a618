"""Delta Lake on Spark itself, the system the engine implements, prepared once into a cache and started for tests.

Delta's releases follow Spark's: the newest Delta (4.4.0 on Maven Central) is built for Spark 4.2, while the
product's client is pyspark 4.3. So the cache holds a virtualenv with the pyspark 4.2.0 wheel (its jars are the
Spark the Connect server runs) and Delta's own jars fetched from Maven Central with ``mvn``. The server speaks
Spark Connect on loopback; the product's 4.3 Connect client drives it (SQL, reads, ``DESCRIBE HISTORY``,
``table_changes``), so the tests talk to both Sparks the same way.

``python -m tests.oracle.delta_spark`` (``make delta-spark``) prepares the cache; the ``delta_spark`` fixture does
the same on first use. ``MERGE_DELTA_SPARK_CACHE`` moves the cache (default
``~/.cache/merge-service/delta-spark``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine.spark_server import SERVER_CONF, SparkProcess, _spawn, free_port

SPARK_VERSION = "4.2.0"
DELTA_VERSION = "4.4.0"
SCALA_VERSION = "2.13"
# Delta 4.x publishes one artifact per Spark minor version: delta-spark_<spark major.minor>_<scala>.
DELTA_ARTIFACTS = (
    f"io.delta:delta-spark_{SPARK_VERSION.rsplit('.', 1)[0]}_{SCALA_VERSION}:{DELTA_VERSION}",
    f"io.delta:delta-storage:{DELTA_VERSION}",
)
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
# The dependency plugin's ``get`` goal needs no project; Maven's default binding (2.8) does.
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

DELTA_CONF: Mapping[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


class RegistryUnreachableError(RuntimeError):
    """Maven Central (or PyPI) cannot be reached, so the cache cannot be filled."""


def cache_dir() -> Path:
    configured = os.environ.get("MERGE_DELTA_SPARK_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "merge-service" / "delta-spark"


@dataclass(frozen=True)
class DeltaSparkHome:
    """What a prepared cache holds: a Spark home from the pyspark wheel and Delta's jars."""

    spark_home: Path
    jars: tuple[Path, ...]


def _artifact_path(repo: Path, coordinate: str) -> Path:
    group, artifact, version = coordinate.split(":")
    return repo.joinpath(*group.split("."), artifact, version, f"{artifact}-{version}.jar")


def maven_central_reachable(timeout: float = 10.0) -> bool:
    group, artifact, version = DELTA_ARTIFACTS[0].split(":")
    url = f"{MAVEN_CENTRAL}/{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.pom"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, TimeoutError, OSError):
        return False


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One preparer at a time: concurrent test runs share the cache."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(args: list[str], what: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        if not maven_central_reachable():
            raise RegistryUnreachableError(f"{what} failed and Maven Central is unreachable:\n{done.stderr[-2000:]}")
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def _prepare_spark(root: Path) -> Path:
    venv = root / f"pyspark-{SPARK_VERSION}"
    stamp = venv / ".installed"
    if not stamp.exists():
        shutil.rmtree(venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(venv)], "creating the pyspark virtualenv")
        _run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"pyspark=={SPARK_VERSION}"],
            f"pip install pyspark=={SPARK_VERSION}",
        )
        stamp.touch()
    homes = list(venv.glob("lib/python*/site-packages/pyspark"))
    if len(homes) != 1:
        raise RuntimeError(f"no single pyspark package in {venv}: {homes}")
    return homes[0]


def _prepare_jars(root: Path) -> tuple[Path, ...]:
    jars_dir = root / f"delta-{DELTA_VERSION}-spark-{SPARK_VERSION}" / "jars"
    repo = root / "m2"
    jars: list[Path] = []
    for coordinate in DELTA_ARTIFACTS:
        jar = jars_dir / _artifact_path(repo, coordinate).name
        if not jar.exists():
            if shutil.which("mvn") is None:
                raise RuntimeError("Delta's jars are fetched with Maven: install it (e.g. 'apt-get install maven').")
            _run(
                [
                    "mvn",
                    "--batch-mode",
                    "--quiet",
                    f"-Dmaven.repo.local={repo}",
                    f"{DEPENDENCY_PLUGIN}:get",
                    f"-Dartifact={coordinate}",
                    "-Dtransitive=false",
                ],
                f"mvn dependency:get {coordinate}",
            )
            jars_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(_artifact_path(repo, coordinate), jar.with_suffix(".part"))
            jar.with_suffix(".part").rename(jar)
        jars.append(jar)
    return tuple(jars)


def prepare(root: Path | None = None) -> DeltaSparkHome:
    """Fill the cache once (pyspark wheel, Delta's jars); later calls only look."""
    root = root or cache_dir()
    with _locked(root):
        return DeltaSparkHome(spark_home=_prepare_spark(root), jars=_prepare_jars(root))


def start_delta_connect_server(
    home: DeltaSparkHome, *, log_dir: Path, conf: Mapping[str, str] | None = None
) -> SparkProcess:
    """A Spark Connect server of Delta's Spark with Delta's SQL extension and catalog, bound to loopback."""
    port = free_port()
    settings = {
        **SERVER_CONF,
        **DELTA_CONF,
        "spark.connect.grpc.binding.port": str(port),
        "spark.sql.warehouse.dir": str(log_dir / "warehouse"),
        **(conf or {}),
    }
    args = [
        str(home.spark_home / "bin" / "spark-submit"),
        "--class",
        "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--name",
        "Delta on Spark (test oracle)",
        "--master",
        "local[2]",
        "--jars",
        ",".join(str(j) for j in home.jars),
    ]
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    args.append("spark-internal")
    return _spawn(
        args, name="delta-spark-connect", port=port, log_dir=log_dir, env={"SPARK_HOME": str(home.spark_home)}
    )


def main() -> int:
    try:
        home = prepare()
    except RegistryUnreachableError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"Spark {SPARK_VERSION}: {home.spark_home}")
    for jar in home.jars:
        print(f"Delta jar: {jar}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
