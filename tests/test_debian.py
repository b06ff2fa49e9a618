"""The suite's processes take turns at apt-get: the second waits for the first and then finds the package."""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
import time

import pytest

from tests.debian import APT_LOCK, install_when_missing

NO_SUCH_PACKAGE = "merge-service-no-such-package"
"""apt-get fails on it, so a call that reached apt-get cannot pass unseen."""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("apt-get") is None, reason="installs need root and apt-get")
def test_a_second_installer_waits_for_the_lock_and_then_finds_the_package() -> None:
    installed = threading.Event()
    outcome: list[BaseException | None] = []

    def second() -> None:
        try:
            install_when_missing([NO_SUCH_PACKAGE], present=installed.is_set)
            outcome.append(None)
        except BaseException as exc:  # the thread's failure is the test's
            outcome.append(exc)

    with open(APT_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive() and not outcome, "the second installer did not wait for the lock"
        installed.set()
        fcntl.flock(lock, fcntl.LOCK_UN)
    waiter.join(timeout=30)
    assert outcome == [None]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("apt-get") is None, reason="installs need root and apt-get")
def test_a_missing_package_apt_cannot_find_fails_the_install() -> None:
    with pytest.raises(RuntimeError, match=f"apt-get install .*{NO_SUCH_PACKAGE}.* failed"):
        install_when_missing([NO_SUCH_PACKAGE], present=lambda: False)
