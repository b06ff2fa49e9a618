"""The storage a table lives on, behind one small interface chosen by the table URI's scheme (pyiceberg's
``io`` layer). Keys are ``/``-separated paths relative to the table root.

Only the local filesystem is implemented. Its put-if-absent is ``os.link`` of a fully written temporary file:
the link either creates the final name atomically or fails because it exists; readers never see a partial
commit file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
from typing import Protocol

from engine.delta.paths import normalize_table


class CommitOutcomeUnknown(OSError):
    """put_if_absent failed in a way that leaves open whether the object was created."""


TRANSIENT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ETIMEDOUT, errno.ESTALE}
)
"""Storage failures that may pass: a full disk or quota, an I/O error, a busy or stale network mount. A path that
is not a folder, or that this process may not write, stays so."""


def may_pass(exc: OSError) -> bool:
    """Whether the storage failure ``exc`` may pass, by its innermost OS error (a wrapper's cause names the real
    one: put_if_absent reports a failed staging as EIO)."""
    cause: BaseException | None = exc
    code = exc.errno
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno is not None:
            code = cause.errno
        cause = cause.__cause__
    return code in TRANSIENT_ERRNOS


class Storage(Protocol):
    root: str

    def read(self, key: str) -> bytes:
        """The object's bytes; FileNotFoundError if absent."""
        ...

    def list(self, prefix: str) -> list[str]:
        """Names directly under the ``prefix`` folder (empty if it does not exist), sorted."""
        ...

    def put_if_absent(self, key: str, data: bytes) -> None:
        """Create the object with ``data`` atomically, or raise FileExistsError if it exists.
        CommitOutcomeUnknown if it cannot tell; other OSErrors mean it was not created."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Create or replace the object with ``data``: readers see it whole or not at all. An OSError means it was
        not written, and nothing of it is left."""
        ...

    def delete(self, key: str) -> None:
        """Remove an object or a whole folder; absent is fine."""
        ...

    def exists(self, key: str) -> bool: ...


class LocalStorage:
    """Plain paths and ``file://`` URIs."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _path(self, key: str) -> str:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"Storage keys are relative to the table root: {key!r}")
        return os.path.join(self.root, *key.split("/")) if key else self.root

    def read(self, key: str) -> bytes:
        with open(self._path(key), "rb") as handle:
            return handle.read()

    def list(self, prefix: str) -> list[str]:
        try:
            return sorted(os.listdir(self._path(prefix)))
        except FileNotFoundError:
            return []

    def exists(self, key: str) -> bool:
        return os.path.exists(self._path(key))

    def delete(self, key: str) -> None:
        path = self._path(key)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)

    def put_if_absent(self, key: str, data: bytes) -> None:
        final = self._path(key)
        folder = os.path.dirname(final)
        temp = _temp_name(final)
        try:
            _stage(temp, data)
        except OSError as exc:
            # Not FileExistsError: only the final name being taken may read as "exists".
            with contextlib.suppress(OSError):
                os.remove(temp)
            raise OSError(errno.EIO, f"Cannot stage {final}: {exc}") from exc
        try:
            os.link(temp, final)
        except FileExistsError:
            raise
        except OSError as exc:
            # The link may have been made before the error surfaced (e.g. an NFS retry): look.
            try:
                with open(final, "rb") as handle:
                    landed = handle.read() == data
            except FileNotFoundError:
                raise exc from None
            except OSError as probe:
                raise CommitOutcomeUnknown(errno.EIO, f"Cannot tell whether {final} was written: {probe}") from exc
            if not landed:
                raise FileExistsError(errno.EEXIST, f"{final} exists", final) from exc
        finally:
            with contextlib.suppress(OSError):
                os.remove(temp)
        _fsync_dir(folder)

    def put(self, key: str, data: bytes) -> None:
        final = self._path(key)
        temp = _temp_name(final)
        try:
            _stage(temp, data)
            os.replace(temp, final)
        except OSError:
            with contextlib.suppress(OSError):
                os.remove(temp)
            raise
        _fsync_dir(os.path.dirname(final))


def _temp_name(final: str) -> str:
    """A hidden name beside ``final`` no other writer uses."""
    return os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.{uuid.uuid4().hex}.tmp")


def _stage(temp: str, data: bytes) -> None:
    """``data`` written whole to ``temp`` and synced to the disk, its folder made if missing."""
    os.makedirs(os.path.dirname(temp), exist_ok=True)
    with open(temp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(folder: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def storage_for(table: str) -> Storage:
    """The storage for a table location (local path or URI)."""
    _, root = normalize_table(table)
    return LocalStorage(root)
