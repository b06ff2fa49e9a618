"""findTouchedFiles folded into writeAllChanges (the single pass): taken when the candidate files hold few rows
or the key statistics expect every candidate file to be touched, kept only when that held, and otherwise redone
as Delta's two passes would have done it: results against deltalake's merge, files against the log."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from engine import executors, run_merge, single_pass
from engine.errors import MultipleMatchError
from tests.engine.harness import (
    COUNTS,
    clause,
    find_plan,
    join_plan,
    make_spec,
    oracle_merge,
    rows,
    stray_files,
    write_table,
)
from tests.engine.test_cdf import CDF, changes

FILES = 4
ROWS_PER_FILE = 500

# A single pass given up is followed by Delta's two passes, each reporting its phase again.
PHASES_AFTER_A_GIVEN_UP_SINGLE_PASS = [
    "preparing_source",
    "finding_touched_files",
    "writing",
    "finding_touched_files",
    "writing",
    "committing",
]


def _target(path: Path, configuration: dict[str, str] | None = None) -> Path:
    """FILES files of consecutive, dense ids: the statistics of each file bound a range its rows fill."""
    for i in range(FILES):
        ids = list(range(i * ROWS_PER_FILE, (i + 1) * ROWS_PER_FILE))
        data = pa.table({"id": pa.array(ids, pa.int64()), "v": [f"t{k}" for k in ids]})
        write_deltalake(str(path), data, mode="append", configuration=configuration if i == 0 else None)
    return path


def _source(ids: Sequence[int | None]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"s{k}" for k in ids]})


def _merge_both(
    spark: SparkSession,
    tmp_path: Path,
    source_ids: list[int],
    clauses: list[Any],
    on: str = "t.id = s.id",
    configuration: dict[str, str] | None = None,
    phases: list[str] | None = None,
) -> tuple[Any, dict[str, int], Path, Path]:
    ours, theirs = _target(tmp_path / "ours", configuration), _target(tmp_path / "theirs", configuration)
    source_data = _source(source_ids)
    source = write_table(tmp_path / "source", source_data)
    result = run_merge(
        spark, make_spec(ours, source, on, clauses), on_progress=None if phases is None else phases.append
    )
    expected = oracle_merge(theirs, source_data, on, clauses)
    return result, expected, ours, theirs


def _no_find_pass() -> Any:
    return patch.object(
        executors.ClassicMergeExecutor,
        "find_touched_files",
        side_effect=AssertionError("the single pass should have found the touched files"),
    )


def _statistics_only() -> Any:
    """The single pass taken only where the key statistics expect it, however few rows the candidates hold."""
    return patch.object(single_pass, "SINGLE_PASS_MAX_GUESSED_ROWS", 0)


UPSERT = [clause("matched", "update_all"), clause("notMatched", "insert_all")]

# An equality of strings: no key statistics to guess from.
TEXT_KEYS = "CAST(t.id AS STRING) = CAST(s.id AS STRING)"


def test_taken_when_statistics_expect_every_file_touched(spark: SparkSession, tmp_path: Path) -> None:
    # 200 existing keys spread over all four files and 50 new ones past them: about 60 per file.
    existing = list(range(0, FILES * ROWS_PER_FILE, 10))
    new = list(range(FILES * ROWS_PER_FILE, FILES * ROWS_PER_FILE + 50))
    with _statistics_only(), _no_find_pass():
        result, expected, ours, theirs = _merge_both(spark, tmp_path, existing + new, UPSERT)
    assert {k: result.result[k] for k in COUNTS} == expected
    assert expected == {"num_updated_rows": 200, "num_deleted_rows": 0, "num_inserted_rows": 50}
    assert rows(ours) == rows(theirs)
    m = result.metrics
    assert m["numTargetFilesRemoved"] == FILES
    assert m["numTargetRowsCopied"] == FILES * ROWS_PER_FILE - 200
    assert m["numSourceRows"] == 250
    assert m["numSourceRowsInSecondScan"] == 250
    assert m["numOutputRows"] == FILES * ROWS_PER_FILE + 50
    assert m["scanTimeMs"] == 0
    assert stray_files(ours) == set()


def test_delete_in_one_pass(spark: SparkSession, tmp_path: Path) -> None:
    with _no_find_pass():
        result, expected, ours, theirs = _merge_both(
            spark, tmp_path, list(range(0, FILES * ROWS_PER_FILE, 7)), [clause("matched", "delete")]
        )
    assert {k: result.result[k] for k in COUNTS} == expected
    assert rows(ours) == rows(theirs)
    assert result.metrics["numTargetFilesRemoved"] == FILES
    assert stray_files(ours) == set()


def test_not_matched_by_source_takes_it_whatever_the_keys(spark: SparkSession, tmp_path: Path) -> None:
    """NOT MATCHED BY SOURCE clauses touch every candidate file, so the single pass needs no key statistics nor
    a plain key equality: three source keys, and ON with a conjunct over both sides."""
    clauses = [clause("matched", "update_all"), clause("notMatchedBySource", "delete", "t.id % 2 = 0")]
    with _no_find_pass():
        result, expected, ours, theirs = _merge_both(
            spark, tmp_path, [3, 700, 5000], clauses, on="t.id = s.id AND t.v <> s.v"
        )
    assert expected["num_updated_rows"] == 2
    assert {k: result.result[k] for k in COUNTS} == expected
    assert rows(ours) == rows(theirs)
    assert result.metrics["numTargetFilesRemoved"] == FILES
    assert stray_files(ours) == set()


def test_not_taken_when_files_would_stay_untouched(spark: SparkSession, tmp_path: Path) -> None:
    # 40 keys over four files of 500: ten per file, too few to expect every file touched.
    ids = list(range(0, FILES * ROWS_PER_FILE, 50))
    with (
        _statistics_only(),
        patch.object(
            single_pass,
            "write_in_one_pass",
            side_effect=AssertionError("the statistics do not promise every file touched"),
        ),
    ):
        result, expected, ours, theirs = _merge_both(spark, tmp_path, ids, UPSERT)
    assert {k: result.result[k] for k in COUNTS} == expected
    assert rows(ours) == rows(theirs)


def test_small_candidates_take_it_whatever_the_keys(spark: SparkSession, tmp_path: Path) -> None:
    """Candidates of few rows in all are rewritten in one pass on a guess, with no key statistics to go by: a
    key in each file and a new one, ON an equality of strings."""
    assert FILES * ROWS_PER_FILE <= single_pass.SINGLE_PASS_MAX_GUESSED_ROWS
    phases: list[str] = []
    with _no_find_pass():
        result, expected, ours, theirs = _merge_both(
            spark, tmp_path, [3, 700, 1200, 1800, 5000], UPSERT, on=TEXT_KEYS, phases=phases
        )
    assert expected == {"num_updated_rows": 4, "num_deleted_rows": 0, "num_inserted_rows": 1}
    assert {k: result.result[k] for k in COUNTS} == expected
    assert rows(ours) == rows(theirs)
    assert phases == ["preparing_source", "finding_touched_files", "writing", "committing"]
    m = result.metrics
    assert m["numTargetFilesRemoved"] == FILES
    assert m["numTargetRowsCopied"] == FILES * ROWS_PER_FILE - 4
    assert m["scanTimeMs"] == 0
    assert stray_files(ours) == set()


@pytest.mark.parametrize(
    ("source_ids", "removed"),
    [([3, 5000], 1), ([5000, 5001], 0)],
    ids=["one_file_touched", "none_touched"],
)
def test_small_candidates_wrong_guess(spark: SparkSession, tmp_path: Path, source_ids: list[int], removed: int) -> None:
    """A guess that left files untouched is discarded: only the touched file is rewritten, or with none touched
    the inserts are written alone, and nothing of the discarded write stays."""
    with _no_find_pass():
        result, expected, ours, theirs = _merge_both(spark, tmp_path, source_ids, UPSERT, on=TEXT_KEYS)
    assert {k: result.result[k] for k in COUNTS} == expected
    assert rows(ours) == rows(theirs)
    assert result.metrics["numTargetFilesRemoved"] == removed
    assert result.metrics["numTargetRowsCopied"] == removed * (ROWS_PER_FILE - 1)
    assert stray_files(ours) == set()


def test_small_candidates_not_taken_when_a_match_may_touch_nothing(spark: SparkSession, tmp_path: Path) -> None:
    """A matched-only merge whose clauses all have conditions may match rows it leaves alone: the touched files
    cannot be told from the matches, so the two passes run."""
    clauses = [clause("matched", "update_all", "s.v = 'none'")]
    with patch.object(single_pass, "write_in_one_pass", side_effect=AssertionError("a match may touch nothing")):
        result, expected, ours, theirs = _merge_both(spark, tmp_path, [3, 700, 1200, 1800], clauses)
    assert {k: result.result[k] for k in COUNTS} == expected
    assert rows(ours) == rows(theirs)
    assert result.metrics["numTargetFilesRemoved"] == 0


@pytest.mark.parametrize(
    ("on", "touched"),
    [
        ("t.id = s.id", 1),
        ("t.id = s.id AND s.v = 'none'", 0),
    ],
    ids=["one_file_touched", "none_touched"],
)
def test_wrong_guess_rewrites_only_touched_files(spark: SparkSession, tmp_path: Path, on: str, touched: int) -> None:
    """Observed as the target's rows stream past (no key bitmap), the single pass knows which files it touched."""
    # Keys in the first file only, plus two new keys that keep every file a candidate.
    source_ids = [*range(0, 100), 5000, 5001]
    phases: list[str] = []
    with find_plan("single_pass"), join_plan(broadcast=True), _no_find_pass():
        result, expected, ours, theirs = _merge_both(spark, tmp_path, source_ids, UPSERT, on, phases=phases)
    assert {k: result.result[k] for k in COUNTS} == expected
    # The discarded pass found the touched files: the rewrite of those is still the writing phase.
    assert phases == ["preparing_source", "finding_touched_files", "writing", "committing"]
    assert rows(ours) == rows(theirs)
    m = result.metrics
    assert m["numTargetFilesRemoved"] == touched
    assert m["scanTimeMs"] > 0  # the discarded pass is what found the touched files
    assert m["numTargetRowsCopied"] == touched * ROWS_PER_FILE - expected["num_updated_rows"]
    assert stray_files(ours) == set()
    # The discarded write left nothing behind, not even an empty folder.
    live = [Path(uri.removeprefix("file://")).relative_to(ours) for uri in DeltaTable(str(ours)).file_uris()]
    live_folders = {path.parts[0] for path in live if len(path.parts) > 1}
    assert {p.name for p in ours.iterdir() if p.is_dir()} <= {"_delta_log", *live_folders}


