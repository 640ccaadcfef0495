import json
import re
from html.parser import HTMLParser
from urllib.parse import unquote

import httpx
import pytest
from gradio_client import Client

from app import create_app
from tests.audio_check import decode
from tests.fakes import FakeEngine
from tests.serve import serve_in_thread
from tts_core.config import Settings

VOICE = "en_US-joe-medium"


def synthesize(server: str, text: str, voice: str = VOICE, response_format: str = "wav") -> list[tuple]:
    """Every update the synthesis tab gave: (player, words)."""
    client = Client(f"{server}/", verbose=False)
    try:
        job = client.submit(text, voice, 1.0, response_format, api_name="/synthesize")
        job.result(timeout=60)
        return job.outputs()
    finally:
        client.close()  # its heartbeat stream and threads end here, not at the end of the session


def fetch(server: str, link: dict) -> bytes:
    """A file the player links to (the whole take, or its subtitles)."""
    response = httpx.get(f"{server}/{link['download']}")
    assert response.status_code == 200
    return response.content


class Words(HTMLParser):
    """The caption words of the tab's HTML, as a browser reads them: (text, start, end); the whole text shown;
    and any other tag."""

    def __init__(self, page: str):
        super().__init__()
        self.words, self.other_tags, self.text, self._open = [], [], "", None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "span" and attrs.get("class") == "chorus-word":
            self._open = ["", float(attrs["data-start"]), float(attrs["data-end"])]
        elif not (tag == "p" and attrs.get("class") == "chorus-words"):
            self.other_tags.append(tag)

    def handle_data(self, data):
        self.text += data
        if self._open is not None:
            self._open[0] += data

    def handle_endtag(self, tag):
        if tag == "span" and self._open is not None:
            self.words.append(tuple(self._open))
            self._open = None


def last_words(updates: list[tuple]) -> Words:
    return Words([words for _, words in updates if isinstance(words, str)][-1])


def test_page_loads(server):
    page = httpx.get(f"{server}/")
    assert page.status_code == 200 and "gradio" in page.text.lower()


def test_synthesis_streams_each_sentence_then_offers_the_whole_file(server):
    text = "Hello from the browser tab. A second sentence follows. And then a third one."
    updates = synthesize(server, text)
    players = [json.loads(player) for player, *_ in updates]
    # One update per piece (each sentence, the first one cut short so it starts sooner), each naming the
    # pieces made so far, in one take; the last one adds the whole file.
    counts = [len(player["pieces"]) for player in players[:-1]]
    assert len(counts) >= 3 and counts == list(range(1, len(counts) + 1))
    assert {player["take"] for player in players} == {players[0]["take"]} and players[-1]["done"]
    assert players[-1]["pieces"][:len(counts)] == players[-2]["pieces"]
    for url in players[-1]["pieces"]:  # the player fetches each piece
        piece = httpx.get(f"{server}/{url}")
        assert piece.status_code == 200 and decode(piece.content, "wav")[1] == 22050
    name = "en_US-joe-medium-hello-from-the-browser-tab.wav"
    assert players[-1]["name"] == name and players[-1]["download"].endswith(name)  # from the voice and first words
    assert players[-1]["text"] == text and players[-1]["label"] == "Joe (medium)"
    samples, rate = decode(fetch(server, players[-1]), "wav")
    assert rate == 22050 and 2.5 < samples.size / rate < 9
    assert players[-1]["duration_s"] == pytest.approx(samples.size / rate, abs=0.01)


def test_the_words_appear_as_they_are_spoken_with_their_subtitles(server):
    text = "Hello from the browser tab. A second sentence follows. And then a third one."
    updates = synthesize(server, text)
    counts = [len(Words(words).words) for _, words in updates if isinstance(words, str)]
    assert len(counts) >= 3 and counts == sorted(counts) and counts[0] < counts[-1]  # more with each piece
    words = last_words(updates).words
    assert [word for word, _, _ in words] == re.findall(r"\w+", text)
    assert all(start < end for _, start, end in words)
    assert all(earlier[2] <= later[1] for earlier, later in zip(words, words[1:]))
    player = json.loads(updates[-1][0])
    samples, rate = decode(fetch(server, player), "wav")
    assert words[-1][2] <= samples.size / rate

    assert [link["name"].rsplit(".", 1)[1] for link in player["subtitles"]] == ["srt", "vtt"]
    srt, vtt = (fetch(server, link).decode() for link in player["subtitles"])
    stamp = r"(\d\d):([0-5]\d):([0-5]\d)[.,](\d{3})"
    header, *vtt_blocks = vtt.rstrip("\n").split("\n\n")  # cues apart by a blank line, after the header
    vtt_cues = [re.fullmatch(rf"{stamp} --> {stamp}\n(.+)", block) for block in vtt_blocks]
    srt_cues = [re.fullmatch(rf"(\d+)\n{stamp} --> {stamp}\n(.+)", block) for block in srt.rstrip("\n").split("\n\n")]
    assert header == "WEBVTT" and vtt_cues and all(vtt_cues) and all(srt_cues)
    assert [cue.groups() for cue in vtt_cues] == [cue.groups()[1:] for cue in srt_cues]
    assert [int(cue[1]) for cue in srt_cues] == list(range(1, len(srt_cues) + 1))
    assert " ".join(cue[9] for cue in vtt_cues).split() == text.split()  # the text's punctuation kept
    seconds = [int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000
               for cue in vtt_cues for h, m, s, ms in (cue.groups()[0:4], cue.groups()[4:8])]
    assert seconds == sorted(seconds) and seconds[0] == pytest.approx(words[0][1], abs=0.001)


