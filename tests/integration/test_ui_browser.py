"""The synthesis tab in a real headless browser (Debian chromium + chromedriver, driven by selenium).

The screenshots are kept as test artifacts (TTS_TEST_ARTIFACTS, default ./artifacts); docs/ui.png and
docs/ui-phone-dark.png, which docs/ui.md shows, are copies of them. .ci/run installs the browser and
sets CHORUS_REQUIRE_TOOLS=1, so in CI a missing browser fails the tests instead of skipping them.
"""

import json
import os
import re
from pathlib import Path

import httpx
import pytest

from bench.server import ROOT, start_server
from tests.audio_check import decode

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

ARTIFACTS = Path(os.environ.get("TTS_TEST_ARTIFACTS", ROOT / "artifacts"))
TEXT = "Chorus reads this aloud as it is synthesized. The second sentence follows the first."
STATE = "return window.chorusPlayer && window.chorusPlayer.state()"
# Where the player is (paused, so only the test moves it): the index of the word marked as spoken.
SEEK = """window.chorusPlayer.seek(arguments[0]);
return [...document.querySelectorAll('#speech-words .chorus-word')].findIndex(span => span.matches('.spoken'));"""
# What Gradio shows for an event that failed: a toast, and an "Error" badge over each output.
FAILED = """return document.querySelectorAll(
  '[data-testid="toast-body"], [data-testid="status-tracker"] .error').length"""
# Where an element is on the page, and its text's size and colour (r + g + b).
LOOKS = """const box = arguments[0].getBoundingClientRect(), style = getComputedStyle(arguments[0]);
return {top: box.top + window.scrollY, size: parseFloat(style.fontSize),
        brightness: style.color.match(/\\d+/g).slice(0, 3).map(Number).reduce((a, b) => a + b)};"""
# The requests the page has made to Gradio's queue (each event's), so far.
JOINS = "return performance.getEntriesByType('resource').filter(entry => entry.name.includes('/queue/join')).length"
# The files the page links or plays, as written in it (not resolved against the page).
LINKED = """return [...document.querySelectorAll(arguments[0])].map(
  element => element.getAttribute('href') || element.getAttribute('src'))"""
# Whether the waveform has anything drawn on it.
DRAWN = """const canvas = document.querySelector('#speech-player canvas');
return canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data.some(value => value > 0);"""


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory):
    """Anonymous callers on the free tier: 1,000 characters, where the server takes 5,000."""
    server = start_server(tmp_path_factory.mktemp("ui-browser"), calibration_sizes="1",
                          operator_defaults=json.dumps({"anonymous_tier": "free"}))
    yield server.base_url
    server.stop()


def open_page(browser, url: str):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 60)
    browser.get(url)
    wait.until(ready.text_to_be_present_in_element((By.ID, "char-counter"), "free tier"))  # the page has loaded
    return wait


def type_text(browser, text: str) -> None:
    """Replaces the text box's text as a person would (selenium's clear() leaves the page's copy as it was)."""
    type_into(browser, "#speech-text textarea", text)


def type_into(browser, css: str, text: str) -> None:
    """Replaces what the box `css` selects holds, as a person would."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = browser.find_element(By.CSS_SELECTOR, css)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    if text:
        box.send_keys(text)


def synthesize(browser, wait, text: str) -> dict:
    """Types the text, clicks Synthesize, and waits for the whole take: the player's state."""
    from selenium.webdriver.common.by import By

    type_text(browser, text)
    before = browser.execute_script(STATE)["take"]
    browser.find_element(By.ID, "synthesize").click()
    wait.until(lambda driver: (state := driver.execute_script(STATE))["take"] != before and state["done"])
    return browser.execute_script(STATE)


def failed_requests(browser) -> list[str]:
    """What the browser's console said since it was last read of requests answered 4xx or 5xx."""
    return [entry["message"] for entry in browser.get_log("browser")
            if re.search(r"status of [45]\d\d|\b(4\d\d|5\d\d) \(", entry["message"])]


