"""The local storage behind the commit protocol: put-if-absent is atomic and exclusive."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.delta.paths import normalize_table
from engine.delta.storage import LocalStorage, storage_for


def test_local_storage_basics(tmp_path: Path) -> None:
    root = tmp_path / "a table é"
    storage = storage_for(root.as_uri())
    assert storage.root == str(root)
    assert storage.list("_delta_log") == []
    assert not storage.exists("_delta_log/0.json")
    storage.put_if_absent("_delta_log/0.json", b"first\n")
    with pytest.raises(FileExistsError):
        storage.put_if_absent("_delta_log/0.json", b"second\n")
    assert storage.read("_delta_log/0.json") == b"first\n"
    assert storage.list("_delta_log") == ["0.json"]  # no staging files left behind
    storage.put_if_absent("w/x/1.parquet", b"data")
    storage.delete("w")
    storage.delete("w")  # absent is fine
    assert not storage.exists("w")
    with pytest.raises(FileNotFoundError):
        storage.read("nothing")
    with pytest.raises(ValueError):
        storage.read("../escape")
    with pytest.raises(ValueError):
        storage.read("/absolute")


def test_put_if_absent_has_one_winner(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    winners: list[int] = []
    barrier = threading.Barrier(8)

    def attempt(n: int) -> None:
        barrier.wait()
        try:
            storage.put_if_absent("_delta_log/00000000000000000001.json", f"writer {n}\n".encode())
            winners.append(n)
        except FileExistsError:
            pass

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert storage.read("_delta_log/00000000000000000001.json") == f"writer {winners[0]}\n".encode()
    assert storage.list("_delta_log") == ["00000000000000000001.json"]


def test_table_locations_are_normalized(tmp_path: Path) -> None:
    uri, root = normalize_table(str(tmp_path / "x" / ".." / "t"))
    assert root == str(tmp_path / "t") and uri == (tmp_path / "t").as_uri()
    assert normalize_table(uri) == (uri, root)
    assert normalize_table("file:" + root) == (uri, root)
    with pytest.raises(Exception, match="local"):
        normalize_table("s3://bucket/table")
