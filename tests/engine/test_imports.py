"""What importing a part of the engine loads: a process that needs the spec or the Delta layer must not pay for
Spark Connect's client (about a thousand modules and a second) before it runs a merge."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _loaded_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after ``statement``."""
    code = f"import sys\n{statement}\nimport json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


@pytest.mark.parametrize(
    "statement",
    [
        "import engine",
        "import engine.delta",
        "from engine import MergeSpec",
        "from engine import validate_spec",
        "from engine import parse_merge_sql",
        "from engine import rows_to_arrow",  # the service checks inline rows at submission
    ],
)
def test_facades_import_without_pyspark(statement: str) -> None:
    loaded = _loaded_after(statement)
    assert "pyspark" not in loaded


def test_delta_values_load_only_spark_types() -> None:
    """The Delta layer's values are typed with Spark's types, and nothing more of pyspark."""
    loaded = _loaded_after("import engine.delta.values")
    assert "pyspark.sql.types" in loaded
    assert not {m for m in loaded if m.startswith(("pyspark.sql.connect", "pandas", "grpc"))}


def test_exports_resolve_on_first_use() -> None:
    import engine
    import engine.delta

    assert engine.run_merge.__module__ == "engine.command"
    assert engine.delta.Snapshot.__module__ == "engine.delta.snapshot"
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = engine.no_such_name  # type: ignore[attr-defined]
