"""The admin tab in a real headless browser (Debian chromium + chromedriver, driven by selenium).

The screenshot is kept as a test artifact (TTS_TEST_ARTIFACTS, default ./artifacts) and is the
one the README shows. .ci/run installs the browser and sets CHORUS_REQUIRE_TOOLS=1, so in CI a
missing browser fails the test instead of skipping it.
"""

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from bench.server import ROOT, start_server
from tests.serve import require_tools

TOKEN = "browser-admin-token"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
ARTIFACTS = Path(os.environ.get("TTS_TEST_ARTIFACTS", ROOT / "artifacts"))


@pytest.fixture(scope="module")
def browser():
    require_tools("chromium", "chromedriver", install="apt-get install chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def admin_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("browser"), admin_token=TOKEN, calibration_sizes="1")
    yield server.base_url
    server.stop()


def test_admin_tab_renders_live_charts(browser, admin_server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    for text in ("Some traffic for the charts.", "A second request, a little longer than the first."):
        httpx.post(f"{admin_server}/v1/audio/speech", timeout=60,
                   json={"model": "tts-1", "voice": "alloy", "input": text})
    wait = WebDriverWait(browser, 30)
    browser.get(admin_server + "/")
    tab = wait.until(ready.element_to_be_clickable((By.XPATH, "//button[@role='tab' and contains(., 'Admin')]")))
    tab.click()
    token = wait.until(ready.visibility_of_element_located((By.CSS_SELECTOR, "input[type='password']")))
    token.send_keys(TOKEN)
    browser.find_element(By.XPATH, "//button[contains(., 'Sign in')]").click()
    wait.until(lambda driver: len(driver.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")) >= 8)
    wait.until(ready.text_to_be_present_in_element((By.ID, "degrade-state"), "load score"))
    time.sleep(2)  # let a few timer ticks draw the series
    titles = browser.execute_script(
        "return [...document.querySelectorAll('.js-plotly-plot .gtitle')].map(t => t.textContent)")
    assert {"Batch size", "Queue length", "Throughput", "Latency", "Streams: time to first audio", "Cache hit rate",
            "Job backlog", "GPU"} <= set(titles)
    assert "normal" in browser.find_element(By.ID, "degrade-state").text

    # The form changes a threshold in the running server, and the audit log shows it.
    field = browser.find_element(By.XPATH, "//label[contains(., 'cap text chars')]//input")
    field.clear()
    field.send_keys("250")
    browser.find_element(By.XPATH, "//button[contains(., 'Save settings')]").click()
    wait.until(lambda driver: "Saved and applied: cap_text_chars" in driver.page_source)
    settings = httpx.get(f"{admin_server}/admin/api/settings", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert settings["settings"]["cap_text_chars"] == 250
    wait.until(lambda driver: "admin-ui" in driver.page_source)  # the audit table
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "admin.png"))

