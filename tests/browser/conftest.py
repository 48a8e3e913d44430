"""A real headless Chromium (Debian's `chromium` and `chromium-driver`) driven by selenium.

The tests here are skipped, with the reason, where Chromium or its driver is missing or cannot
start; `.ci/run` installs both where it can.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The real services and a migrated database with an API key, as the integration tests use.
from tests.integration.conftest import migrated, services  # noqa: F401

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# Nothing but the page under test: no sync, updates, QUIC probes or first-run screens.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1200,900",
)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless Chromium per module, with a fresh profile."""
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        pytest.skip(f"selenium is not installed ({exc}); `pip install -e .[test]`")
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not path.exists():
            pytest.skip(f"{path} is missing; `apt-get install -y {package}` (.ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    log = tmp_path_factory.mktemp("chromedriver") / "chromedriver.log"
    try:
        driver = webdriver.Chrome(
            service=Service(str(CHROMEDRIVER), log_output=str(log)), options=options
        )
    except WebDriverException as exc:
        first = (exc.msg or str(exc)).strip().splitlines()[0][:300]
        pytest.skip(f"headless Chromium could not start: {first}")
    try:
        yield driver
    finally:
        driver.quit()
