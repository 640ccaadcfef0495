"""On a fresh install (the bundled Piper voice only, which cannot clone), the "Clone a voice" panel offers no form,
only a line a person reads saying why; it offered an empty model list, and Clone answered a toast "model '' does
not exist" while the Voice picker showed a red "Error" badge. In a real headless browser (as test_ui_browser)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.server import start_server
from tests.integration.test_ui_browser import FAILED, open_page
from tests.pocket_models import build_tiny_pocket
from tts_core.audio.encoding import encode

pytestmark = pytest.mark.slow  # a server and a browser


@pytest.fixture(scope="module")
def fresh_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("ui-clone-panel"), calibration_sizes="1",
                          operator_defaults=json.dumps({"anonymous_tier": "free"}))
    yield server.base_url
    server.stop()


def test_a_server_that_cannot_clone_says_why_and_offers_no_form(browser, fresh_server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready

    wait = open_page(browser, fresh_server)
    panel = browser.find_element(By.XPATH, "//*[contains(@class, 'label-wrap')][contains(., 'Clone a voice')]")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", panel)
    panel.click()
    line = wait.until(ready.visibility_of_element_located((By.ID, "clone-unavailable")))
    assert "Cloning is not available on this server" in line.text and "Pocket TTS or VibeVoice" in line.text
    assert "docs/voices.md" in line.text
    clone_buttons = browser.find_elements(By.ID, "clone-voice")
    assert not any(button.is_displayed() for button in clone_buttons)  # nothing to press that must fail
    model_fields = browser.find_elements(By.XPATH, "//*[contains(text(), 'Model (one that can clone)')]")
    assert not [field for field in model_fields if field.is_displayed()]
    assert browser.execute_script(FAILED) == 0  # no toast, no "Error" badge on the Voice picker


BADGES = """return [...document.querySelectorAll('[data-testid="status-tracker"] .error')].map(
  badge => badge.closest('.block') ? badge.closest('.block').innerText.slice(0, 60) : '')"""
TOASTS = """return [...document.querySelectorAll('[data-testid="toast-body"]')].map(toast => toast.innerText)"""


@pytest.fixture(scope="module")
def cloning_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ui-clone-form")
    pocket = build_tiny_pocket(folder / "tiny-pocket")
    registry = folder / "voices.yaml"
    registry.write_text(f"voices:\n  pocket: {{engine: pocket_tts, model: '{pocket}', fixed_length: true}}\n")
    server = start_server(folder / "data", voices_file=str(registry), device="cpu", calibration_sizes="1",
                          torch_threads="1", operator_defaults=json.dumps({"anonymous_tier": "free"}))
    yield server.base_url
    server.stop()


def test_where_a_model_clones_the_form_is_offered_and_a_refusal_marks_only_the_panel(browser, cloning_server,
                                                                                      tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready

    wait = open_page(browser, cloning_server)
    panel = browser.find_element(By.XPATH, "//*[contains(@class, 'label-wrap')][contains(., 'Clone a voice')]")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", panel)
    panel.click()
    button = wait.until(ready.visibility_of_element_located((By.ID, "clone-voice")))
    assert not [line for line in browser.find_elements(By.ID, "clone-unavailable") if line.is_displayed()]
    silent = tmp_path / "silent.wav"
    silent.write_bytes(encode(np.zeros(4 * 16000, np.float32), 16000, "wav"))
    browser.find_element(By.CSS_SELECTOR, "input[type=file]").send_keys(str(silent))
    browser.find_element(By.XPATH, "//label[contains(., 'Voice name')]//textarea | "
                                   "//label[contains(., 'Voice name')]//input").send_keys("quiet")
    browser.find_element(By.XPATH, "//label[contains(., 'The speaker consents')]//input").click()
    wait.until(ready.presence_of_element_located(  # uploaded: the clip offers its file back
        (By.CSS_SELECTOR, "[data-testid='waveform-Clip'] [data-testid='download-link']")))
    button.click()
    wait.until(lambda driver: driver.execute_script(TOASTS))
    assert any("silent" in toast for toast in browser.execute_script(TOASTS)), browser.execute_script(TOASTS)
    badges = browser.execute_script(BADGES)
    assert not [badge for badge in badges if "Voice" in badge], badges  # the Voice picker is not marked failed