def test_the_callers_words_are_escaped(server):
    updates = synthesize(server, 'Salt <b>& "pepper"</b> & <i>chips</i>.')
    words = last_words(updates)
    assert not words.other_tags  # no <b> or <i> made it into the page as a tag
    # the text's own "&" is shown as text; the markup beside a word is not part of it
    assert [word for word, _, _ in words.words] == ["Salt", "&", "pepper", "&", "chips"]


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory):
    """A voice whose engine cannot time its words; and the server's data folder."""
    data_dir = tmp_path_factory.mktemp("ui-fake")
    settings = Settings(data_dir=data_dir, calibration_sizes=[1], model_aliases={}, voice_aliases={},
                        default_voice="fake-voice", operator_defaults={"anonymous_tier": "enterprise"})
    with serve_in_thread(create_app(settings, engines=[FakeEngine()])) as base:
        yield base, data_dir


def test_a_voice_that_cannot_time_its_words_still_speaks(fake_server):
    base, _ = fake_server
    updates = synthesize(base, "No words timed here.", voice="fake-voice")
    player = json.loads(updates[-1][0])
    samples, rate = decode(fetch(base, player), "wav")
    assert rate == 16000 and samples.size > 0 and player["subtitles"] == []
    assert "cannot time its words" in [words for _, words in updates if isinstance(words, str)][-1]


def test_the_language_list_filters_the_voices(server):
    client = Client(f"{server}/", verbose=False)
    english = client.predict("en", api_name="/pick_language")  # the voices that speak it, its own chosen
    assert english["value"] == "en_US-joe-medium" and [value for _, value in english["choices"]] == ["en_US-joe-medium"]
    assert client.predict("", api_name="/pick_language")["value"] == "en_US-joe-medium"  # any: the default
    client.close()


def test_the_words_line_shows_the_text_as_written(server):
    """The words under the player are the input with its punctuation, quotes and line breaks; only the words
    are marked, so the player can mark each as it is spoken."""
    text = 'Well, "hello" there!\nIt\'s 5 o\'clock; time for tea.'
    words = last_words(synthesize(server, text))
    assert words.text == text
    assert [word for word, _, _ in words.words][:4] == ["Well", "hello", "there", "It's"]


def test_an_empty_text_is_refused_once_at_the_text_box(server):
    """An empty or blank text is refused before it is queued (Gradio's validator), with one message for the
    text box, the API's own; nothing is synthesized (the browser keeps the take it had, without error badges:
    tests/integration/test_ui_browser.py)."""
    from gradio_client.exceptions import ValidationError

    for text in ("", "   "):
        said = httpx.post(f"{server}/v1/audio/speech", json={"model": "tts-1", "voice": "alloy", "input": text})
        message = said.json()["error"]["message"]
        client = Client(f"{server}/", verbose=False)
        with pytest.raises(ValidationError) as refused:
            client.predict(text, VOICE, 1.0, "wav", api_name="/synthesize")
        client.close()
        assert str(refused.value).splitlines()[1:] == [f"- text: {message}"]


def test_the_takes_are_kept_under_the_data_folder(fake_server):
    base, data_dir = fake_server
    """...and linked by the take's id and the file's name (ui/files.py), not by their path on the server."""
    player = json.loads(synthesize(base, "Kept with the data.", voice="fake-voice")[-1][0])
    route, take, name = player["download"].rsplit("/", 2)
    path = data_dir.resolve() / "ui" / take / unquote(name)
    assert route == "ui/files" and path.is_file() and fetch(base, player) == path.read_bytes()
    said = httpx.get(f"{base}/ui/files/{take}/words.html")  # what the take keeps for itself is not served
    assert said.status_code == 404 and said.json()["error"]["code"] == "not_found"
    for forged in (f"{take}/..%2F..%2Fui.db", f"..%2F{take}/{name}", "0123456789ab/gone.mp3"):
        assert httpx.get(f"{base}/ui/files/{forged}").status_code == 404


def test_gradios_own_run_history_is_off(server):
    """Gradio would keep every text typed in the browser's plain localStorage, beside Chorus's own history."""
    config = httpx.get(f"{server}/config").json()
    assert config["run_history"] is False and "runs" not in config["footer_links"]
    assert httpx.get(f"{server}/gradio_api/runs").status_code == 404
