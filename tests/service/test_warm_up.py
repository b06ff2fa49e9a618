"""A worker's warm start against a real Spark Connect server: a throwaway merge on scratch tables runs before the
worker claims its first job, readiness says so meanwhile, and nothing of it is left in the lake."""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from structlog.testing import capture_logs

import engine
from engine.warm_start import WARM_UP_GAIN, WARM_UP_PATIENCE, _small_table, still_warming
from service.jobs import NewJob, Status
from service.manager import JobManager
from service.metrics import ServiceMetrics
from service.runner import EngineRunner, warm_up_dir
from service.settings import Settings
from service.worker import Worker
from tests.e2e.harness import upsert_body
from tests.service.conftest import wait_until


class ObservedRunner(EngineRunner):
    """The real runner, noting what its readiness said while the warm-up ran and whether a job ran before it ended."""

    def __init__(self, settings: Settings, metrics: ServiceMetrics) -> None:
        super().__init__(settings, metrics)
        self.said: set[str] = set()
        self.ran_before_warm: list[str] = []
        self._stop_watching = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while not self._stop_watching.wait(0.05):
            self.said.add(self.readiness()[1])

    def run(self, job, *, txn, on_progress, tag):  # type: ignore[no-untyped-def]
        if not self.warmed.is_set():
            self.ran_before_warm.append(job.lease.job_id)
        return super().run(job, txn=txn, on_progress=on_progress, tag=tag)

    def close(self) -> None:
        self._stop_watching.set()
        super().close()


def _settings(tmp_path: Path, lake: Path, spark_remote: str, **kw: object) -> Settings:
    return Settings(
        database_url=f"sqlite:///{tmp_path / 'service.db'}",
        spark_remote=spark_remote,
        lake_roots=[str(lake)],
        poll_interval_seconds=0.05,
        **kw,  # type: ignore[arg-type]
    )


def test_the_first_job_waits_for_the_warm_up_which_leaves_nothing_behind(
    spark_remote: str, tmp_path: Path, lake: Path
) -> None:
    settings = _settings(tmp_path, lake, spark_remote)
    manager = JobManager.from_url(settings.database_url)
    manager.migrate()
    target = lake / "orders"
    write_deltalake(str(target), pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}))
    body = upsert_body(target, [{"id": 2, "v": "B"}, {"id": 3, "v": "c"}], "id BIGINT, v STRING")
    job = manager.submit(NewJob(target=str(target), target_key=str(target), spec=body, dry_run=False))[0]
    metrics = ServiceMetrics()
    runner = ObservedRunner(settings, metrics)
    worker = Worker(settings, manager=manager, runner=runner, metrics=metrics)
    worker.start()
    try:
        wait_until(lambda: manager.get(job.id).status == Status.SUCCEEDED, timeout=180, interval=0.2)
        wait_until(lambda: runner.readiness() == (True, "ok"), timeout=30, interval=0.1)
    finally:
        worker.stop()
        manager.dispose()
    assert runner.ran_before_warm == []
    assert any(said.startswith("warming up") for said in runner.said), runner.said
    seconds = metrics.registry.get_sample_value("merge_worker_warm_up_seconds")
    assert seconds is not None and not math.isnan(seconds) and seconds > 0
    assert sorted(os.listdir(lake)) == ["orders"]  # the scratch tables and their directory are gone
    assert DeltaTable(str(target)).to_pyarrow_table().sort_by("id").to_pylist() == [
        {"id": 1, "v": "a"},
        {"id": 2, "v": "B"},
        {"id": 3, "v": "c"},
    ]


def test_without_warm_up_the_worker_is_ready_at_once(spark_remote: str, tmp_path: Path, lake: Path) -> None:
    runner = EngineRunner(_settings(tmp_path, lake, spark_remote, warm_up=False))
    try:
        assert runner.warmed.is_set()
        runner.warm_up()
        wait_until(lambda: runner.readiness() == (True, "ok"), timeout=60, interval=0.1)
    finally:
        runner.close()


def test_a_warm_up_that_cannot_reach_spark_gives_up(tmp_path: Path, lake: Path) -> None:
    """Spark away at start: the warm-up gives up instead of holding the worker's first claim for ever, and
    readiness names Spark, not the warm-up."""
    settings = _settings(
        tmp_path, lake, "sc://127.0.0.1:9", spark_max_retries=0, max_attempts=1, spark_probe_interval_seconds=0.2
    )
    runner = EngineRunner(settings)
    try:
        runner.warm_up()
        assert runner.warmed.wait(60)
        ok, why = runner.readiness()
        assert not ok and "warming up" not in why
    finally:
        runner.close()


def test_the_scratch_directory_is_under_the_first_lake_root_unless_set(tmp_path: Path, lake: Path) -> None:
    assert warm_up_dir(Settings(lake_roots=[str(lake), str(tmp_path)])) == Path(os.path.realpath(lake)) / (
        "_merge_service_warm_up"
    )
    assert warm_up_dir(Settings(lake_roots=[str(lake)], warm_up_dir=str(tmp_path / "w"))) == tmp_path / "w"


