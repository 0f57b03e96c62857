"""``spark-abs ui`` in a real browser, for the end-to-end tests: the app
served in a thread (werkzeug, a free loopback port), headless Chromium from
Debian's packages driven by Selenium through Debian's chromedriver (named
explicitly, so Selenium Manager downloads nothing), and screenshots of the
whole page into ``$SPARK_ABS_SCREENSHOTS`` when it names a directory (the
docs' images: ``SPARK_ABS_SCREENSHOTS=docs/images``)."""

from __future__ import annotations

import base64
import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from streaming.tools.ui.app import serve

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# headless, and nothing of Chromium's own traffic (which this machine's closed network refuses)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
WIDTH = 1360


@contextmanager
def served(app) -> Iterator[str]:
    """``app`` served on loopback while inside; its base URL."""
    server = serve(app, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, name="ui-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@contextmanager
def chromium() -> Iterator[WebDriver]:
    """Headless Chromium with a fresh profile, quit on the way out."""
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTH},900"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            yield driver
        finally:
            driver.quit()


def rows(driver: WebDriver, css: str) -> list[list[str]]:
    """The cells' text of the rows ``css`` selects, read in one go (a page
    that reloads itself meanwhile is read again)."""
    script = "return [...document.querySelectorAll(arguments[0])].map(r => [...r.cells].map(c => c.innerText.trim()))"
    return wait(driver, lambda d: d.execute_script(script, css) or None, what=f"rows {css}")


def wait(driver: WebDriver, until, timeout_s: float = 20.0, *, what: str = "the page"):
    """``until(driver)`` once it is truthy (a bounded wait that tolerates a
    page reloading); failing, the message names ``what`` and the page's text."""
    try:
        return WebDriverWait(driver, timeout_s, 0.2, ignored_exceptions=(StaleElementReferenceException,)).until(until)
    except TimeoutException:
        text = driver.execute_script("return document.body ? document.body.innerText : ''")[:600]
        raise AssertionError(
            f"{what} not seen in {timeout_s:g} s at {driver.current_url}; the page says:\n{text}"
        ) from None


def section(title: str) -> str:
    """The XPath of the rows of the table titled ``title...``."""
    return f"//section[h3[starts-with(normalize-space(.), '{title}')]]//tbody/tr"


def xpath_rows(driver: WebDriver, xpath: str) -> list[list[str]]:
    return [[c.text.strip() for c in r.find_elements(By.TAG_NAME, "td")] for r in driver.find_elements(By.XPATH, xpath)]


def screenshot(driver: WebDriver, name: str) -> Path | None:
    """The whole page, beyond the window, as ``$SPARK_ABS_SCREENSHOTS/name``
    (nothing when unset), through the DevTools protocol."""
    directory = os.environ.get("SPARK_ABS_SCREENSHOTS")
    if not directory:
        return None
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path = Path(directory) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))
    return path