def test_wrong_guess_counted_on_held_rows_falls_back_to_two_passes(spark: SparkSession, tmp_path: Path) -> None:
    """Counted on the target rows the key bitmap holds, the single pass knows how many files it touched but
    not which: a wrong guess is followed by Delta's two passes."""
    source_ids = [*range(0, 100), 5000, 5001]
    phases: list[str] = []
    with find_plan("single_pass"), join_plan(broadcast=True, key_bitmap="held"):
        result, expected, ours, theirs = _merge_both(spark, tmp_path, source_ids, UPSERT, phases=phases)
    assert {k: result.result[k] for k in COUNTS} == expected
    assert phases == PHASES_AFTER_A_GIVEN_UP_SINGLE_PASS
    assert rows(ours) == rows(theirs)
    m = result.metrics
    assert m["numTargetFilesRemoved"] == 1
    assert m["numTargetRowsCopied"] == ROWS_PER_FILE - expected["num_updated_rows"]
    assert stray_files(ours) == set()


@pytest.mark.parametrize("key_bitmap", [False, True], ids=["plain", "key_bitmap"])
def test_multiple_matches_fail_after_the_write_is_discarded(
    spark: SparkSession, tmp_path: Path, key_bitmap: bool
) -> None:
    target = _target(tmp_path / "t")
    ids = list(range(0, FILES * ROWS_PER_FILE, 5))
    source = write_table(tmp_path / "s", _source([*ids, 40]))
    before = rows(target)
    with (
        find_plan("single_pass"),
        join_plan(broadcast=True, key_bitmap="held" if key_bitmap else None),
        pytest.raises(MultipleMatchError) as info,
    ):
        run_merge(spark, make_spec(target, source, "t.id = s.id", UPSERT))
    assert "id=40" in str(info.value)
    assert rows(target) == before
    assert DeltaTable(str(target)).version() == FILES - 1
    assert stray_files(target) == set()
    assert sorted(p.name for p in target.iterdir() if p.is_dir()) == ["_delta_log"]


