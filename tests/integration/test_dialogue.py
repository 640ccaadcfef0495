"""POST /v1/audio/dialogue over HTTP with the real bundled Piper voice (two speakers, the one voice under two of
OpenAI's names): one recording whose length is its turns' plus the pauses between them, silent in those pauses,
with captions by speaker; streamed; and each bad script's 400 naming its line."""

import base64
import json

import httpx
import numpy as np
import pytest

from tests.audio_check import decode, duration
from tts_core.request.dialogue import SAME_SPEAKER_PAUSE_S, SPEAKER_CHANGE_PAUSE_S

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

SCRIPT = ("Ann: Hello Bob, how was the trip?\n"
          "Bob: It was long. The train was late.\n"
          "Bob: But the view was lovely.\n"
          "Ann: I am glad you are home.")
VOICES = {"Ann": "alloy", "Bob": "echo"}
PAUSES = [SPEAKER_CHANGE_PAUSE_S, SAME_SPEAKER_PAUSE_S, SPEAKER_CHANGE_PAUSE_S]


def dialogue(server: str, path: str = "/v1/audio/dialogue", **body) -> httpx.Response:
    return httpx.post(f"{server}{path}", json={"script": SCRIPT, "voices": VOICES, "response_format": "wav", **body},
                      timeout=120)


def test_one_recording_is_the_turns_and_the_pauses_with_captions_by_speaker(server):
    response = dialogue(server, "/v1/audio/dialogue/captioned")
    assert response.status_code == 200, response.text
    answer = response.json()
    wav = base64.b64decode(answer["audio"])
    audio, rate = decode(wav, "wav")
    turns, words = answer["turns"], answer["words"]
    assert [turn["speaker"] for turn in turns] == ["Ann", "Bob", "Bob", "Ann"]
    assert turns[0]["start"] == 0 and turns[-1]["end"] == pytest.approx(duration(wav, "wav"), abs=0.002)
    for before, turn, pause in zip(turns[:-1], turns[1:], PAUSES, strict=True):
        assert turn["start"] - before["end"] == pytest.approx(pause, abs=0.002)
        gap = audio[round(before["end"] * rate) + 20:round(turn["start"] * rate) - 20]
        assert gap.size and np.abs(gap).max() < 0.01  # the pause is silence
    spoken = [turn["end"] - turn["start"] for turn in turns]
    assert sum(spoken) + sum(PAUSES) == pytest.approx(duration(wav, "wav"), abs=0.004)
    said = [(line.split(": ", 1)[0], word.strip(",.?")) for line in SCRIPT.splitlines()
            for word in line.split(": ", 1)[1].split()]
    assert [(word["speaker"], word["word"]) for word in words] == said
    for word in words:  # each word inside its speaker's turn
        assert any(turn["speaker"] == word["speaker"] and turn["start"] - 0.001 <= word["start"] < word["end"]
                   <= turn["end"] + 0.001 for turn in turns)


def test_the_plain_answer_is_one_recording_in_any_format(server):
    response = dialogue(server, response_format="mp3")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/mpeg"
    seconds = float(response.headers["X-Chorus-Audio-Duration"])
    assert duration(response.content, "mp3") == pytest.approx(seconds, abs=0.1) and seconds > 3
    listed = [{"speaker": line.split(": ", 1)[0], "text": line.split(": ", 1)[1]} for line in SCRIPT.splitlines()]
    as_list = dialogue(server, script=listed)
    assert as_list.status_code == 200 and duration(as_list.content, "wav") > 3


@pytest.mark.parametrize("kind, label", [("srt", "Ann: Hello Bob"), ("vtt", "<v Ann>Hello Bob")])
def test_subtitles_are_labelled_by_speaker(server, kind, label):
    response = dialogue(server, "/v1/audio/dialogue/captioned", timestamps_format=kind)
    assert response.status_code == 200, response.text
    assert label in response.text
    assert ("Bob: It was long" if kind == "srt" else "<v Bob>It was long") in response.text


