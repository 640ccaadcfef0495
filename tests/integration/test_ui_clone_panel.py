"""On a fresh install (the bundled Piper voice only, which cannot clone), the "Clone a voice" panel offers no form,
only a line a person reads saying why; it offered an empty model list, and Clone answered a toast "model '' does
not exist" while the Voice picker showed a red "Error" badge. In a real headless browser (as test_ui_browser)."""

from __future__ import annotations

import json

import pytest

from bench.server import start_server
from tests.integration.test_ui_browser import FAILED, open_page

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
