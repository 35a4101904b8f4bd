"""A real headless browser for the e2e tests: Debian's chromium, driven by Selenium
through Debian's chromium-driver (never a downloaded browser or driver).

``.ci/run`` installs both when absent; elsewhere a test without them is
skipped (and fails under CI=true: a browser test that silently skipped would
look green while testing nothing).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


def require_browser() -> None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if not missing:
        return
    why = f"no headless browser: {', '.join(missing)} missing (apt-get install chromium chromium-driver)"
    if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
        pytest.fail(f"CI must run the browser tests, but: {why}", pytrace=False)
    pytest.skip(why)


@contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[object]:
    """A Selenium driver of a fresh headless chromium (its own profile, removed after)."""
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="compactor-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