def test_streamed_it_comes_in_pieces_turn_by_turn_with_speakers_in_the_captions(server):
    body = {"script": SCRIPT, "voices": VOICES, "response_format": "pcm", "stream": True}
    with httpx.stream("POST", f"{server}/v1/audio/dialogue", json=body, timeout=120) as response:
        assert response.status_code == 200
        pieces = list(response.iter_bytes())
    audio = b"".join(pieces)
    assert len(pieces) > 1 and duration(audio, "pcm") > 3
    lines = httpx.post(f"{server}/v1/audio/dialogue/captioned", timeout=120,
                       json={**body, "stream": True, "response_format": "pcm"}).text.splitlines()
    words = [word for line in lines for word in json.loads(line)["words"]]
    assert [word["speaker"] for word in words][:5] == ["Ann"] * 5 and words[-1]["speaker"] == "Ann"
    assert any(word["speaker"] == "Bob" for word in words)


def test_server_sent_events_carry_the_recording_and_its_usage(server):
    response = dialogue(server, response_format="pcm", stream_format="sse")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: "):]) for line in response.text.splitlines() if line.startswith("data: ")]
    assert {event["type"] for event in events[:-1]} == {"speech.audio.delta"} and events[-1]["type"] == \
        "speech.audio.done"
    audio = b"".join(base64.b64decode(event["audio"]) for event in events[:-1])
    assert events[-1]["usage"]["input_tokens"] == len(SCRIPT)
    assert events[-1]["usage"]["output_tokens"] == round(duration(audio, "pcm") * 50)


@pytest.mark.parametrize("body, param, code, named", [
    ({"script": "\n \n"}, "script", "invalid_dialogue", "no turns"),
    ({"script": "Ann: Hello.\nBob:  "}, "script", "invalid_dialogue", "line 2"),
    ({"script": "Ann: Hello.\nwhat now"}, "script", "invalid_dialogue", "line 2"),
    ({"script": "Ann: Hello.\n\nCid: Hi."}, "voices", "unknown_speaker", "line 3"),
    ({"voices": {"Ann": "alloy", "Bob": "nobody"}}, "voices", "voice_not_found", "voices['Bob']"),
    ({"script": [{"speaker": "Ann", "text": "Hi."}, {"speaker": "Bob", "text": ""}]}, "script", "invalid_dialogue",
     "turn 2"),
    ({"script": "Ann: " + "word " * 250}, "script", "string_above_max_length", "the limit is 1000"),
    ({"stream": True, "response_format": "flac"}, "response_format", "unsupported_value", "cannot be streamed"),
    ({"script": [{"speaker": "Ann", "text": "Hi."}, {"speaker": "Bob"}]}, "script", "invalid_dialogue",
     "turn 2 (script[1]): text is required"),
    ({"script": "Ann: Hi.\nBob: Hi.\n" * 65}, "script", "text_above_queue_capacity",  # (it answered 503 for good)
     "at least 130 pieces to synthesize on model"),
    ({"script": [{"speaker": "Ann", "text": 7}]}, "script", "invalid_dialogue", "script[0]): text must be a string"),
    ({"script": "Ann: Hi.\nA --> B: Hello.", "voices": {"Ann": "alloy", "A --> B": "echo"}}, "script",
     "invalid_dialogue", "line 2: the speaker's name 'A --> B' holds '-->'"),
    ({"script": [{"speaker": "X\n\n99\n00:00:00,000 --> 00:00:09,000", "text": "Hi."}],
      "voices": {"X\n\n99\n00:00:00,000 --> 00:00:09,000": "alloy"}}, "script", "invalid_dialogue", "turn 1"),
])
def test_a_bad_script_is_a_400_naming_its_line(server, body, param, code, named):
    response = dialogue(server, **body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
    assert named in error["message"]
