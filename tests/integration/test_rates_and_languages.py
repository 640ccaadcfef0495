"""`sample_rate` and `language` over HTTP and the WebSocket: every format at the rate asked for, streamed
pieces resampled as one signal (their bytes are the whole file's), a language picks a voice or refuses
one that does not speak it."""

import json

import httpx
import numpy as np
import pytest
from websockets.sync.client import connect

from app import create_app
from tests.audio_check import decode
from tests.fakes import SAMPLES_PER_TOKEN, FakeEngine
from tests.serve import serve_in_thread
from tts_core.config import Settings

TEXT = "First sentence. A second one here. And the third."


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    settings = Settings(data_dir=tmp_path_factory.mktemp("rates"), calibration_sizes=[1], model_aliases={},
                        voice_aliases={}, language_voices={"fr": "amelie"}, default_voice="fake-voice",
                        operator_defaults={"cache_enabled": False, "anonymous_tier": "enterprise"})
    engines = [FakeEngine(), FakeEngine(name="fr-a", voice="amelie", language="fr_FR", sample_rate=22050),
               FakeEngine(name="fr-b", voice="bernard", language="fr_FR", sample_rate=22050)]
    with serve_in_thread(create_app(settings, engines=engines)) as url:
        yield url


def speak(base: str, **body) -> httpx.Response:
    return httpx.post(f"{base}/v1/audio/speech", timeout=30,
                      json={"model": "fake", "voice": "fake-voice", "input": TEXT, **body})


@pytest.mark.parametrize("response_format, rate", [("pcm", None), ("pcm", 8000), ("pcm", 16000), ("wav", 44100),
                                                   ("mp3", 44100), ("opus", 48000), ("aac", 8000), ("flac", 12345)])
def test_every_format_at_the_rate_asked_for(base, response_format, rate):
    response = speak(base, response_format=response_format, **({"sample_rate": rate} if rate else {}))
    assert response.status_code == 200, response.text
    samples, decoded_rate = decode(response.content, response_format)
    if response_format == "pcm":  # no header: its length at the rate asked for (24 kHz by default) says it
        decoded_rate = rate or 24000
    assert decoded_rate == (rate or 24000)
    spoken = len("First sentence.A second one here.And the third.") * SAMPLES_PER_TOKEN / 16000 + 2 * 0.12
    # lossy codecs add priming and padding: two codec frames (1152 samples) at the rate
    tolerance = max(0.11, 2 * 1152 / decoded_rate) if response_format in ("mp3", "aac", "opus") else 0.01
    assert samples.size / decoded_rate == pytest.approx(spoken, abs=tolerance)


def test_streamed_pieces_are_resampled_as_one_signal(base):
    """The codec keeps its resampler for the whole stream: the streamed bytes are the whole file's (a
    resampler per piece would differ at every join: clicks)."""
    whole = speak(base, response_format="pcm", sample_rate=11025).content
    streamed = speak(base, response_format="pcm", sample_rate=11025, stream=True).content
    assert len(streamed) == len(whole) and streamed == whole


@pytest.mark.parametrize("response_format, rate, says", [("opus", 22050, "opus takes a sample_rate of"),
                                                         ("mp3", 10000, "mp3 takes a sample_rate of")])
def test_a_rate_the_codec_cannot_take_is_a_400(base, response_format, rate, says):
    response = speak(base, response_format=response_format, sample_rate=rate)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "sample_rate" and says in error["message"]
    out_of_range = speak(base, sample_rate=96000)
    assert out_of_range.status_code == 400 and out_of_range.json()["error"]["param"] == "sample_rate"


def test_the_websocket_takes_a_rate_for_what_follows(base):
    url = base.replace("http://", "ws://") + "/v1/audio/speech/stream?voice=fake-voice&sample_rate=8000"
    with connect(url) as socket:
        socket.send(json.dumps({"text": "Hello there."}))
        started = json.loads(socket.recv())
        assert started["type"] == "started" and started["sample_rate"] == 8000
        audio, event = b"", None
        while event is None or event["type"] != "done":
            message = socket.recv()
            audio, event = (audio + message, event) if isinstance(message, bytes) else (audio, json.loads(message))
        assert len(audio) / 2 / 8000 == pytest.approx(event["audio_s"], abs=0.01)


@pytest.mark.parametrize("body, voice", [({"language": "fr"}, "amelie"),  # the operator's voice for French
                                         ({"language": "fr-FR", "model": "fake"}, "amelie"),
                                         ({"language": "en"}, "fake-voice"),  # the default voice speaks it
                                         ({"language": "fr", "voice": "bernard"}, "bernard")])
def test_a_language_picks_a_voice(base, body, voice):
    response = httpx.post(f"{base}/v1/audio/speech", timeout=30,
                          json={"model": "fake", "input": "Bonjour.", "response_format": "wav", **body})
    assert response.status_code == 200, response.text
    assert response.headers["x-chorus-voice"] == voice


@pytest.mark.parametrize("body, code", [({"language": "fr", "voice": "fake-voice"}, "language_mismatch"),
                                        ({"language": "de"}, "unsupported_language"),
                                        ({"language": "fr-CA"}, "unsupported_language"),  # both of a region
                                        ({"language": "not a language"}, "string_pattern_mismatch")])
def test_a_language_no_voice_speaks_is_a_400_that_says_so(base, body, code):
    response = httpx.post(f"{base}/v1/audio/speech", json={"model": "fake", "input": "Hallo.", **body}, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == code and error["param"] == "language"


def test_voices_list_filters_by_language_and_model(base):
    def ids(**params):
        return [voice["id"] for voice in httpx.get(f"{base}/v1/audio/voices", params=params).json()["voices"]]
    assert ids(language="fr") == ["amelie", "bernard"] and ids(language="fr-fr") == ["amelie", "bernard"]
    assert ids(language="en") == ["fake-voice"] and ids(model="fr-b") == ["bernard"] and ids(language="it") == []
    assert np.array_equal(sorted(ids()), ["amelie", "bernard", "fake-voice"])