def test_duplicate_keys_of_an_unconditional_delete_delete_once(spark: SparkSession, tmp_path: Path) -> None:
    ids = list(range(0, FILES * ROWS_PER_FILE, 5))
    phases: list[str] = []
    with find_plan("single_pass"):
        result, _, ours, theirs = _merge_both(
            spark, tmp_path, [*ids, 40, 45], [clause("matched", "delete")], phases=phases
        )
    assert result.result["num_deleted_rows"] == len(ids)
    # The multiple match gave up the single pass before it knew the touched files: Delta's two passes follow.
    assert phases == PHASES_AFTER_A_GIVEN_UP_SINGLE_PASS
    assert result.metrics["numTargetRowsMatchedDeleted"] == len(ids)
    assert rows(ours) == rows(theirs)
    assert stray_files(ours) == set()


def test_partitioned_target(spark: SparkSession, tmp_path: Path) -> None:
    data = pa.table(
        {"id": pa.array(range(400), pa.int64()), "v": [f"t{k}" for k in range(400)], "p": [k % 3 for k in range(400)]}
    )
    ours = write_table(tmp_path / "ours", data, partition_by=["p"])
    theirs = write_table(tmp_path / "theirs", data, partition_by=["p"])
    source_data = pa.table(
        {"id": pa.array([*range(0, 400, 4), 900, 901], pa.int64()), "v": ["new"] * 102, "p": [1] * 102}
    )
    source = write_table(tmp_path / "source", source_data)
    with find_plan("single_pass"), _no_find_pass():
        result = run_merge(spark, make_spec(ours, source, "t.id = s.id", UPSERT))
    expected = oracle_merge(theirs, source_data, "t.id = s.id", UPSERT)
    assert {k: result.result[k] for k in COUNTS} == expected
    assert rows(ours) == rows(theirs)
    assert stray_files(ours) == set()


