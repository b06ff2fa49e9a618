"""What a merge may run in Spark and read: the reproductions of issue 24 (F1 reflection and script transforms in
a source query, F3 globs through a symlink, F11 a log pointing outside the lake), each now refused with a clear
reason, the table unchanged and nothing of the server leaked."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from engine import RowsSource, TableSource, expression_rules, parse_merge_sql, run_merge
from engine.delta.deletion_vectors import DeletionVectorDescriptor
from engine.delta.snapshot import load_snapshot
from engine.errors import DeltaError, MergeServiceEngineError, MergeSpecError, SourceError
from engine.functions import ALLOWED_FUNCTIONS, REFUSED_FUNCTIONS
from engine.source import read_table_source
from engine.spark import SESSION_CONF
from engine.spec import QuerySource
from engine.validation import validate_spec
from tests.engine.harness import clause, make_spec, rows

SECRET_NAME = "PATH"
"""An environment variable every Spark server has; its value must never reach a table or an error."""


@pytest.fixture
def tables(lake: Path) -> tuple[Path, Path]:
    target = lake / "target"
    source = lake / "source"
    write_deltalake(str(target), pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", "b"]}))
    write_deltalake(str(source), pa.table({"id": pa.array([2, 3], pa.int64()), "name": ["B", "c"]}))
    return target, source


def merge_sql(target: Path, using: str, *, update: str = "UPDATE SET *") -> str:
    return (
        f"MERGE INTO delta.`{target}` AS t USING {using} AS s ON t.id = s.id "
        f"WHEN MATCHED THEN {update} WHEN NOT MATCHED THEN INSERT *"
    )


def refused(spark: SparkSession, sql: str, *, dry_run: bool = False) -> MergeServiceEngineError:
    """The error a SQL merge fails with, whether at parsing or at run time."""
    with pytest.raises(MergeServiceEngineError) as info:
        run_merge(spark, parse_merge_sql(sql), dry_run=dry_run)
    return info.value


def assert_nothing_leaked(error: BaseException) -> None:
    secret = os.environ[SECRET_NAME]
    assert secret not in str(error)


@pytest.mark.parametrize(
    "select",
    [
        "SELECT CAST(2 AS BIGINT) AS id, reflect('java.lang.System', 'getenv', '{name}') AS name",
        "SELECT CAST(2 AS BIGINT) AS id, `reflect`('java.lang.System', 'getenv', '{name}') AS name",
        "SELECT CAST(2 AS BIGINT) AS id, builtin.reflect('java.lang.System', 'getenv', '{name}') AS name",
        "SELECT CAST(2 AS BIGINT) AS id, java_method('java.lang.System', 'getenv', '{name}') AS name",
        "SELECT CAST(2 AS BIGINT) AS id, try_reflect('java.lang.System', 'getenv', '{name}') AS name",
        "WITH c AS (SELECT reflect('java.lang.System', 'getenv', '{name}') AS v) SELECT CAST(2 AS BIGINT) AS id, "
        "v AS name FROM c",
        "SELECT CAST(2 AS BIGINT) AS id, (SELECT max(reflect('java.lang.System', 'getenv', '{name}'))) AS name",
        "SELECT CAST(2 AS BIGINT) AS id, x AS name FROM VALUES (1) AS v(a) "
        "LATERAL VIEW explode(array(reflect('java.lang.System', 'getenv', '{name}'))) e AS x",
        "SELECT CAST(2 AS BIGINT) AS id, '${{env:{name}}}' AS name",
        "SELECT CAST(2 AS BIGINT) AS id, CAST(user AS STRING) AS name",
    ],
)
def test_a_source_query_cannot_read_the_server_environment(
    spark: SparkSession, tables: tuple[Path, Path], select: str
) -> None:
    """F1: reflection (in any spelling, at any depth of the query) once wrote the service's secrets into the
    table; variable substitution and ``user`` read the server's environment and identity."""
    target, _ = tables
    before = rows(target)
    error = refused(spark, merge_sql(target, f"({select.format(name=SECRET_NAME)})"))
    assert isinstance(error, MergeSpecError)
    assert "not allowed" in str(error)
    assert_nothing_leaked(error)
    assert rows(target) == before
    assert DeltaTable(str(target)).version() == 0


