"""The Dialogue tab over HTTP (Gradio's client, as a browser's page calls it) with the real bundled voice: a script
and a voice per speaker make one recording to download, with subtitles by speaker; a bad script is refused with
its line named; in a browser, the dialogue made is kept in the tab's history, there after a reload, played again
from it."""

import html
import re

import httpx
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


def links(page: str) -> list[str]:
    """The files a piece of the tab's HTML links (its player's source, its downloads), as written."""
    return [html.unescape(link) for link in re.findall(r'(?:href|src)="([^"]*)"', page)]


def test_the_tab_makes_one_recording_with_subtitles_by_speaker(server):
    """The recording and its files are linked by take and name (ui/files.py), never by a path of the server's."""
    audio, files = Client(f"{server}/", verbose=False).predict(SCRIPT, "Ann: alloy\nBob: echo", "wav",
                                                              api_name="/dialogue")
    [recording] = links(audio)
    assert re.fullmatch(r"ui/files/[0-9a-f]{12}/ann-bob-dialogue\.wav", recording)
    samples, rate = decode(httpx.get(f"{server}/{recording}").content, "wav")
    assert samples.size / rate > 2
    urls = links(files)
    assert sorted(url.rsplit(".", 1)[1] for url in urls) == ["srt", "vtt", "wav"] and recording in urls
    subtitles = {url.rsplit(".", 1)[1]: httpx.get(f"{server}/{url}").text for url in urls if not url.endswith(".wav")}
    assert "Ann: Hello Bob" in subtitles["srt"] and "<v Bob>Long" in subtitles["vtt"]


def test_a_bad_script_is_refused_naming_its_line(server):
    client = Client(f"{server}/", verbose=False)
    with pytest.raises(Exception, match="line 2"):
        client.predict("Ann: Hello.\nCid: Who?", "Ann: alloy", "wav", api_name="/dialogue")
    with pytest.raises(Exception, match="voices line 1"):
        client.predict(SCRIPT, "Ann alloy", "wav", api_name="/dialogue")


def test_the_tab_in_a_browser(server, browser, tmp_path_factory):
    """A person opens the Dialogue tab, keeps its example script and voices and presses the button: the recording
    and its files to download appear, linked by take and name (no path of the server's), and download as the
    dialogue of the length the history says and its subtitles; the dialogue is first in the tab's history, which the
    browser keeps: after a reload it is still there, and its Play button brings its recording back."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.integration.test_ui_browser import check_links

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
    said = browser.find_element(*kept).find_element(By.TAG_NAME, "small").text
    assert "Ann: " in said  # the cast's voices
    assert not browser.find_elements(By.CSS_SELECTOR, "#speech-history li")  # the Synthesize tab's list is its own
    data_dir = tmp_path_factory.getbasetemp()  # the server's data folder is in it
    [played] = check_links(browser, server, "#dialogue-audio audio", data_dir)
    recording, srt, vtt = check_links(browser, server, "#dialogue-files a", data_dir)
    assert recording.content == played.content and recording.headers["content-type"] == "audio/mpeg"
    samples, rate = decode(recording.content, "mp3")
    seconds = float(re.search(r"([\d.]+) s$", said).group(1))
    assert samples.size / rate > 2 and abs(samples.size / rate - seconds) < 0.2  # the history's length (mp3 pads)
    assert "Ann: Hello Bob" in srt.text and "<v Bob>Long" in vtt.text
    check_links(browser, server, "#dialogue-history a", data_dir)

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
# Three speakers of long names: the download's name is long (annabelle-bartholome-constantin-dialogue.mp3).
CAST = ("Annabelle", "Bartholomew", "Constantine")
LONG_SCRIPT = "\n".join(f"{name}: Hello, I am {name}." for name in CAST)
LONG_NAME = "annabelle-bartholome-constantin-dialogue"
# Each file link of the tab: its text, the name it downloads as, where it is across the page, and whether the list
# holding it is cut (wider than it shows).
NAMES = """const list = document.querySelector('#dialogue-files');
return [...list.querySelectorAll('a')].map(link => ({text: link.textContent, name: link.getAttribute('download'),
  left: Math.min(...[...link.getClientRects()].map(box => box.left)),
  right: Math.max(...[...link.getClientRects()].map(box => box.right)), lines: link.getClientRects().length,
  cut: list.scrollWidth > list.clientWidth}));"""


@pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)])
def test_a_refusal_is_shown_at_its_input_and_the_recording_stays(server, browser, width, height):
    """A bad voices line is refused at the voices box (not a toast over the tab, not "Error" over the recording),
    the recording made before and its downloads stay; the labels read without markup, the voices' help says this
    server has one voice and how to add one, and the download names (the speakers', long ones) read whole, wrapped
    where a phone has no room for them."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.integration.test_ui_browser import save_screenshot, type_into

    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600})
    try:
        wait = WebDriverWait(browser, 90)
        browser.get(f"{server}/")
        wait.until(ready.element_to_be_clickable((By.XPATH, "//button[@role='tab'][normalize-space()='Dialogue']"))
                   ).click()
        assert "`" not in browser.find_element(By.ID, "dialogue-script").text
        assert "has one voice" in browser.find_element(By.ID, "dialogue-voices-help").text
        type_into(browser, "#dialogue-script textarea", LONG_SCRIPT)
        type_into(browser, "#dialogue-voices textarea", "\n".join(f"{name}: alloy" for name in CAST))
        wait.until(ready.element_to_be_clickable((By.ID, "make-dialogue"))).click()
        wait.until(ready.text_to_be_present_in_element((By.ID, "dialogue-files"), ".srt"))
        names = browser.execute_script(NAMES)
        assert [link["name"] for link in names] == [f"{LONG_NAME}.{kind}" for kind in ("mp3", "srt", "vtt")]
        for link in names:  # whole, not "dialogue-… .mp3": every letter shown, inside the screen
            assert link["text"] == link["name"] and 0 <= link["left"] and link["right"] <= width and not link["cut"]
        voices = browser.find_element(By.CSS_SELECTOR, "#dialogue-voices textarea")
        voices.send_keys("\nCid without a colon")
        browser.find_element(By.ID, "make-dialogue").click()
        wait.until(ready.text_to_be_present_in_element((By.ID, "dialogue-voices"), "voices line 4"))
        assert browser.execute_script(FAILED) == 0
        assert browser.execute_script(NAMES) == names  # the downloads stay as they were
        assert browser.execute_script("return document.documentElement.scrollWidth") <= width
        save_screenshot(browser, f"dialogue-refused-{'phone' if width < 600 else 'desktop'}.png")
        if width < 600:
            browser.execute_script("document.querySelector('#dialogue-files').scrollIntoView({block: 'center'})")
            save_screenshot(browser, "dialogue-files-phone.png")
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