def test_the_engine_warm_up_merges_both_ways(spark: object, tmp_path: Path) -> None:
    done = engine.warm_up(spark, tmp_path / "scratch")  # type: ignore[arg-type]
    assert done.seconds > 0
    assert done.rounds == ()  # no time given for the JIT's rounds: the first merges only
    assert not (tmp_path / "scratch").exists()


def test_each_round_starts_from_a_fresh_table_of_three_rows(tmp_path: Path) -> None:
    """A round merges into a table made for it, so that rounds do the same work: a table left by the round before
    (with its files and commits) is replaced, not merged on."""
    path = tmp_path / "cow"
    write_deltalake(str(path), pa.table({"id": [7], "v": ["old"]}))
    write_deltalake(str(path), pa.table({"id": [8], "v": ["old"]}), mode="append")
    for deletion_vectors in (False, True):
        table = DeltaTable(str(_small_table(path, deletion_vectors)))
        assert table.version() == (2 if deletion_vectors else 0)  # created, then the feature and the property
        rows = QueryBuilder().register("t", table).execute("SELECT id FROM t ORDER BY id").read_all()
        assert pa.table(rows)["id"].to_pylist() == [1, 2, 3]
        assert (table.metadata().configuration.get("delta.enableDeletionVectors") == "true") is deletion_vectors
        assert ("deletionVectors" in (table.protocol().writer_features or [])) is deletion_vectors


def test_the_jit_rounds_go_on_while_a_recent_round_was_clearly_the_best() -> None:
    assert all(still_warming([9.0] * n) for n in range(WARM_UP_PATIENCE + 1))  # too few rounds to judge
    # A fresh server (the rounds of one warm-up, measured): fast gains at first, then slow, uneven ones.
    cold = [
        *(0.899, 0.832, 0.761, 0.711, 0.673, 0.558, 0.49, 0.522, 0.473, 0.489, 0.474, 0.44, 0.45, 0.465, 0.418),
        *(0.399, 0.458, 0.442, 0.42, 0.355, 0.416, 0.402, 0.363, 0.352, 0.385, 0.416, 0.364, 0.404, 0.424, 0.382),
        *(0.357, 0.355, 0.377, 0.391, 0.355, 0.328, 0.345, 0.348, 0.303, 0.363, 0.357, 0.367, 0.373, 0.385, 0.312),
        *(0.343, 0.277, 0.327, 0.283, 0.311, 0.312, 0.316, 0.354, 0.408, 0.315, 0.383, 0.304, 0.383, 0.315, 0.361),
        *(0.407, 0.34, 0.314),
    ]
    assert all(still_warming(cold[:n]) for n in range(len(cold)))  # every round before the last
    assert not still_warming(cold)  # sixteen rounds since 0.277, none below 0.277 * 0.98
    # The same server a hundred rounds later: its rounds only vary and set no clear best for sixteen rounds.
    warm = [0.33, 0.313, 0.313, 0.369, 0.327, 0.287, 0.315, 0.325, 0.347, 0.321, 0.312, 0.336, 0.381, 0.371, 0.333]
    warm += [0.316, 0.306, 0.358, 0.315, 0.35, 0.297, 0.299]
    assert not still_warming(warm)
    best = min(warm[:-WARM_UP_PATIENCE])
    assert still_warming([*warm[:-1], best * WARM_UP_GAIN])  # a clear new best within the last sixteen: go on
    assert not still_warming([*warm[:-1], best * WARM_UP_GAIN + 0.001])  # a hair under the best: noise


def test_on_a_warm_server_the_jit_rounds_end_by_themselves(spark: object, tmp_path: Path) -> None:
    """The suite's server has run merges already: the rounds stop when they stop getting faster, long before the
    time allowed, and leave nothing behind."""
    engine.warm_up(spark, tmp_path / "scratch")  # type: ignore[arg-type]
    done = engine.warm_up(spark, tmp_path / "scratch", max_seconds=600)  # type: ignore[arg-type]
    assert len(done.rounds) >= 2
    assert not still_warming(list(done.rounds))  # ended by the rule, not by the time
    assert done.seconds < 600
    assert not (tmp_path / "scratch").exists()


def test_the_runner_gives_the_rounds_the_time_its_settings_allow(spark_remote: str, tmp_path: Path, lake: Path) -> None:
    runner = EngineRunner(_settings(tmp_path, lake, spark_remote, warm_up_seconds=600), ServiceMetrics())
    try:
        with capture_logs() as logs:
            runner.warm_up()
            assert runner.warmed.wait(600)
    finally:
        runner.close()
    (said,) = [entry for entry in logs if entry["event"] == "warmed up with throwaway merges"]
    assert len(said["rounds"]) >= 2 and 0 < said["seconds"] < 600
    assert os.listdir(lake) == []