def blank_text_is_refused_in_the_page(browser, wait, text: str) -> None:
    """A blank text: one message at the text box, the API's, and no request (none sent to the queue, no failed one
    in the console)."""
    from selenium.webdriver.common.by import By

    failed_requests(browser)
    joins = browser.execute_script(JOINS)
    type_text(browser, text)
    browser.find_element(By.ID, "synthesize").click()
    message = wait.until(lambda driver: driver.find_element(By.CSS_SELECTOR, "#speech-text div.validation-error"))
    assert message.text == "input is empty" and message.is_displayed()
    assert browser.execute_script(JOINS) == joins and failed_requests(browser) == []


def check_links(browser, server: str, css: str, data_dir: Path) -> list[httpx.Response]:
    """The files linked by the elements `css` selects: each by a take's id and a file's name under ui/files/
    (relative to the page), naming no folder of the server's; fetched, each answers 200 as an attachment."""
    urls = browser.execute_script(LINKED, css)
    assert urls, css
    answers = []
    for url in urls:
        assert re.fullmatch(r"ui/files/[0-9a-f]{12}/[\w%-]+\.[a-z0-9]{2,4}", url), url
        assert str(data_dir) not in url and "/tmp" not in url and "file=" not in url, url
        answers.append(httpx.get(f"{server}/{url}", timeout=30))
        assert answers[-1].status_code == 200 and answers[-1].headers["content-disposition"].startswith("attachment")
    assert str(data_dir) not in browser.page_source and "gradio_api/file=" not in browser.page_source
    return answers


def save_screenshot(browser, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / name))


