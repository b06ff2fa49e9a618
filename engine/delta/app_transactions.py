"""Which commit carries an application transaction (Delta's ``txn`` action).

The snapshot knows only the latest version per application id; a retried job needs the table version that
recorded its own, so the log is read back from the newest commit until that ``txn`` is found.
"""

from __future__ import annotations

import json
import os
from typing import Any

from engine.delta.snapshot import Snapshot


def find_app_transaction_commit(snapshot: Snapshot, app_id: str, version: int) -> int | None:
    """The version whose commit recorded ``txn(app_id, version)``; None when the log no longer holds it."""
    log_dir = os.path.join(snapshot.root, "_delta_log")
    for candidate in range(snapshot.version, -1, -1):
        path = os.path.join(log_dir, f"{candidate:020d}.json")
        try:
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    if '"txn"' not in line:
                        continue
                    action = json.loads(line).get("txn")
                    if action and action.get("appId") == app_id and int(action.get("version", -1)) == version:
                        return candidate
        except FileNotFoundError:
            return None
    return None


def commit_info(snapshot: Snapshot, version: int) -> dict[str, Any]:
    """The ``commitInfo`` action of one commit ({} when the log no longer holds that commit)."""
    path = os.path.join(snapshot.root, "_delta_log", f"{version:020d}.json")
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if '"commitInfo"' in line:
                    info = json.loads(line).get("commitInfo")
                    if isinstance(info, dict):
                        return info
    except FileNotFoundError:
        return {}
    return {}
