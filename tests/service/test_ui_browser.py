"""The operations page in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by
Selenium): sign-in, the counts for jobs in several states, a running merge's phase changing on the page without a
reload, and cancelling from the page. It saves a screenshot; with ``OPERATIONS_PAGE_SCREENSHOT=path`` set it
also writes it there (``docs/operations-page.png`` is made so)."""

from __future__ import annotations

import os
import random
import shutil
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from service.app import create_app
from service.jobs import Phase, Status
from service.manager import JobManager
from service.settings import Settings
from tests.debian import install_when_missing
from tests.service.conftest import IN_CI
from tests.service.ui_jobs import JobRow, failure, fingerprint, insert_jobs, now, set_phase

TENANT, OTHER, ADMIN = "tenant-token", "other-token", "admin-token"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


@dataclass(frozen=True)
class Chromium:
    browser: str
    driver: str


def _find_chromium() -> Chromium | None:
    browser = next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)
    driver = shutil.which("chromedriver")
    return Chromium(browser, driver) if browser and driver else None


@pytest.fixture(scope="session")
def chromium() -> Chromium:
    """Chromium and its driver from the system, installed from Debian's packages when missing and we are root."""
    try:
        install_when_missing(["chromium", "chromium-driver"], present=lambda: _find_chromium() is not None)
        found = _find_chromium()
        if found is None:
            raise RuntimeError("chromium or chromedriver not on PATH after installing chromium and chromium-driver")
    except Exception as exc:
        if IN_CI:
            pytest.fail(f"Chromium is required in CI and could not be installed: {exc}")
        pytest.skip(f"Chromium unavailable: {exc}")
    return found


