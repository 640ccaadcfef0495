"""The Dialogue tab over HTTP (Gradio's client, as a browser's page calls it) with the real bundled voice: a script
and a voice per speaker make one recording to download, with subtitles by speaker; a bad script is refused with
its line named; in a browser, the dialogue made is kept in the tab's history, there after a reload, played again
from it."""

import pytest
from gradio_client import Client

from app import create_app
from tests.audio_check import decode
from tests.serve import serve_in_thread
from tts_core.config import Settings

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

SCRIPT = "Ann: Hello Bob, how was the trip?\nBob: Long, but the view was lovely."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    settings = Settings(data_dir=tmp_path_factory.mktemp("ui-dialogue"), calibration_sizes=[1],
                        operator_defaults={"anonymous_tier": "enterprise"})
    with serve_in_thread(create_app(settings)) as base:
        yield base


def test_the_tab_makes_one_recording_with_subtitles_by_speaker(server):
    audio, files = Client(f"{server}/", verbose=False).predict(SCRIPT, "Ann: alloy\nBob: echo", "wav",
                                                              api_name="/dialogue")
    with open(audio, "rb") as recording:
        samples, rate = decode(recording.read(), "wav")
    assert samples.size / rate > 2
    paths = [entry if isinstance(entry, str) else entry["path"] for entry in files]
    assert sorted(path.rsplit(".", 1)[1] for path in paths) == ["srt", "vtt", "wav"]
    subtitles = {path.rsplit(".", 1)[1]: open(path, encoding="utf-8").read() for path in paths
                 if not path.endswith(".wav")}
    assert "Ann: Hello Bob" in subtitles["srt"] and "<v Bob>Long" in subtitles["vtt"]


def test_a_bad_script_is_refused_naming_its_line(server):
    client = Client(f"{server}/", verbose=False)
    with pytest.raises(Exception, match="line 2"):
        client.predict("Ann: Hello.\nCid: Who?", "Ann: alloy", "wav", api_name="/dialogue")
    with pytest.raises(Exception, match="voices line 1"):
        client.predict(SCRIPT, "Ann alloy", "wav", api_name="/dialogue")


def test_the_tab_in_a_browser(server, browser):
    """A person opens the Dialogue tab, keeps its example script and voices and presses the button: the recording
    and its files to download appear, and the dialogue is first in the tab's history, which the browser keeps: after
    a reload it is still there, and its Play button brings its recording back."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 90)
    browser.get(f"{server}/")
    wait.until(ready.element_to_be_clickable((By.XPATH, "//button[@role='tab'][normalize-space()='Dialogue']"))).click()
    wait.until(ready.element_to_be_clickable((By.ID, "make-dialogue"))).click()
    wait.until(ready.text_to_be_present_in_element((By.ID, "dialogue-files"), ".srt"))
    listed = browser.find_element(By.ID, "dialogue-files").text
    assert ".mp3" in listed and ".vtt" in listed
    assert browser.find_elements(By.CSS_SELECTOR, "#dialogue-audio audio, #dialogue-audio [data-testid='waveform']")
    kept = (By.CSS_SELECTOR, "#dialogue-history li")
    wait.until(ready.text_to_be_present_in_element(kept, "Ann: Hello Bob, how was the trip?"))
    assert "Ann: " in browser.find_element(*kept).find_element(By.TAG_NAME, "small").text  # the cast's voices
    assert not browser.find_elements(By.CSS_SELECTOR, "#speech-history li")  # the Synthesize tab's list is its own

    browser.refresh()
    wait.until(ready.element_to_be_clickable((By.XPATH, "//button[@role='tab'][normalize-space()='Dialogue']"))).click()
    wait.until(ready.text_to_be_present_in_element(kept, "Ann: Hello Bob"))
    assert not browser.find_elements(By.CSS_SELECTOR, "#dialogue-files a")  # nothing made in this page yet
    browser.find_element(By.CSS_SELECTOR, "#dialogue-history li button[data-action='replay']").click()
    wait.until(ready.text_to_be_present_in_element((By.ID, "dialogue-files"), ".srt"))
    assert browser.find_elements(By.CSS_SELECTOR, "#dialogue-audio audio, #dialogue-audio [data-testid='waveform']")


# What Gradio shows for an event that failed: a toast, and an "Error" badge over an output.
FAILED = """return document.querySelectorAll(
  '[data-testid="toast-body"], [data-testid="status-tracker"] .error').length"""


@pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)])
def test_a_refusal_is_shown_at_its_input_and_the_recording_stays(server, browser, width, height):
    """A bad voices line is refused at the voices box (not a toast over the tab, not "Error" over the recording),
    the recording made before and its downloads stay; the labels read without markup, the voices' help says this
    server has one voice and how to add one, and the download names (the speakers') read whole on a phone."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.integration.test_ui_browser import save_screenshot

    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600})
    try:
        wait = WebDriverWait(browser, 90)
        browser.get(f"{server}/")
        wait.until(ready.element_to_be_clickable((By.XPATH, "//button[@role='tab'][normalize-space()='Dialogue']"))
                   ).click()
        assert "`" not in browser.find_element(By.ID, "dialogue-script").text
        assert "has one voice" in browser.find_element(By.ID, "dialogue-voices-help").text
        wait.until(ready.element_to_be_clickable((By.ID, "make-dialogue"))).click()
        wait.until(ready.text_to_be_present_in_element((By.ID, "dialogue-files"), ".srt"))
        files = browser.find_element(By.ID, "dialogue-files")
        assert "ann-bob-dialogue\n.mp3" in files.text  # whole, not "dialogue-… .mp3"
        voices = browser.find_element(By.CSS_SELECTOR, "#dialogue-voices textarea")
        voices.send_keys("\nCid without a colon")
        browser.find_element(By.ID, "make-dialogue").click()
        wait.until(ready.text_to_be_present_in_element((By.ID, "dialogue-voices"), "voices line 3"))
        assert browser.execute_script(FAILED) == 0
        assert "ann-bob-dialogue\n.mp3" in browser.find_element(By.ID, "dialogue-files").text
        assert browser.execute_script("return document.documentElement.scrollWidth") <= width
        save_screenshot(browser, f"dialogue-refused-{'phone' if width < 600 else 'desktop'}.png")
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
