"""The admin tab in a real headless browser (Debian chromium + chromedriver, driven by selenium).

The screenshot is kept as a test artifact (TTS_TEST_ARTIFACTS, default ./artifacts); docs/admin.png,
which docs/operating.md shows, is a copy of it. .ci/run installs the browser and sets
CHORUS_REQUIRE_TOOLS=1, so in CI a missing browser fails the test instead of skipping it.
"""

import os
import re
from pathlib import Path

import httpx
import pytest

from admin.charts import COST_TITLE
from bench.server import ROOT, start_server

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

TOKEN = "browser-admin-token"
ARTIFACTS = Path(os.environ.get("TTS_TEST_ARTIFACTS", ROOT / "artifacts"))


@pytest.fixture(scope="module")
def admin_server(tmp_path_factory, browser):
    server = start_server(tmp_path_factory.mktemp("browser"), admin_token=TOKEN, calibration_sizes="1")
    yield server.base_url
    browser.get("about:blank")  # an open page's connection would hold the server's graceful stop for 15 s
    server.stop()


# Each chart as plotly drew it: title, y axis (range and title), the traces' names and point counts, toolbar buttons.
CHARTS = """return [...document.querySelectorAll('.js-plotly-plot')].map(plot => ({
  title: plot._fullLayout?.title?.text, range: plot._fullLayout?.yaxis?.range,
  unit: plot._fullLayout?.yaxis?.title?.text, legend: plot._fullLayout?.legend?.y,
  traces: Object.fromEntries((plot.data || []).map(trace => [trace.name, (trace.x || []).length])),
  buttons: plot.querySelectorAll('.modebar-btn').length}))"""


def charts(browser) -> dict[str, dict]:
    return {chart["title"]: chart for chart in browser.execute_script(CHARTS)}


def sign_in(browser, url: str, wait) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready

    browser.get(url)
    tab = wait.until(ready.element_to_be_clickable((By.XPATH, "//button[@role='tab' and contains(., 'Admin')]")))
    tab.click()
    token = wait.until(ready.visibility_of_element_located((By.CSS_SELECTOR, "input[type='password']")))
    token.send_keys(TOKEN)
    browser.find_element(By.XPATH, "//button[contains(., 'Sign in')]").click()
    # 7 series, the cost model and 2 of the replicas drawn; no GPU and no autoregressive engine here: a line instead
    wait.until(lambda driver: len(charts(driver)) == 10)
    wait.until(ready.text_to_be_present_in_element((By.ID, "degrade-state"), "Load score"))


def open_section(browser, wait, name: str) -> None:
    """One of the Admin tab's own tabs (Dashboard, Settings, API keys, Voices and lexicon, Audit log)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready

    wait.until(ready.element_to_be_clickable((By.XPATH, f"//button[@role='tab' and normalize-space(.)='{name}']"))
               ).click()


@pytest.fixture(scope="module")
def served(admin_server):
    """Some traffic for the charts."""
    for text in ("Some traffic for the charts.", "A second request, a little longer than the first."):
        assert httpx.post(f"{admin_server}/v1/audio/speech", timeout=60,
                          json={"model": "tts-1", "voice": "alloy", "input": text}).status_code == 200


def test_admin_tab_on_a_phone_in_dark_mode(browser, admin_server, served):
    """390 x 844 CSS pixels, Gradio's dark theme: one chart a row, as wide as the screen, nothing wider."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True})
    try:
        sign_in(browser, admin_server + "/?__theme=dark", WebDriverWait(browser, 30))
        assert browser.execute_script("return document.querySelector('.dark') !== null")
        widths = browser.execute_script(
            "return [...document.querySelectorAll('.js-plotly-plot')].map(plot => plot.getBoundingClientRect().width)")
        assert all(300 < width <= 390 for width in widths), widths
        assert browser.execute_script("return document.documentElement.scrollWidth") <= 390
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for place, name in (("degrade-state", "admin-phone-dark.png"), ("cost-model", "admin-phone-dark-cost.png")):
            browser.execute_script(f"document.getElementById('{place}').scrollIntoView()")
            assert browser.save_screenshot(str(ARTIFACTS / name))
        the_sections_and_empty_tables_read_on_a_phone(browser, WebDriverWait(browser, 30))
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