@pytest.fixture
def browser(chromium: Chromium, tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium.browser
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1360,2000",
    ):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=chromium.driver))
    yield driver
    driver.quit()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    url: str
    manager: JobManager


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """The API with the page, served over real HTTP on a loopback port, over a SQLite job table."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
        lake_roots=[str(tmp_path)],
        api_tokens=[TENANT, OTHER],
        admin_tokens=[ADMIN],
    )
    manager = JobManager.from_url(settings.database_url)
    manager.migrate()
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings, manager=manager), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield Served(f"http://127.0.0.1:{port}", manager)
    server.should_exit = True
    thread.join(timeout=10)
    manager.dispose()


def history(owner: str, tables: list[str], seed: int = 7) -> list[JobRow]:
    """A day of finished merges, so the plots have something to draw."""
    rng = random.Random(seed)
    rows = []
    current = now()
    for i in range(160):
        ended = current - timedelta(minutes=9 * i + rng.randint(0, 8))
        took = rng.uniform(4, 40) * (1.6 if 40 < i < 70 else 1.0)
        failed = rng.random() < 0.06
        rows.append(
            JobRow(
                Status.FAILED if failed else Status.SUCCEEDED,
                tables[i % len(tables)],
                owner=owner,
                submitted_at=ended - timedelta(seconds=took + 2),
                started_at=ended - timedelta(seconds=took),
                finished_at=ended,
                error=failure("the source has no column 'amount' that the merge sets") if failed else None,
            )
        )
    return rows


def wait_until(driver: Any, condition: Any, seconds: float = 15) -> Any:
    """Waits out a page that is still being replaced (a form's POST and its redirect)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    def settled(d: Any) -> Any:
        # Chromium reports a node of the page being replaced as an inspector error, not as a stale element.
        try:
            return condition(d)
        except WebDriverException as e:
            if "does not belong to the document" in str(e.msg):
                return False
            raise

    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(driver, seconds, ignored_exceptions=ignored).until(settled)


def counts_on_page(driver: Any) -> dict[Status, int]:
    from selenium.webdriver.common.by import By

    return {s: int(driver.find_element(By.ID, f"count-{s.value}").text) for s in Status}


def sign_in(driver: Any, url: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{url}/ui")
    assert driver.current_url == f"{url}/ui/login"
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "sign-in").click()
    wait_until(driver, lambda d: d.current_url == f"{url}/ui" and d.find_element(By.ID, "count-queued"))


def test_the_operations_page_in_chromium(browser: Any, served: Served, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    mine, theirs = fingerprint(TENANT), fingerprint(OTHER)
    lake = "/lake/sales"
    running = JobRow(Status.RUNNING, f"{lake}/orders", owner=mine, phase=Phase.FINDING_TOUCHED_FILES)
    queued = [JobRow(Status.QUEUED, f"{lake}/orders", owner=mine) for _ in range(2)]
    done = JobRow(Status.SUCCEEDED, f"{lake}/customers", owner=mine)
    failed = JobRow(
        Status.FAILED, f"{lake}/customers", owner=mine, error=failure("column 'region' is missing from the target")
    )
    cancelled = JobRow(Status.CANCELLED, f"{lake}/customers", owner=mine)
    their_running = JobRow(Status.RUNNING, "/lake/crm/accounts", owner=theirs, phase=Phase.WRITING)
    their_queued = JobRow(Status.QUEUED, "/lake/crm/accounts", owner=theirs)
    rows = [running, *queued, done, failed, cancelled, their_running, their_queued]
    rows += history(mine, [f"{lake}/customers", f"{lake}/returns"]) + history(theirs, ["/lake/crm/contacts"], seed=3)
    insert_jobs(served.manager.engine, rows)

    sign_in(driver, served.url, TENANT)
    expected = Counter(r.status for r in rows if r.owner == mine)
    assert counts_on_page(driver) == {s: expected[s] for s in Status}
    assert driver.find_element(By.ID, f"phase-{running.id}").text == "finding_touched_files"
    page = driver.page_source
    assert "/lake/crm" not in page and their_running.id not in page, "another token's jobs are not shown"
    assert "column &#x27;region&#x27; is missing from the target" in page or "column 'region' is missing" in page

    # A worker moves the merge on: the page shows the new phase without being reloaded.
    marker = driver.execute_script("window.notReloaded = true; return window.notReloaded;")
    assert marker is True
    set_phase(served.manager.engine, running.id, Phase.WRITING)
    wait_until(driver, lambda d: d.find_element(By.ID, f"phase-{running.id}").text == "writing")
    assert driver.execute_script("return window.notReloaded === true;")

    # Cancel is offered for unfinished jobs the token may cancel, and for nothing else.
    for job in (done, failed, cancelled):
        assert not driver.find_elements(By.ID, f"cancel-{job.id}")
    assert driver.find_elements(By.ID, f"cancel-{running.id}")
    driver.find_element(By.ID, f"cancel-{queued[0].id}").click()
    one_more = str(expected[Status.CANCELLED] + 1)
    wait_until(driver, lambda d: d.find_element(By.ID, "count-cancelled").text == one_more)
    assert served.manager.get(queued[0].id).status is Status.CANCELLED
    assert counts_on_page(driver)[Status.QUEUED] == expected[Status.QUEUED] - 1
    assert served.manager.get(their_queued.id).status is Status.QUEUED

    driver.find_element(By.ID, "sign-out").click()
    wait_until(driver, lambda d: d.current_url == f"{served.url}/ui/login" and d.find_element(By.ID, "token"))
    driver.get(f"{served.url}/ui")
    assert driver.current_url == f"{served.url}/ui/login", "signing out forgets the token"

    # An admin token sees every token's jobs, with the plots over the last day.
    sign_in(driver, served.url, ADMIN)
    everyone = Counter(r.status for r in rows)
    everyone[Status.QUEUED] -= 1
    everyone[Status.CANCELLED] += 1
    assert counts_on_page(driver) == {s: everyone[s] for s in Status}
    assert driver.find_element(By.ID, f"phase-{their_running.id}").text == "writing"
    assert driver.find_element(By.ID, "plot-throughput").find_elements(By.TAG_NAME, "rect")
    assert driver.find_element(By.ID, "plot-duration").find_elements(By.TAG_NAME, "rect")

    shot = tmp_path / "operations-page.png"
    for _ in range(2):  # the window's outer size includes its frame: grow it until the page fits
        height = driver.execute_script("return document.documentElement.scrollHeight")
        inner = driver.execute_script("return window.innerHeight")
        outer = driver.get_window_size()["height"]
        driver.set_window_size(1360, int(height) + int(outer) - int(inner) + 8)
    assert driver.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    wanted = os.environ.get("OPERATIONS_PAGE_SCREENSHOT")
    if wanted:
        shutil.copyfile(shot, wanted)