def test_synthesis_plays_as_it_arrives_marks_the_spoken_word_and_keeps_a_history(browser, ui_server,
                                                                                 tmp_path_factory):
    """Type (the counter shows the tier's limit), synthesize: the player plays the pieces as they come,
    drawing their waveform, the word being spoken is marked as the player's time moves, the file is
    offered under a name from the voice and the first words, linked by the take's id and the file's name
    (no path of the server's), and downloads as the take's audio and subtitles; the take is in the history,
    which a reload keeps, and from which it plays again and is deleted. An empty text is answered at the
    text box without a request (nothing failed in the console)."""
    from selenium.webdriver.common.by import By

    wait = open_page(browser, ui_server + "/")
    counter = browser.find_element(By.ID, "char-counter")
    assert counter.text == "0 / 1,000 characters (free tier)"
    assert browser.find_element(By.CSS_SELECTOR, "#speech-text textarea").get_attribute("maxlength") == "1000"
    assert "will be listed here" in browser.find_element(By.ID, "speech-history").text
    assert not any(box.is_displayed() for box in browser.find_elements(By.ID, "speech-file"))  # none before a take

    state = synthesize(browser, wait, TEXT)
    assert counter.text.startswith(f"{len(TEXT)} / 1,000")
    assert state["pieces"] >= 2 and state["total"] > 3 and state["peaks"] > 300  # two sentences, 10 ms peaks
    assert state["playing"] or state["time"] > 0  # it started playing on its own
    assert browser.execute_script(DRAWN)
    name = "en_US-joe-medium-chorus-reads-this-aloud-as.mp3"
    links = browser.find_elements(By.CSS_SELECTOR, "#speech-player a.chorus-download")  # the file and its subtitles
    assert [link.get_attribute("download") for link in links] == [name[:-3] + kind for kind in ("mp3", "srt", "vtt")]
    assert [link.text for link in links] == ["Download MP3", "SRT", "VTT"]
    wait.until(lambda driver: driver.find_elements(By.CSS_SELECTOR, "#speech-history li"))
    data_dir = tmp_path_factory.getbasetemp()  # the servers' data folders are in it
    audio, srt, vtt = check_links(browser, ui_server, "#speech-player a.chorus-download", data_dir)
    samples, rate = decode(audio.content, "mp3")
    assert abs(samples.size / rate - state["total"]) < 0.15  # the take the player played (mp3 pads its ends)
    assert "Chorus reads this" in srt.text and vtt.text.startswith("WEBVTT") and name in audio.headers[
        "content-disposition"]
    check_links(browser, ui_server, "#speech-history a", data_dir)
    # the file is offered twice: beside the player and in the history (no file box besides)
    assert len(browser.find_elements(By.CSS_SELECTOR, f"a[download='{name}']")) == 2
    assert not browser.find_elements(By.CSS_SELECTOR, "[data-testid='file'], .file-preview")
    words = browser.find_elements(By.CSS_SELECTOR, "#speech-words .chorus-word")
    assert [word.text for word in words][:3] == ["Chorus", "reads", "this"] and len(words) == 14
    assert browser.find_element(By.ID, "speech-words").text == TEXT  # as written: its punctuation kept
    for index in (1, 9, 5):  # the player's time inside a word's [start, end): that word, and only it, is marked
        middle = (float(words[index].get_attribute("data-start")) + float(words[index].get_attribute("data-end"))) / 2
        wait.until(lambda driver, middle=middle, index=index: driver.execute_script(SEEK, middle) == index)
        assert len(browser.find_elements(By.CSS_SELECTOR, "#speech-words .spoken")) == 1
    entries = browser.find_elements(By.CSS_SELECTOR, "#speech-history li")
    assert len(entries) == 1 and TEXT[:40] in entries[0].text and "Joe (medium)" in entries[0].text
    save_screenshot(browser, "ui.png")

    # An empty text: refused in the page, no toast, no error badges, the take stays in the player.
    blank_text_is_refused_in_the_page(browser, wait, "")
    assert browser.execute_script(FAILED) == 0 and browser.execute_script(STATE)["take"] == state["take"]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#speech-history li")) == 1
    save_screenshot(browser, "ui-empty-text.png")

    wait = open_page(browser, ui_server + "/")  # a reload keeps the history
    entry = wait.until(lambda driver: driver.find_element(By.CSS_SELECTOR, "#speech-history li"))
    assert TEXT[:40] in entry.text
    assert entry.find_element(By.CSS_SELECTOR, "a").get_attribute("download") == name
    entry.find_element(By.CSS_SELECTOR, "button[data-action='replay']").click()
    wait.until(lambda driver: (replayed := driver.execute_script(STATE))["done"]
               and replayed["take"] == state["take"] and replayed["pieces"] == state["pieces"])
    # and it plays: the page's audio runs (the click on Play let it start) and the take's time moves
    wait.until(lambda driver: (played := driver.execute_script(STATE))["audio"] == "running" and played["time"] > 0.2)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#speech-words .chorus-word")) == 14  # its words again
    entry.find_element(By.CSS_SELECTOR, "button[data-action='forget']").click()
    wait.until(lambda driver: not driver.find_elements(By.CSS_SELECTOR, "#speech-history li"))
    open_page(browser, ui_server + "/")
    assert not browser.find_elements(By.CSS_SELECTOR, "#speech-history li")


def test_a_voice_preview_plays(browser, ui_server):
    from selenium.webdriver.common.by import By

    wait = open_page(browser, ui_server + "/")
    row = browser.find_element(By.CSS_SELECTOR, "#voice-list .chorus-voice.chosen")
    assert "Joe (medium)" in row.text and "22.05 kHz" in row.text and "OpenAI names: alloy" in row.text
    details = browser.execute_script(LOOKS, row.find_element(By.CSS_SELECTOR, "small"))
    assert details["size"] >= 14 and details["brightness"] < 200  # readable: body-sized, dark on the light page
    placeholder = browser.find_element(By.CSS_SELECTOR, "#speech-text textarea").get_attribute("placeholder")
    assert placeholder.startswith("Type") and placeholder.endswith("…")  # a hint, not a sample to be spoken
    assert browser.find_element(By.CSS_SELECTOR, "#voice-list h4").text == "English (United States)"
    row.find_element(By.CSS_SELECTOR, ".chorus-preview").click()
    wait.until(lambda driver: driver.execute_script(
        "const audio = document.querySelector('#voice-preview audio'); return audio && audio.currentTime > 0"))
    assert "Hello! This is how I sound." in browser.find_element(By.ID, "voice-preview").text


