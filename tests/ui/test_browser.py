"""The run inspector in a real browser: Debian's headless chromium (``/usr/bin/chromium``)
driven by chromedriver through Selenium, against the app served by uvicorn on loopback.

These tests fail, never skip, when the browser is missing (``tests/ui/browser.py`` says how
to install it; ``.ci/run`` does)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agency_runtime import ResumableScope, SqliteStore, agency
from tests.ui.browser import chromium, missing_browser, served

pytestmark = pytest.mark.slow

STEPS: Counter[str] = Counter()
ROOT = Path(__file__).resolve().parents[2]


@agency.entry
async def purchase(item: str) -> dict[str, Any]:
    """Reserve, ask a human, charge."""

    async def body(s: ResumableScope) -> dict[str, Any]:
        await s.step(lambda: STEPS.update(["reserve"]) or "reserved", name="reserve")
        answer = await agency.interrupt("approve", f"Buy {item} for $12?", data={"item": item})
        if not answer.approved:
            return {"status": "rejected"}
        await s.step(lambda: STEPS.update(["charge"]) or "charged", name="charge")
        return {"status": "bought", "note": answer.value}

    return await agency.with_resumable_scope("purchase", body)


def _text_of(driver: Any, element_id: str) -> str | None:
    """The text of the element ``element_id``; ``None`` when the page's script replaced it
    between finding and reading it, which chromedriver reports as a stale element or, as
    here, as a node that "does not belong to the document" (a wait then looks again)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    try:
        text: str = driver.find_element(By.ID, element_id).text
    except WebDriverException as exc:
        if "does not belong to the document" in str(exc.msg):
            return None
        raise
    return text


@pytest.fixture
def browser_ready() -> None:
    problem = missing_browser()
    if problem is not None:
        pytest.fail(f"the browser tests need chromium: {problem}", pytrace=False)


@pytest.mark.usefixtures("browser_ready")
@pytest.mark.parametrize("javascript", [True, False], ids=["js", "no-js"])
def test_approve_a_paused_run_in_the_browser(tmp_path: Path, javascript: bool) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    STEPS.clear()
    store = SqliteStore(tmp_path / "agency.db")
    agency.run_sync(purchase, "tea", run_id="purchase-1", store=store)
    agency.run_sync(purchase, "cake", run_id="purchase-2", store=store)
    try:
        with (
            served(store) as base,
            chromium(tmp_path / "profile", javascript=javascript) as driver,
        ):
            # The page's script re-renders the run as it changes: an element found a moment
            # ago may be gone when it is read, so the waits look again instead of failing.
            wait = WebDriverWait(driver, 30, ignored_exceptions=(StaleElementReferenceException,))
            driver.get(f"{base}/runs")
            assert "agency" in driver.title
            scripted = "js" in (
                driver.find_element(By.TAG_NAME, "html").get_attribute("class") or ""
            )
            assert scripted is javascript  # app.js ran, or no script ran at all
            rows = driver.find_elements(By.CSS_SELECTOR, "table.runs tbody tr")
            assert len(rows) == 2
            assert "paused" in rows[1].text
            assert "1 question" in rows[1].text
            driver.find_element(By.LINK_TEXT, "purchase-1").click()
            wait.until(lambda d: d.find_elements(By.ID, "run-status"))
            assert driver.find_element(By.ID, "run-status").text == "paused"
            assert "Buy tea for $12?" in driver.find_element(By.ID, "interrupts").text
            driver.find_element(By.NAME, "value").send_keys("office budget")
            driver.find_element(By.ID, "approve-1").click()
            wait.until(lambda d: _text_of(d, "run-status") == "completed")
            flash = driver.find_element(By.CSS_SELECTOR, ".flash").text
            assert flash == "Approved; the run continued in this process and completed."
            assert "office budget" in driver.find_element(By.CSS_SELECTOR, ".outcome").text
            assert not driver.find_elements(By.ID, "interrupts")
            errors = [
                entry
                for entry in driver.get_log("browser")
                if entry.get("level") == "SEVERE" and "favicon" not in entry.get("message", "")
            ]
            assert errors == []  # no CSP violation, no failed asset
    finally:
        store.close()
    assert STEPS == {"reserve": 2, "charge": 1}  # the approved run did not reserve again


def test_the_screenshot_script_writes_the_readme_pngs(tmp_path: Path) -> None:
    problem = missing_browser()
    if problem is not None:
        pytest.fail(f"docs/screenshots.py needs chromium: {problem}", pytrace=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "screenshots.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for name, least in (("ui-runs.png", 450), ("ui-run.png", 1500)):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
        width, height = struct.unpack(">II", data[16:24])
        assert (width, height >= least) == (1280, True), (name, width, height)