PLAN_DEPENDENT = {
    "numTargetFilesAdded",
    "numTargetBytesAdded",
    "numTargetPartitionsAddedTo",
    "scanTimeMs",
    "rewriteTimeMs",
    "executionTimeMs",
    "materializeSourceTimeMs",
}
"""What the plan may change: how the added rows are split into files, and where the time went."""


@pytest.mark.parametrize(
    ("on", "clauses"),
    [
        ("t.id = s.id", UPSERT),
        ("t.id = s.id", [clause("matched", "delete")]),
        (
            "t.id = s.id AND s.id % 3 <> 0",
            [
                clause("matched", "update", "t.id % 2 = 0", v="concat(t.v, s.v)"),
                clause("matched", "delete"),
                clause("notMatched", "insert", "s.id % 5 <> 0", id="s.id", v="'new'"),
            ],
        ),
        (
            "t.id <=> s.id",
            [
                clause("matched", "update_all", "s.v <> 's40'"),
                clause("matched", "delete"),
                clause("notMatched", "insert_all"),
            ],
        ),
        (
            "t.id = s.id",
            [
                clause("matched", "update_all"),
                clause("notMatched", "insert_all"),
                clause("notMatchedBySource", "delete", "t.id % 3 = 0"),
                clause("notMatchedBySource", "update", v="'gone'"),
            ],
        ),
    ],
    ids=["upsert", "delete", "conditional", "null_safe", "not_matched_by_source"],
)
@pytest.mark.parametrize("join", ["broadcast", "key_bitmap", "shuffle"])
def test_same_metrics_as_two_passes(
    spark: SparkSession, tmp_path: Path, on: str, clauses: list[Any], join: str
) -> None:
    """With the key bitmap, the single pass of a merge with NOT MATCHED clauses counts its actions on the
    source rows met with the target rows the bitmap holds, and derives the copies from the rows written."""
    ids = [*range(0, FILES * ROWS_PER_FILE, 7), *range(FILES * ROWS_PER_FILE, FILES * ROWS_PER_FILE + 40), None]
    source = write_table(tmp_path / "source", _source(ids))
    results = {}
    for plan in ("single_pass", "source_keys"):
        target = _target(tmp_path / plan)
        with (
            find_plan(plan),
            join_plan(
                broadcast=join != "shuffle",  # type: ignore[arg-type]
                key_bitmap="held" if join == "key_bitmap" else None,
            ),
        ):
            results[plan] = run_merge(spark, make_spec(target, source, on, clauses))
    one, two = results["single_pass"], results["source_keys"]
    assert one.result == two.result
    assert {k: v for k, v in one.metrics.items() if k not in PLAN_DEPENDENT} == {
        k: v for k, v in two.metrics.items() if k not in PLAN_DEPENDENT
    }
    assert rows(tmp_path / "single_pass") == rows(tmp_path / "source_keys")
    assert one.metrics["scanTimeMs"] == 0


