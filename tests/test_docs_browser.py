"""``/docs`` renders in a real browser with no network: Swagger UI's files are the server's.

Headless Chromium (the distribution's, as the live view's test) may reach 127.0.0.1 alone:
every other host name fails to resolve. The page must still show the API's operations.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from tests.fakes import FakeDriver
from tests.server_process import free_port
from tests.tenancy_setup import fake_app, fresh_db

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture
def offline_browser() -> Iterator[Any]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("no Chromium here (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def server_url() -> Iterator[str]:
    """The real app (the fake core: the model is not the point) on uvicorn, in a thread."""
    port = free_port()
    config = uvicorn.Config(
        fake_app(fresh_db(), FakeDriver()), host="127.0.0.1", port=port, log_config=None
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz").status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(30)


def test_docs_render_with_no_network(offline_browser: Any, server_url: str) -> None:
    html = httpx.get(f"{server_url}/docs").text
    assert "http://" not in html.replace(server_url, "") and "https://" not in html
    offline_browser.get(f"{server_url}/docs")
    WebDriverWait(offline_browser, 30).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")
    )
    paths = {
        e.text.replace("\u200b", "")
        for e in offline_browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")
    }
    assert {"/v1/chat/completions", "/admin/v1/tenants", "/metrics"} <= paths
    title = offline_browser.find_element(By.CSS_SELECTOR, ".info .title").text
    assert title.startswith("Quanta")
    failed = [
        entry["message"]
        for entry in offline_browser.get_log("browser")
        if entry["level"] == "SEVERE" and "favicon" not in entry["message"]
    ]
    assert failed == []