def test_the_tab_fits_a_phone_and_reads_in_dark_mode(browser, ui_server):
    from selenium.webdriver.common.by import By

    browser.set_window_size(390, 844)
    try:
        wait = open_page(browser, ui_server + "/?__theme=dark")
        synthesize(browser, wait, "Short and sweet.")
        assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
        # the columns stacked: the text, then the voice, then the button
        tops = [browser.execute_script(LOOKS, browser.find_element(By.CSS_SELECTOR, css))["top"]
                for css in ("#speech-text", "#voice-list", "#synthesize")]
        assert tops == sorted(tops), tops
        details = browser.execute_script(LOOKS, browser.find_element(By.CSS_SELECTOR, ".chorus-voice small"))
        assert details["size"] >= 14
        brightness = ("const [r, g, b] = getComputedStyle(arguments[0])[arguments[1]].match(/\\d+/g).map(Number);"
                      "return r + g + b;")
        for css in ("#voice-list .chorus-voice strong", "#speech-history q", ".chorus-voice small"):  # light text
            assert browser.execute_script(brightness, browser.find_element(By.CSS_SELECTOR, css), "color") > 384, css
        player = browser.find_element(By.CSS_SELECTOR, ".chorus-player")  # on a dark ground
        assert browser.execute_script(brightness, player, "backgroundColor") < 200
        browser.execute_script("document.querySelector('#voice-list').scrollIntoView()")
        save_screenshot(browser, "ui-phone-dark.png")
    finally:
        browser.set_window_size(1400, 1900)


def icon_offset(png: bytes) -> tuple[float, float, float]:
    """The round button's icon (its light pixels inside the circle): how far its centre of mass lies from the
    button's centre (x, y, in px), and how far out from the centre it reaches, as a share of the radius."""
    import io

    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=float)
    height, width = pixels.shape[:2]
    rows, columns = np.mgrid[0:height, 0:width]
    centre_y, centre_x, radius = (height - 1) / 2, (width - 1) / 2, min(height, width) / 2
    distance = np.hypot(rows - centre_y, columns - centre_x)
    icon = (pixels.sum(axis=2) > 600) & (distance < radius * 0.9)  # the button's text colour on its accent
    assert icon.sum() > 20, "no icon drawn"
    return (columns[icon].mean() - centre_x, rows[icon].mean() - centre_y, distance[icon].max() / radius)


@pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)])
def test_the_pause_button_draws_a_centred_icon(browser, ui_server, tmp_path_factory, width, height):
    """While playing, the round button shows two bars drawn in CSS (the '❚❚' glyph sat off-centre and was cut
    by the circle), centred and well inside it, at a desktop's size and a phone's. At both, the take's links
    name no path of the server's, and a blank text is answered at the box without a request."""
    from selenium.webdriver.common.by import By

    browser.set_window_size(width, height)
    try:
        wait = open_page(browser, ui_server + "/")
        synthesize(browser, wait, TEXT)
        button = browser.find_element(By.CSS_SELECTOR, ".chorus-play")
        browser.execute_script("window.chorusPlayer.seek(0)")
        button.click()
        wait.until(lambda driver: driver.execute_script(STATE)["playing"])
        shot = button.screenshot_as_png
        assert button.get_attribute("aria-label") == "Pause" and button.text == ""  # no glyph
        x, y, reach = icon_offset(shot)
        assert abs(x) <= 1 and abs(y) <= 1 and reach < 0.75, (x, y, reach)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / f"pause-button-{width}.png").write_bytes(shot)
        check_links(browser, ui_server, "#speech-player a.chorus-download", tmp_path_factory.getbasetemp())
        blank_text_is_refused_in_the_page(browser, wait, "   ")
        save_screenshot(browser, f"ui-blank-text-{'phone' if width < 600 else 'desktop'}.png")
        type_text(browser, "Typing takes the message away.")
        assert not browser.find_elements(By.CSS_SELECTOR, "#speech-text div.validation-error")
    finally:
        browser.set_window_size(1400, 1900)
