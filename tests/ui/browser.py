"""A real browser for the run inspector: Debian's chromium and chromedriver, headless, and
the app served by uvicorn on loopback in a thread (``tests/ui/test_browser.py``,
``docs/screenshots.py``)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from agency_runtime import Store
from agency_runtime._ui import create_app
from agency_runtime._ui._server import server

if TYPE_CHECKING:
    from selenium.webdriver import Chrome

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
INSTALL = (
    "install Debian's chromium and its driver: "
    "sudo apt-get update && sudo apt-get install -y chromium chromium-driver "
    "(.ci/run does it in CI)"
)
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
    "--lang=en-US",
)


def missing_browser() -> str | None:
    """Why the browser tests cannot run here (``None``: they can)."""
    absent = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if absent:
        return f"{' and '.join(absent)} missing: {INSTALL}"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def served(store: str | Store, *, token: str | None = None) -> Iterator[str]:
    """Serve the inspector over ``store`` on 127.0.0.1 (a free port) in a thread; yields
    its base URL (``http://127.0.0.1:PORT``)."""
    port = free_port()
    uvicorn_server = server(
        create_app(store, token=token), host="127.0.0.1", port=port, log_level="warning"
    )
    thread = threading.Thread(target=uvicorn_server.run, name="agency-ui", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uvicorn_server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the inspector did not start on 127.0.0.1:{port}")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        uvicorn_server.should_exit = True
        thread.join(timeout=30)


@contextmanager
def chromium(
    profile: Path, *, width: int = 1280, height: int = 900, javascript: bool = True
) -> Iterator[Chrome]:
    """A headless chromium driven by chromedriver (nothing downloaded, no network); with
    ``javascript=False`` pages run no script at all."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    problem = missing_browser()
    if problem is not None:
        raise RuntimeError(problem)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    if not javascript:
        options.add_experimental_option(
            "prefs", {"profile.managed_default_content_settings.javascript": 2}
        )
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        driver.set_page_load_timeout(60)
        viewport(driver, width, height)
        yield driver
    finally:
        driver.quit()


def viewport(driver: Chrome, width: int, height: int) -> None:
    """Make the page's viewport exactly ``width`` by ``height`` CSS pixels."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )


def screenshot(driver: Chrome, path: Path, *, width: int = 1280, most: int = 2400) -> None:
    """Save the whole page (up to ``most`` pixels high) as a PNG."""
    viewport(driver, width, 300)  # measured in a short viewport: the content's own height
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    viewport(driver, width, max(300, min(height, most)))
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
