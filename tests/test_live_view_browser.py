"""The live view in a real browser (headless Chromium from the distribution, driven by
selenium) against a real ``quanta run`` under load: the numbers on the page are ``/metrics``'.

Two tenants keep five long requests going with two running at a time (the vtc policy, so the
tenants' counters show), so the running and waiting counts hold still while the page is read.
Set QUANTA_LIVE_VIEW_SCREENSHOT=path to keep the screenshot (docs/live-view.png is one).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server_process import ServerProcess, start_server
from tests.tenancy_setup import ADMIN_KEY, fresh_db

pytestmark = pytest.mark.model

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
MAX_RUNNING = 2
CLIENTS = 5


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("no Chromium here (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1500,1100"):
        options.add_argument(flag)
    # The distribution's driver, named: selenium never looks for (or fetches) one of its own.
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[tuple[ServerProcess, list[str]]]:
    db = fresh_db()
    keys = [db.create_key("alice"), db.create_key("bob")]
    env = {"QUANTA_POLICY": "vtc", "QUANTA_MAX_RUNNING": str(MAX_RUNNING)}
    # 4 slots of 2,048 tokens: the block map's 8,192 cells; a 1,500-token request fits a slot
    flags = ("--n-ctx", "2048", "--n-seq-max", "4", "--threads", "1", "--grace", "2")
    proc = start_server(*flags, db=db, env=env)
    try:
        proc.wait_ready()
        yield proc, keys
    finally:
        proc.stop()


def load(url: str, key: str, stop: threading.Event, n: int) -> None:
    """Long requests, one after another, until ``stop`` (or the server goes)."""
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {key}"}) as c:
        model = c.get("/v1/models").json()["data"][0]["id"]
        body = {
            "model": model,
            "prompt": f"Request {n}: tell a long story.",
            "max_tokens": 1500,
            "ignore_eos": True,
        }
        while not stop.is_set():
            try:
                c.post("/v1/completions", json=body, timeout=None)
            except httpx.HTTPError:
                return


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    found = re.findall(r"^(vllm:[a-z_]+)(?:\{[^}]*\})? (\S+)$", text, re.M)
    return {k: float(v) for k, v in found}


def page_values(browser: Any) -> dict[str, float]:
    def value(element_id: str) -> float:
        return float(browser.find_element(By.ID, element_id).get_attribute("data-value"))

    return {
        "updates": float(browser.find_element(By.TAG_NAME, "body").get_attribute("data-updates")),
        "running": value("running"),
        "waiting": value("waiting"),
        "kv": value("kv-usage"),
    }


def next_update(browser: Any, after: float, timeout_s: float = 15.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        updates = browser.find_element(By.TAG_NAME, "body").get_attribute("data-updates")
        if updates is not None and float(updates) > after:
            return page_values(browser)
        time.sleep(0.05)
    raise AssertionError("the page did not update")


def test_the_page_shows_what_metrics_says_under_load(
    browser: Any, server: tuple[ServerProcess, list[str]]
) -> None:
    proc, keys = server
    browser.get(f"{proc.url}/admin/ui/")
    wait = WebDriverWait(browser, 20)
    browser.find_element(By.ID, "key").send_keys("not the key")
    browser.find_element(By.ID, "sign-in").click()
    error = wait.until(lambda b: b.find_elements(By.ID, "error"))
    assert "not the admin key" in error[0].text
    browser.find_element(By.ID, "key").send_keys(ADMIN_KEY)
    browser.find_element(By.ID, "sign-in").click()
    wait.until(lambda b: b.title == "Quanta · live view")

    stop = threading.Event()
    clients = [
        threading.Thread(target=load, args=(proc.url, keys[i % 2], stop, i), daemon=True)
        for i in range(CLIENTS)
    ]
    for t in clients:
        t.start()
    try:
        deadline = time.monotonic() + 60
        after = 0.0
        while time.monotonic() < deadline:  # until the load has filled the running set
            seen = next_update(browser, after)
            after = seen["updates"]
            if seen["running"] == MAX_RUNNING and seen["waiting"] == CLIENTS - MAX_RUNNING:
                break
        before = next_update(browser, after)
        scraped = metrics(proc.url)
        later = next_update(browser, before["updates"])
        for page in (before, later):
            assert page["running"] == scraped["vllm:num_requests_running"] == MAX_RUNNING
            assert page["waiting"] == scraped["vllm:num_requests_waiting"] == CLIENTS - MAX_RUNNING
        # KV only grows while the same two requests run: the scrape lies between the reads
        assert before["kv"] <= scraped["vllm:kv_cache_usage_perc"] <= later["kv"]
        assert later["kv"] > 0

        blocks = browser.find_elements(By.CSS_SELECTOR, "#blocks .blk")
        assert len(blocks) == 8192 // 16
        active = len(browser.find_elements(By.CSS_SELECTOR, "#blocks .blk.a, #blocks .blk.s"))
        updates_now = browser.find_element(By.TAG_NAME, "body").get_attribute("data-updates")
        if updates_now == str(int(later["updates"])):  # the map is the one of that read
            assert active / len(blocks) == pytest.approx(later["kv"])
        rows = browser.find_elements(By.CSS_SELECTOR, "#running-set tbody tr")
        assert len(rows) == MAX_RUNNING
        tenants = {
            row.find_elements(By.TAG_NAME, "td")[0].text
            for row in browser.find_elements(By.CSS_SELECTOR, "#tenants tbody tr")
        }
        assert tenants == {"alice", "bob"}  # by name, as /metrics labels them
        decisions = browser.find_elements(By.CSS_SELECTOR, "#decisions tbody tr")
        assert decisions and "queued behind" in browser.find_element(By.ID, "decisions").text
        assert browser.find_element(By.ID, "step-ms").text.endswith("ms")
        shot = os.environ.get("QUANTA_LIVE_VIEW_SCREENSHOT")
        if shot:
            browser.save_screenshot(shot)
        # signing out: the form again, and the view's data closed to this browser
        browser.find_element(By.ID, "logout").click()
        wait.until(lambda b: b.find_elements(By.ID, "key"))
        browser.get(f"{proc.url}/admin/ui/state")
        assert "invalid_admin_key" in browser.page_source
    finally:
        stop.set()
