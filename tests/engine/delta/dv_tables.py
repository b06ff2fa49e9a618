"""Tables with deletion vectors for tests: written by deltalake, then given vectors by a hand-made commit as Delta's
DELETE with deletion vectors writes it (``remove`` of the file with its old vector, ``add`` of the same path with
the new one, statistics kept with ``tightBounds`` false). deltalake reads them back as the oracle."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder
from pyroaring import BitMap64

from engine.delta.deletion_vectors import (
    DeletionVectorDescriptor,
    inline_descriptor,
    read_deletion_vector,
    write_deletion_vector_file,
)
from engine.delta.feature_upgrade import add_features


def enable_deletion_vectors(path: str | Path) -> None:
    """Add the deletionVectors feature (reader 3 / writer 7, listing the features the metadata enables too) and
    ``delta.enableDeletionVectors`` with deltalake."""
    if "deletionVectors" not in (DeltaTable(str(path)).protocol().reader_features or []):
        add_features(path, ["deletionVectors"])
    DeltaTable(str(path)).alter.set_table_properties({"delta.enableDeletionVectors": "true"})


def _log_adds(path: Path) -> dict[str, dict[str, Any]]:
    """The live ``add`` actions by path, replayed from the JSON commits (the tables here have no checkpoint)."""
    live: dict[str, dict[str, Any]] = {}
    for name in sorted(os.listdir(path / "_delta_log")):
        if not name.endswith(".json"):
            continue
        for line in (path / "_delta_log" / name).read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "add" in action:
                live[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    return live


def delete_rows(
    path: str | Path, deletes: Mapping[str, Any], *, storage: str = "u", prefix: str = "", absolute: bool = False
) -> int:
    """Mark rows deleted: ``deletes`` maps a file's log path to the row indexes to delete (added to any vector it
    has). ``storage`` ``u`` writes one DV file for all of them (``absolute`` names it by a ``p`` path instead),
    ``i`` puts each vector in the log. Answers the commit's version."""
    root = Path(path)
    adds = _log_adds(root)
    bitmaps: dict[str, BitMap64] = {}
    for file_path, rows in deletes.items():
        old = adds[file_path].get("deletionVector")
        bitmap = BitMap64(rows)
        physical = json.loads(adds[file_path]["stats"])["numRecords"]
        if bitmap and bitmap.max() >= physical:
            raise ValueError(f"{file_path} has {physical} rows, no row index {bitmap.max()}")
        if old:
            bitmap |= read_deletion_vector(DeletionVectorDescriptor.from_json(old), str(root))
        bitmaps[file_path] = bitmap
    if storage == "i":
        descriptors = [inline_descriptor(b) for b in bitmaps.values()]
    else:
        descriptors = write_deletion_vector_file(str(root), list(bitmaps.values()), prefix=prefix)
        if absolute:
            descriptors = [
                DeletionVectorDescriptor(
                    "p", Path(d.absolute_path(str(root))).as_uri(), d.size_in_bytes, d.cardinality, d.offset
                )
                for d in descriptors
            ]
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": now, "operation": "DELETE", "operationParameters": {}}}
    ]
    for (file_path, _), descriptor in zip(bitmaps.items(), descriptors, strict=True):
        add = dict(adds[file_path])
        remove = {
            "path": file_path,
            "deletionTimestamp": now,
            "dataChange": True,
            "extendedFileMetadata": True,
            "partitionValues": add.get("partitionValues") or {},
            "size": add["size"],
        }
        if add.get("deletionVector"):
            remove["deletionVector"] = add["deletionVector"]
        stats = json.loads(add["stats"])
        stats["tightBounds"] = False
        add.update(deletionVector=descriptor.to_json(), stats=json.dumps(stats), dataChange=True)
        actions += [{"remove": remove}, {"add": add}]
    version = DeltaTable(str(root)).version() + 1
    entry = root / "_delta_log" / f"{version:020d}.json"
    with open(entry, "x") as handle:
        handle.write("\n".join(json.dumps(a) for a in actions) + "\n")
    return version


def file_paths(path: str | Path) -> list[str]:
    """The table's live files' log paths, the one with most rows first (then by path)."""
    adds = _log_adds(Path(path))
    return sorted(adds, key=lambda p: (-json.loads(adds[p]["stats"])["numRecords"], p))


def read_with_deltalake(path: str | Path, order_by: str = "id") -> pa.Table:
    """The table's live rows as delta-rs reads them (its SQL engine honours deletion vectors)."""
    table = DeltaTable(str(path))
    reader = QueryBuilder().register("t", table).execute(f"SELECT * FROM t ORDER BY {order_by}")
    return pa.table(reader.read_all())


REPO = Path(__file__).resolve().parents[3]


def kill_once_written(script: str, *args: str) -> None:
    """Run ``script`` (a merge in a process of its own) until it prints ``written`` - its files are written and its
    commit not yet made - then SIGKILL it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "written":
        proc.wait(30)
        raise AssertionError(proc.stderr.read()[-3000:] if proc.stderr else "merge process died")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
