"""What deltalake's snapshot does not show, read from the log itself: each live file's deletion vector and
statistics' ``tightBounds``, its row tracking and clustering fields, and the table's metadata domains. The replay
starts at the newest checkpoint at or before the version (classic, multi-part, or UUID-named V2 with its sidecar
files) and applies the commits after it (PROTOCOL.md "Action Reconciliation")."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from engine.delta.actions import AddFile, DomainMetadata, Protocol
from engine.delta.deletion_vectors import DeletionVectorDescriptor, DeletionVectorError
from engine.errors import DeltaError

_CHECKPOINT_NAME = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
_COMMIT_NAME = re.compile(r"^(\d{20})\.json$")
_UUID_CHECKPOINT_NAME = re.compile(r"^(\d{20})\.checkpoint\.([0-9A-Fa-f-]{36})\.(?:json|parquet)$")
SIDECAR_DIR = "_sidecars"


_REPLAYED_FEATURES = frozenset({"deletionVectors", "rowTracking", "domainMetadata", "clustering"})
"""Features whose parts of the log deltalake does not show: deletion vectors and ``tightBounds``, the files'
``baseRowId`` / ``defaultRowCommitVersion`` / ``clusteringProvider``, and the metadata domains."""


def needs_log_replay(protocol: Protocol) -> bool:
    return bool(_REPLAYED_FEATURES & (set(protocol.reader_features or ()) | set(protocol.writer_features or ())))


@dataclass
class _Replay:
    """What the log replay keeps: per live path its deletion vector and ``tightBounds`` and its row tracking
    and clustering fields (the add's), and the live domains."""

    live: dict[str, tuple[DeletionVectorDescriptor | None, bool | None]] = field(default_factory=dict)
    file_fields: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    domains: dict[str, DomainMetadata] = field(default_factory=dict)


def with_log_replay(
    files: tuple[AddFile, ...], root: str, version: int
) -> tuple[tuple[AddFile, ...], dict[str, DomainMetadata]]:
    """``files`` with their deletion vector descriptors, ``tightBounds``, row tracking and clustering fields,
    and the table's metadata domains. deltalake's add actions show none of them, so the log is replayed for
    them: the newest checkpoint at or before ``version``, then the commits after it (PROTOCOL.md "Action
    Reconciliation": the last add or remove of a path wins, the last action of a domain wins)."""
    try:
        replayed = _replay_log(root, version)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        raise DeltaError(f"Cannot replay the log of table {root}: {type(exc).__name__}") from exc
    out = []
    for add in files:
        descriptor, tight = replayed.live.get(add.path, (None, None))
        stats = add.stats if add.stats is None or tight is None else replace(add.stats, tight_bounds=tight)
        extra = replayed.file_fields.get(add.path, {})
        out.append(
            replace(
                add,
                deletion_vector=descriptor,
                stats=stats,
                base_row_id=_optional_int(extra.get("baseRowId")),
                default_row_commit_version=_optional_int(extra.get("defaultRowCommitVersion")),
                clustering_provider=extra.get("clusteringProvider"),
            )
        )
    live_domains = {name: d for name, d in replayed.domains.items() if not d.removed}
    return tuple(out), live_domains


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _replay_log(root: str, version: int) -> _Replay:
    log_dir = os.path.join(root, "_delta_log")
    names = os.listdir(log_dir)
    start, parts = newest_checkpoint(names, version)
    state = _Replay()
    for part in parts:
        _replay_checkpoint(os.path.join(log_dir, part), state)
    for number in commit_versions(names):
        if start < number <= version:
            with open(os.path.join(log_dir, f"{number:020d}.json"), encoding="utf-8") as handle:
                for line in handle:
                    if line.strip():
                        _apply(json.loads(line), state)
    return state


def commit_versions(names: list[str]) -> list[int]:
    """The versions of the JSON commits among the log's file ``names``, in order."""
    return sorted(int(m.group(1)) for m in map(_COMMIT_NAME.match, names) if m)


def newest_checkpoint(names: list[str], version: int) -> tuple[int, list[str]]:
    """(version, part file names) of the newest complete checkpoint at or before ``version``: classic, multi-part
    or UUID-named (a V2 checkpoint, PROTOCOL.md "UUID-named checkpoint"); (-1, []) when there is none."""
    found = {v: parts for v, parts in complete_checkpoints(names).items() if v <= version}
    if not found:
        return -1, []
    best = max(found)
    return best, found[best]


def complete_checkpoints(names: list[str]) -> dict[int, list[str]]:
    """The part file names of each version's complete checkpoint among the log's file ``names``: the classic or
    multi-part checkpoint with the most parts, else a UUID-named one."""
    found: dict[tuple[int, int], list[str]] = {}
    for name in names:
        m = _CHECKPOINT_NAME.match(name)
        if m:
            found.setdefault((int(m.group(1)), int(m.group(3) or 1)), []).append(name)
    complete: dict[int, list[str]] = {}
    for (v, n), parts in sorted(found.items()):
        if len(parts) == n:
            complete[v] = sorted(parts)
    uuid_named: dict[int, list[str]] = {}
    for name in sorted(names):
        m = _UUID_CHECKPOINT_NAME.match(name)
        if m:
            uuid_named[int(m.group(1))] = [name]
    return uuid_named | complete


def _replay_checkpoint(path: str, state: _Replay) -> None:
    """The file actions and domains of one checkpoint file: its own rows and, in a V2 checkpoint, those of the
    sidecar files its ``sidecar`` actions name (PROTOCOL.md "V2 Spec")."""
    sidecars: list[Mapping[str, Any]] = []
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if not line.strip():
                    continue
                action = json.loads(line)
                if "sidecar" in action:
                    sidecars.append(action["sidecar"])
                elif "add" in action or "domainMetadata" in action:
                    _apply(action, state)
    else:
        columns = pq.read_schema(path).names
        wanted = [c for c in ("add", "domainMetadata", "sidecar") if c in columns]
        table = pq.read_table(path, columns=wanted)
        for column in ("add", "domainMetadata"):
            for body in table.column(column).to_pylist() if column in wanted else []:
                if body:
                    _apply({column: body}, state)
        sidecars = [s for s in table.column("sidecar").to_pylist() if s] if "sidecar" in wanted else []
    for sidecar in sidecars:
        _replay_checkpoint(_sidecar_path(os.path.dirname(path), str(sidecar["path"])), state)


def _sidecar_path(log_dir: str, path: str) -> str:
    """A sidecar file lives in ``_delta_log/_sidecars``; its action names it by file name (or a URI there)."""
    name = unquote(path).rsplit("/", 1)[-1]
    return os.path.join(log_dir, SIDECAR_DIR, name)


def _apply(action: Mapping[str, Any], state: _Replay) -> None:
    live = state.live
    if "domainMetadata" in action:
        domain = DomainMetadata.from_action(action["domainMetadata"])
        state.domains[domain.domain] = domain
    elif "add" in action:
        body = action["add"]
        raw = body.get("deletionVector")
        try:
            descriptor = DeletionVectorDescriptor.from_json(raw) if raw else None
        except DeletionVectorError as exc:
            raise DeltaError(f"File {body.get('path')!r} has a malformed deletion vector: {exc}") from exc
        live[body["path"]] = (descriptor, _tight_bounds(body.get("stats")))
        state.file_fields[body["path"]] = {
            k: body[k]
            for k in ("baseRowId", "defaultRowCommitVersion", "clusteringProvider")
            if body.get(k) is not None
        }
    elif "remove" in action:
        # Delta keys file actions by (path, deletion vector id): a remove cancels only the add it names, so
        # Delta's own DELETE, which writes the new add before the remove of the old vector, keeps the new one.
        body = action["remove"]
        raw = body.get("deletionVector")
        try:
            removed = DeletionVectorDescriptor.from_json(raw).unique_id if raw else None
        except DeletionVectorError as exc:
            raise DeltaError(f"File {body.get('path')!r} has a malformed deletion vector: {exc}") from exc
        current = live.get(body["path"])
        if current is not None and (current[0].unique_id if current[0] is not None else None) == removed:
            del live[body["path"]]
            state.file_fields.pop(body["path"], None)


def _tight_bounds(stats: Any) -> bool | None:
    if not isinstance(stats, str) or "tightBounds" not in stats:
        return None
    try:
        value = json.loads(stats).get("tightBounds")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, bool) else None