def test_a_dry_run_cannot_leak_through_an_error(spark: SparkSession, tables: tuple[Path, Path]) -> None:
    """F1: ``CAST(reflect(... 'getenv' ...) AS INT)`` once failed the cast with the secret in the error text."""
    target, _ = tables
    select = f"SELECT CAST(reflect('java.lang.System', 'getenv', '{SECRET_NAME}') AS INT) AS id, 'x' AS name"
    error = refused(spark, merge_sql(target, f"({select})"), dry_run=True)
    assert "reflect()" in str(error) and "Java methods" in str(error)
    assert_nothing_leaked(error)


def test_a_source_query_cannot_stop_spark(spark: SparkSession, tables: tuple[Path, Path]) -> None:
    """F1: ``reflect('java.lang.System', 'exit', 1)`` once killed the Spark Connect server."""
    target, _ = tables
    error = refused(spark, merge_sql(target, "(SELECT reflect('java.lang.System', 'exit', 1) AS id, 'x' AS name)"))
    assert "reflect()" in str(error)
    assert spark.sql("SELECT 1 AS one").collect()[0].one == 1


def test_a_script_transform_is_refused(spark: SparkSession, tables: tuple[Path, Path], tmp_path: Path) -> None:
    """``SELECT TRANSFORM(...) USING 'command'`` runs a shell command on the Spark server."""
    target, source = tables
    marker = tmp_path / "ran"
    select = f"SELECT TRANSFORM(id, name) USING 'touch {marker}; cat' AS (id BIGINT, name STRING) FROM delta.`{source}`"
    error = refused(spark, merge_sql(target, f"({select})"))
    assert "script transforms" in str(error)
    assert not marker.exists()
    assert DeltaTable(str(target)).version() == 0


@pytest.mark.parametrize(
    ("where", "field"),
    [
        ({"on": "t.id = s.id AND reflect('java.lang.System', 'getenv', 'PATH') IS NOT NULL"}, "on"),
        ({"set": "'${env:PATH}'"}, "when_matched[0].set.name"),
        ({"set": "java_method('java.lang.System', 'getenv', 'PATH')"}, "when_matched[0].set.name"),
        ({"set": "xpath_string('<a/>', 'a')"}, "when_matched[0].set.name"),
        ({"set": "input_file_name()"}, "when_matched[0].set.name"),
        ({"set": "no_such_function(s.name)"}, "when_matched[0].set.name"),
        ({"condition": "current_user() = 'root'"}, "when_matched[0].condition"),
        ({"condition": "session_user = 'root'"}, "when_matched[0].condition"),
    ],
)
def test_merge_expressions_are_held_to_the_allowlist(tmp_path: Path, where: dict[str, str], field: str) -> None:
    spec = make_spec(
        tmp_path / "t",
        tmp_path / "s",
        where.get("on", "t.id = s.id"),
        [clause("matched", "update", where.get("condition"), name=where.get("set", "s.name"))],
    )
    with pytest.raises(MergeSpecError, match="not allowed") as info:
        validate_spec(spec)
    assert str(info.value).startswith(f"{field}: ")


def test_what_spark_runs_is_the_checked_text(tmp_path: Path) -> None:
    """Comments go, and functions come back as the checked tree regenerates them."""
    spec = make_spec(
        tmp_path / "t",
        tmp_path / "s",
        "t.id = s.id /* a comment */",
        [clause("matched", "update", "ifnull(s.name, '') <> '' -- another", name="upper(s.name)")],
    )
    checked = validate_spec(spec)
    assert checked.on == "t.id = s.id"
    assert checked.matched[0].condition == "COALESCE(s.name, '') <> ''"
    assert checked.matched[0].action.set == {"name": "UPPER(s.name)"}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("SELECT IDENTIFIER('reflect')('a')", "identifier()"),
        ("SELECT upper('a') FROM t USING 'cat'", "script transforms"),
        ("SELECT user", "unqualified"),
        ("SELECT `current_user`", "unqualified"),
        ("SELECT system.builtin.upper('a')", "qualified function names"),
        ("SELECT '${system:user.name}'", "substitutes variables"),
    ],
)
def test_the_text_check_reads_as_spark_reads(text: str, why: str) -> None:
    with pytest.raises(MergeSpecError, match="not allowed") as info:
        expression_rules.check_spark_text(text, "sql")
    assert why in str(info.value)