SECTIONS = ["Dashboard", "Settings", "API keys", "Voices and lexicon", "Audit log"]


def the_sections_and_empty_tables_read_on_a_phone(browser, wait) -> None:
    """Every section's tab in sight (wrapped, none behind a "•••" menu); the empty tables say what goes there and
    how, the cloned voices that this server cannot clone; nothing wider than the screen."""
    from selenium.webdriver.common.by import By

    shown = [tab.text for tab in browser.find_elements(By.CSS_SELECTOR, "#admin-sections [role=tablist] button")]
    assert shown == SECTIONS and not browser.find_elements(By.CSS_SELECTOR, "#admin-sections .overflow-menu button")
    open_section(browser, wait, "Voices and lexicon")
    wait.until(lambda driver: "Cloning is not available on this server" in driver.page_source)
    assert "No cloned voices yet" in browser.page_source and "No entries yet" in browser.page_source
    open_section(browser, wait, "API keys")
    wait.until(lambda driver: "No API keys yet" in driver.page_source)
    assert browser.execute_script("return document.documentElement.scrollWidth") <= 390
    open_section(browser, wait, "Dashboard")


def test_admin_tab_renders_live_charts(browser, admin_server, served):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    key = httpx.post(f"{admin_server}/admin/api/keys", headers={"Authorization": f"Bearer {TOKEN}"},
                     json={"name": "browser-key", "tier": "free"}).json()
    wait = WebDriverWait(browser, 30)
    sign_in(browser, admin_server + "/", wait)
    # the cost model has the served batches as points, and the series have several points each
    wait.until(lambda driver: charts(driver)[COST_TITLE]["traces"].get("measured: served batches", 0) >= 2)
    wait.until(lambda driver: charts(driver)["Latency"]["traces"]["p50"] >= 3)
    drawn = charts(browser)
    assert {"Batch size", "Queue length", "Throughput", "Latency", "Streams: time to first audio", "Cache hit rate",
            "Job backlog", COST_TITLE, "Load score by replica", "Queue length by replica"} == set(drawn)
    assert browser.find_element(By.ID, "absent-charts").text == (
        "Not drawn: GPU: no GPU (NVML not available); Autoregressive engines: no autoregressive engine loaded; "
        "Autoregressive stages: busy share: no autoregressive engine loaded")
    # one replica here (its own database): one line each
    wait.until(lambda driver: len(charts(driver)["Load score by replica"]["traces"]) == 1)
    assert all(chart["range"][0] == 0 and chart["buttons"] == 0 and chart["unit"] for chart in drawn.values()), drawn
    assert drawn["Cache hit rate"]["range"] == [0, 1] and drawn["Latency"]["traces"]["p95"] >= 3
    assert drawn[COST_TITLE]["traces"]["predicted: one batch of n"] >= 2
    assert drawn[COST_TITLE]["legend"] < 0  # under the axes, clear of the points
    state = browser.find_element(By.ID, "degrade-state").text
    assert "normal" in state and "queue wait 0.00" in state and "“Longest queue wait (s)” in Settings" in state
    height = browser.execute_script("return document.documentElement.scrollHeight")
    print(f"Admin tab's dashboard: {height} px tall at {browser.get_window_size()['width']} px wide")
    assert height < 2600  # 4,252 px when the settings, keys, voices, lexicon and audit log were below the charts
    browser.execute_script("window.scrollTo(0, 0)")  # docs/operating.md's picture: the state and the charts
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "admin.png"))

    # A key is revoked by choosing it.
    open_section(browser, wait, "API keys")
    browser.find_element(By.CSS_SELECTOR, "#revoke-key input").click()
    wait.until(ready.element_to_be_clickable((By.XPATH, "//li[@data-testid='dropdown-option' and "
                                                        "contains(., 'browser-key')]"))).click()
    browser.find_element(By.XPATH, "//button[contains(., 'Revoke key')]").click()
    wait.until(lambda driver: f"Key {key['id']} revoked." in driver.page_source)
    keys = httpx.get(f"{admin_server}/admin/api/keys", headers={"Authorization": f"Bearer {TOKEN}"}).json()["data"]
    assert next(row for row in keys if row["id"] == key["id"])["revoked_at"]

    # The key made before signing in is in the audit log, at a time in the browser's own words (not ISO text);
    # one made here joins it without anything else being done.
    open_section(browser, wait, "Audit log")
    audit = browser.find_element(By.ID, "audit-log")
    wait.until(lambda driver: "api_key.create" in audit.text and "browser-key" in audit.text)
    moments = audit.find_elements(By.CSS_SELECTOR, "time")
    assert moments and all(moment.get_attribute("data-local") is not None for moment in moments)
    assert not any(re.search(r"\d:\d\d:\d\d(\.\d+)?(\+|Z| UTC)|\dT\d", moment.get_attribute("textContent"))
                   for moment in moments)  # no "2026-12-02T17:13:02+00:00", no UTC: the browser's zone
    open_section(browser, wait, "API keys")
    browser.find_element(By.CSS_SELECTOR, "#key-name textarea, #key-name input").send_keys("made-in-the-tab")
    browser.find_element(By.XPATH, "//button[contains(., 'Create key')]").click()
    wait.until(lambda driver: "made-in-the-tab" in driver.page_source and "copy it now" in driver.page_source)
    open_section(browser, wait, "Audit log")
    wait.until(lambda driver: "made-in-the-tab" in driver.find_element(By.ID, "audit-log").text)
    open_section(browser, wait, "Voices and lexicon")
    assert not browser.find_element(By.XPATH, "//label[contains(., 'Entry id')]//*[self::input or self::textarea]"
                                    ).get_attribute("value")

    # The form changes a threshold in the running server, and the audit log shows it.
    open_section(browser, wait, "Settings")
    field = browser.find_element(By.XPATH, "//label[contains(., 'Text cap (characters)')]//input")
    field.clear()
    field.send_keys("250")
    browser.find_element(By.XPATH, "//button[contains(., 'Save settings')]").click()
    wait.until(lambda driver: "Saved and applied: Text cap (characters)" in driver.page_source)
    settings = httpx.get(f"{admin_server}/admin/api/settings", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert settings["settings"]["cap_text_chars"] == 250
    open_section(browser, wait, "Audit log")
    wait.until(lambda driver: "cap_text_chars" in driver.find_element(By.ID, "audit-log").text
               and "admin-ui" in driver.find_element(By.ID, "audit-log").text)



TIER_CELLS = "#tier-table [role=gridcell]"


def tier_grid(browser) -> list[list[str]]:
    """The tier table's cells as shown, row by row."""
    from selenium.webdriver.common.by import By

    rows: dict[int, dict[int, str]] = {}
    for cell in browser.find_elements(By.CSS_SELECTOR, TIER_CELLS):
        rows.setdefault(int(cell.get_attribute("data-row")), {})[int(cell.get_attribute("data-col"))] = \
            cell.text.replace("⋮", "").strip()  # the selected cell shows its menu button
    return [[row[column] for column in sorted(row)] for _, row in sorted(rows.items())]


def edit_tier_cell(browser, row: int, column: int, text: str) -> None:
    """Select a cell, press Enter to edit it, replace what it holds, press Enter."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    def editing(driver) -> bool:
        """The cell's editor has the focus; if not, select the cell (found afresh: a save redraws the table, and
        a click landing while it redraws selects nothing) and press Enter again."""
        if driver.switch_to.active_element.tag_name == "textarea":
            return True
        cell = driver.find_element(By.CSS_SELECTOR, f"#tier-table [data-testid='cell-{row}-{column}']")
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", cell)
        cell.click()
        ActionChains(driver).send_keys(Keys.ENTER).perform()
        return False

    WebDriverWait(browser, 30, poll_frequency=1, ignored_exceptions=(StaleElementReferenceException,)).until(editing)
    editor = browser.switch_to.active_element
    editor.send_keys(Keys.CONTROL, "a")
    editor.send_keys(text, Keys.ENTER)


def save_settings_and_wait(browser, wait, said: str) -> None:
    from selenium.webdriver.common.by import By

    message = browser.find_element(By.ID, "settings-message")
    browser.find_element(By.XPATH, "//button[contains(., 'Save settings')]").click()
    wait.until(lambda driver: said in message.text)


@pytest.mark.timeout(900)  # some 40 steps in a browser, each waited on: 208 s in a CI run, 300+ on a busier machine
def test_tier_table_saves_and_reloads(browser, admin_server):
    """The tiers are a table (a row per tier) and the anonymous tier a choice among them: a changed cell and a
    new row are saved to the running server, and a fresh page shows them; a refusal names the column."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 30)
    sign_in(browser, admin_server + "/", wait)
    open_section(browser, wait, "Settings")
    wait.until(lambda driver: [row[0] for row in tier_grid(driver)] == ["personal", "free", "pro", "enterprise"])
    edit_tier_cell(browser, 1, 2, "7")  # free's priority
    last = browser.find_element(By.CSS_SELECTOR, "#tier-table [data-testid='cell-3-0']")
    last.click()
    last.find_element(By.CSS_SELECTOR, "button.cell-menu-button").click()
    wait.until(ready.element_to_be_clickable((By.XPATH, "//*[@role='menuitem' and normalize-space(.)='Add row below']"))
               ).click()
    wait.until(lambda driver: len(tier_grid(driver)) == 5)
    for column, text in enumerate(["studio", "5/second", "3", "2000", "", "0.25", "30"]):
        if text:
            edit_tier_cell(browser, 4, column, text)
    save_settings_and_wait(browser, wait, "Saved and applied: Caller tiers")
    read = httpx.get(f"{admin_server}/admin/api/settings", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    tiers = read["settings"]["tiers"]
    assert tiers["free"]["priority"] == 7
    assert tiers["studio"] == {"rate_limit": "5/second", "priority": 3, "max_chars": 2000, "sheddable": True,
                               "max_queue_share": 0.25, "request_timeout_s": 30.0}  # sheddable: left as Tier's

    # the new tier is one of the anonymous tier's choices once saved
    browser.find_element(By.CSS_SELECTOR, "#anonymous-tier input").click()
    wait.until(ready.element_to_be_clickable((By.XPATH, "//li[@data-testid='dropdown-option' and "
                                                        "contains(., 'studio')]"))).click()
    save_settings_and_wait(browser, wait, "Saved and applied: Tier of callers without a key")
    read = httpx.get(f"{admin_server}/admin/api/settings", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert read["settings"]["anonymous_tier"] == "studio"

    # refusals name what the form shows: the column and the tier, the field's label
    edit_tier_cell(browser, 4, 5, "2")
    save_settings_and_wait(browser, wait, "Not saved: tier studio, queue share (0 to 1) must be a number above 0 "
                                          "and at most 1")
    edit_tier_cell(browser, 4, 5, "0.25")
    threshold = browser.find_element(By.XPATH, "//label[contains(., 'Enter at load score (0 to 1)')]//input")
    threshold.clear()
    threshold.send_keys("2")
    save_settings_and_wait(browser, wait, "Not saved: Enter at load score (0 to 1) must be a number above 0 and "
                                          "at most 1")

    # a fresh page shows what was saved, not what was typed
    sign_in(browser, admin_server + "/", wait)
    open_section(browser, wait, "Settings")
    wait.until(lambda driver: len(tier_grid(driver)) == 5)
    grid = tier_grid(browser)
    assert grid[1][:3] == ["free", "10/minute", "7"]
    assert grid[4][:4] == ["studio", "5/second", "3", "2000"] and grid[4][5:] == ["0.25", "30"]
    assert browser.find_element(By.CSS_SELECTOR, "#anonymous-tier input").get_attribute("value") == "studio"
    threshold = browser.find_element(By.XPATH, "//label[contains(., 'Enter at load score (0 to 1)')]//input")
    assert threshold.get_attribute("value") == "0.85"
    open_section(browser, wait, "API keys")  # a key can be made for the new tier
    browser.find_element(By.CSS_SELECTOR, "#key-tier input").click()
    wait.until(ready.element_to_be_clickable((By.XPATH, "//li[@data-testid='dropdown-option' and "
                                                        "contains(., 'studio')]")))