@pytest.mark.parametrize("clauses", [UPSERT, [clause("matched", "delete")]], ids=["upsert", "delete"])
@pytest.mark.parametrize("join", ["broadcast", "key_bitmap", "shuffle"])
def test_change_data_in_one_pass(spark: SparkSession, tmp_path: Path, clauses: list[Any], join: str) -> None:
    """Change Data Feed rows come out of the single pass as out of the two: the same as deltalake's. With
    the key bitmap and NOT MATCHED clauses, the pass counts its actions on the held target rows, and the
    copies come from the data rows written, never the change rows."""
    existing = list(range(0, FILES * ROWS_PER_FILE, 10))
    new = list(range(FILES * ROWS_PER_FILE, FILES * ROWS_PER_FILE + 50))
    real_pairs = single_pass.write_in_one_pass_counting_pairs
    routes: list[str] = []

    def spy_pairs(*args: Any, **kwargs: Any) -> Any:
        routes.append("pairs")
        return real_pairs(*args, **kwargs)

    with (
        _no_find_pass(),
        join_plan(broadcast=join != "shuffle", key_bitmap="held" if join == "key_bitmap" else None),
        patch.object(single_pass, "write_in_one_pass_counting_pairs", spy_pairs),
    ):
        result, expected, ours, theirs = _merge_both(spark, tmp_path, existing + new, clauses, configuration=CDF)
    assert routes == (["pairs"] if join == "key_bitmap" and clauses is UPSERT else [])
    assert {k: result.result[k] for k in COUNTS} == expected
    matched = len(existing)
    assert result.metrics["numTargetRowsCopied"] == FILES * ROWS_PER_FILE - matched
    assert result.metrics["numSourceRowsInSecondScan"] == len(existing) + len(new)
    assert rows(ours) == rows(theirs)
    assert changes(ours, ["id", "v"]) == changes(theirs, ["id", "v"])
    assert result.metrics["numTargetChangeFilesAdded"] >= 1
    assert stray_files(ours) == set()