@pytest.mark.parametrize(
    "select",
    [
        "SELECT * FROM range(3)",
        "SELECT * FROM IDENTIFIER('delta.`/etc`')",
        "SELECT id FROM spark_catalog.default.t",
        "SELECT id FROM global_temp.v",
        "SELECT /*+ BROADCAST(s) */ s.id FROM delta.`{source}` s",
        "SELECT id FROM delta.`{source}` TABLESAMPLE (50 PERCENT)",
        "WITH RECURSIVE c AS (SELECT 1 AS id) SELECT * FROM c",
        "WITH c(id) AS (SELECT 1) SELECT * FROM c",
        # A CTE is in scope only inside its WITH, and in a CTE only those defined before it: anything else
        # would be a catalog table.
        "SELECT * FROM (WITH c AS (SELECT 1 AS id) SELECT * FROM c) a, c",
        "WITH a AS (SELECT * FROM b), b AS (SELECT 1 AS id) SELECT * FROM a",
        "WITH a AS (SELECT * FROM a) SELECT * FROM a",
    ],
)
def test_a_source_query_reads_only_tables_by_path_ctes_and_values(tables: tuple[Path, Path], select: str) -> None:
    target, source = tables
    with pytest.raises(MergeSpecError):
        validate_spec(parse_merge_sql(merge_sql(target, f"({select.format(source=source)})")))


def test_a_legitimate_source_query_runs(spark: SparkSession, tables: tuple[Path, Path], lake: Path) -> None:
    """CTEs, subqueries, lateral views, VALUES, window and aggregate functions and several paths still work."""
    target, source = tables
    pq.write_table(pa.table({"id": pa.array([3], pa.int64())}), lake / "keep.parquet")
    select = (
        f"WITH src AS (SELECT id, name FROM delta.`{source}`), "
        "ranked AS (SELECT id, name, row_number() OVER (PARTITION BY id ORDER BY name) AS rn FROM src) "
        "SELECT r.id, upper(r.name) AS name FROM ranked r "
        "LATERAL VIEW explode(array(1)) e AS one "
        f"WHERE r.rn = e.one AND r.id IN (SELECT id FROM parquet.`{lake / 'keep.parquet'}` UNION ALL "
        "SELECT a FROM VALUES (2) AS v(a)) "
        "AND EXISTS (SELECT 1 FROM src s2 GROUP BY s2.id HAVING count(*) >= 1)"
    )
    result = run_merge(spark, parse_merge_sql(merge_sql(target, f"({select})")))
    assert (result.result["num_updated_rows"], result.result["num_inserted_rows"]) == (1, 1)
    assert rows(target) == [(1, "a"), (2, "B"), (3, "C")]


def test_the_session_does_not_substitute_variables(spark: SparkSession) -> None:
    """Spark replaces ``${env:NAME}`` in SQL text with the server's environment unless told not to."""
    assert SESSION_CONF["spark.sql.variable.substitute"] == "false"
    assert spark.sql("SELECT '${env:PATH}' AS v").collect()[0].v == "${env:PATH}"


def test_the_allowlist_leaves_out_what_reaches_outside_the_data() -> None:
    assert not ALLOWED_FUNCTIONS & REFUSED_FUNCTIONS.keys()
    assert {"upper", "coalesce", "explode", "row_number", "sum", "transform", "named_struct"} <= ALLOWED_FUNCTIONS


def test_every_allowed_function_is_one_spark_has(spark: SparkSession) -> None:
    """The list is Spark's own, less what is refused: no name Spark would look up elsewhere."""
    builtins = {row[0] for row in spark.sql("SHOW FUNCTIONS").collect()}
    assert builtins >= ALLOWED_FUNCTIONS
    assert REFUSED_FUNCTIONS.keys() <= builtins


# --- F3: globs ---------------------------------------------------------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside the lake, with a secret file, and a symlink to it under the lake root."""
    secret = tmp_path / "outside"
    secret.mkdir()
    pq.write_table(pa.table({"id": pa.array([2], pa.int64()), "name": ["SECRET"]}), secret / "secret.parquet")
    return secret


@pytest.mark.parametrize("path", ["{lake}/*/secret.parquet", "{lake}/li?k/secret.parquet", "{lake}/{{link}}"])
def test_a_glob_through_a_symlink_is_refused(spark: SparkSession, lake: Path, outside: Path, path: str) -> None:
    """F3: Hadoop once expanded ``/lake/*/secret.parquet`` through ``/lake/link -> /outside``."""
    os.symlink(outside, lake / "link")
    source = TableSource(format="parquet", path=path.format(lake=lake))
    with pytest.raises(SourceError, match="glob character"):
        read_table_source(spark, source, [str(lake)])


