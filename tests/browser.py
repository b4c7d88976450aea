"""A real headless Chromium for the tests of every page ragsieve writes or serves.

Debian's ``chromium`` and ``chromedriver`` (``make browser``, run by ``make test``) driven
by selenium, with the driver's path given so that Selenium Manager never goes online.
Pages are loaded with a ``file://`` URL (reports) or from a real server on 127.0.0.1.
The browser is offline by design: a page that fetches anything from the network shows it
as a failed request in :func:`network_requests`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["chrome", "network_requests", "screenshot", "set_headers"]


def _binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(
        f"none of {names} is on PATH: the browser tests need Debian's chromium and "
        "chromium-driver (run `make browser`, or apt-get install chromium chromium-driver)."
    )


@pytest.fixture(scope="session")
def chrome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A headless Chromium (selenium WebDriver), one per test session, performance log on."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _binary("chromium", "chromium-browser", "google-chrome")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1600", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--metrics-recording-only", "--no-proxy-server",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    service = Service(executable_path=_binary("chromedriver"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(60)
    driver.execute_cdp_cmd("Network.enable", {})
    driver.get("about:blank")
    network_requests(driver)  # drop the start page's own requests
    try:
        yield driver
    finally:
        driver.quit()


def set_headers(driver: Any, headers: dict[str, str]) -> None:
    """Send ``headers`` with every request the page makes (DevTools protocol)."""
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": headers})


_INTERNAL = ("chrome:", "chrome-untrusted:", "chrome-extension:", "devtools:", "data:", "about:")


def network_requests(driver: Any) -> list[str]:
    """The URLs the page requested since the last call (drains the performance log).

    Chromium's own pages and inline ``data:`` URLs are left out: what remains is what the
    page fetched from files or the network.
    """
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if not url.startswith(_INTERNAL):
                urls.append(url)
    return urls


def screenshot(driver: Any, path: Path) -> Path:
    """Save a PNG of the page and return its path (a test checks it is a real image)."""
    driver.save_screenshot(str(path))
    return path