def test_a_glob_in_a_merge_fails_the_merge_and_keeps_the_table(
    spark: SparkSession, tables: tuple[Path, Path], lake: Path, outside: Path
) -> None:
    target, _ = tables
    os.symlink(outside, lake / "link")
    error = refused(spark, merge_sql(target, f"parquet.`{lake}/*/secret.parquet`"))
    assert "glob" in str(error)
    assert "SECRET" not in [r[1] for r in rows(target)]
    assert DeltaTable(str(target)).version() == 0


def test_a_symlink_inside_a_source_directory_is_refused(spark: SparkSession, lake: Path, outside: Path) -> None:
    """Spark lists a directory's files through symlinks: a link under a source directory cannot lead out."""
    folder = lake / "files"
    folder.mkdir()
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "name": ["ok"]}), folder / "part-0.parquet")
    os.symlink(outside, folder / "more")
    with pytest.raises(MergeServiceEngineError, match="symlink out of the lake"):
        read_table_source(spark, TableSource(format="parquet", path=str(folder)), [str(lake)])
    (folder / "more").unlink()
    assert read_table_source(spark, TableSource(format="parquet", path=str(folder)), [str(lake)]).count() == 1


# --- F11: a log pointing outside the lake --------------------------------------------------------------------


def point_log_outside(table: Path, outside_file: Path) -> None:
    """A commit replacing the table's file with an absolute ``file://`` add outside its directory, as anyone
    who can write the lake could forge."""
    dt = DeltaTable(str(table))
    live = pa.table(dt.get_add_actions()).to_pylist()
    size = outside_file.stat().st_size
    actions = [{"remove": {"path": a["path"], "deletionTimestamp": 1, "dataChange": True}} for a in live]
    actions.append(
        {
            "add": {
                "path": outside_file.as_uri(),
                "partitionValues": {},
                "size": size,
                "modificationTime": 1,
                "dataChange": True,
            }
        }
    )
    version = dt.version() + 1
    (table / "_delta_log" / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def test_a_log_that_points_outside_the_lake_is_refused(spark: SparkSession, tmp_path: Path, lake: Path) -> None:
    """F11: a table under the lake whose log adds an absolute ``file://`` path outside every lake root."""
    secret_table = tmp_path / "elsewhere"
    write_deltalake(str(secret_table), pa.table({"id": pa.array([1], pa.int64()), "name": ["SECRET"]}))
    secret_file = next(secret_table.glob("*.parquet"))
    target = lake / "target"
    write_deltalake(str(target), pa.table({"id": pa.array([1], pa.int64()), "name": ["a"]}))
    point_log_outside(target, secret_file)
    version = DeltaTable(str(target)).version()
    spec = dataclasses.replace(
        make_spec(target, lake, "t.id = s.id", [clause("matched", "update", name="concat(t.name, s.name)")]),
        source=RowsSource(rows=[{"id": 1, "name": "!"}], schema="id BIGINT, name STRING"),
        lake_roots=(str(lake),),
    )
    with pytest.raises(MergeServiceEngineError, match="outside the table's directory") as info:
        run_merge(spark, spec)
    assert str(secret_file) in str(info.value)
    assert "SECRET" not in str(info.value)
    assert DeltaTable(str(target)).version() == version


def test_a_delta_source_whose_log_points_outside_is_refused(spark: SparkSession, tmp_path: Path, lake: Path) -> None:
    secret_table = tmp_path / "elsewhere"
    write_deltalake(str(secret_table), pa.table({"id": pa.array([1], pa.int64()), "name": ["SECRET"]}))
    source = lake / "source"
    write_deltalake(str(source), pa.table({"id": pa.array([1], pa.int64()), "name": ["a"]}))
    point_log_outside(source, next(secret_table.glob("*.parquet")))
    with pytest.raises(MergeServiceEngineError, match="outside the table's directory"):
        read_table_source(spark, TableSource(format="delta", path=str(source)), [str(lake)]).collect()


def test_a_log_may_name_files_in_another_lake_root(spark: SparkSession, tmp_path: Path, lake: Path) -> None:
    """Absolute paths inside the lake roots (as a shallow clone has) are read; confinement is to the lake."""
    other_root = tmp_path / "lake2"
    shared = other_root / "shared"
    write_deltalake(str(shared), pa.table({"id": pa.array([7], pa.int64()), "name": ["shared"]}))
    source = lake / "clone"
    write_deltalake(str(source), pa.table({"id": pa.array([1], pa.int64()), "name": ["a"]}))
    point_log_outside(source, next(shared.glob("*.parquet")))
    df = read_table_source(spark, TableSource(format="delta", path=str(source)), [str(lake), str(other_root)])
    assert [tuple(r) for r in df.collect()] == [(7, "shared")]
    shutil.rmtree(other_root)


def test_a_symlinked_data_file_cannot_lead_out(spark: SparkSession, tmp_path: Path, lake: Path) -> None:
    secret_table = tmp_path / "elsewhere"
    write_deltalake(str(secret_table), pa.table({"id": pa.array([1], pa.int64()), "name": ["SECRET"]}))
    source = lake / "source"
    write_deltalake(str(source), pa.table({"id": pa.array([1], pa.int64()), "name": ["a"]}))
    data = next(source.glob("*.parquet"))
    data.unlink()
    os.symlink(next(secret_table.glob("*.parquet")), data)
    with pytest.raises(MergeServiceEngineError, match="outside the table's directory"):
        read_table_source(spark, TableSource(format="delta", path=str(source)), [str(lake)]).collect()


def test_a_query_source_built_in_code_is_checked_too(spark: SparkSession, tables: tuple[Path, Path]) -> None:
    """The engine checks a QuerySource itself, whoever built it."""
    target, _ = tables
    spec = dataclasses.replace(
        make_spec(target, target, "t.id = s.id", [clause("matched", "update_all")]),
        source=QuerySource(query="SELECT reflect('java.lang.System', 'getenv', 'PATH') AS id"),
    )
    with pytest.raises(MergeSpecError, match="reflect"):
        run_merge(spark, spec)


def add_deletion_vector(table: Path, descriptor: dict[str, object]) -> None:
    """A commit giving the table's file a deletion vector (protocol 3/7 with the deletionVectors feature)."""
    dt = DeltaTable(str(table))
    (live,) = pa.table(dt.get_add_actions()).to_pylist()
    actions = [
        {
            "protocol": {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": ["deletionVectors"],
                "writerFeatures": ["deletionVectors"],
            }
        },
        {"remove": {"path": live["path"], "deletionTimestamp": 1, "dataChange": True}},
        {
            "add": {
                "path": live["path"],
                "partitionValues": {},
                "size": live["size_bytes"],
                "modificationTime": 1,
                "dataChange": True,
                "deletionVector": {**descriptor, "offset": 1, "sizeInBytes": 10, "cardinality": 1},
            }
        },
    ]
    version = dt.version() + 1
    (table / "_delta_log" / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


@pytest.mark.parametrize(
    "descriptor",
    [
        {"storageType": "p", "pathOrInlineDv": "file://{outside}"},
        # ``u``: a directory prefix before the UUID, here one that climbs out of the table.
        {"storageType": "u", "pathOrInlineDv": "../../../..{outside_dir}/ab^-aqEH.-t@S}K{vb[*k^"},
    ],
)
def test_a_deletion_vector_outside_the_lake_is_never_opened(
    tmp_path: Path, lake: Path, descriptor: dict[str, str]
) -> None:
    """F11: deltalake opens every deletion vector file to tell whether a table has any; one named outside the
    lake is refused before that."""
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"not a deletion vector")
    table = lake / "t"
    write_deltalake(str(table), pa.table({"id": pa.array([1], pa.int64())}))
    value = descriptor["pathOrInlineDv"].replace("{outside}", str(secret)).replace("{outside_dir}", str(tmp_path))
    add_deletion_vector(table, {**descriptor, "pathOrInlineDv": value})
    with pytest.raises(DeltaError, match="outside the table's directory") as info:
        load_snapshot(str(table), lake_roots=[str(lake)])
    assert "not a deletion vector" not in str(info.value)


def test_a_deletion_vector_in_the_table_is_no_path_error(lake: Path) -> None:
    table = lake / "t"
    write_deltalake(str(table), pa.table({"id": pa.array([1], pa.int64())}))
    add_deletion_vector(table, {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^"})
    assert load_snapshot(str(table), lake_roots=[str(lake)]).has_deletion_vectors


def test_deletion_vector_paths_follow_the_protocol() -> None:
    """The example of Delta's PROTOCOL.md: ``ab^-aqEH.-t@S}K{vb[*k^`` relative to a table."""

    def path(storage: str, value: str) -> str:
        return DeletionVectorDescriptor(storage, value, size_in_bytes=40, cardinality=6).absolute_path("/t")

    assert path("u", "ab^-aqEH.-t@S}K{vb[*k^") == "/t/ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    assert path("p", "file:///x/dv.bin") == "/x/dv.bin"
    inline = DeletionVectorDescriptor("i", "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L", 40, 6)
    assert inline.is_inline
