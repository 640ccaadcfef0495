"""Word timestamps over HTTP with the real bundled voice: the caller's words with increasing times inside
the audio, agreeing with an independent alignment (pocketsphinx's, of the same audio) to within 150 ms
median; streamed as NDJSON; as SRT and WebVTT; in Kokoro-FastAPI's shape at its path."""

import base64
import json
import statistics

import httpx
import pytest
from pocketsphinx import Decoder

from tests.audio_check import decode, duration, to_16k_int16

# what is written, and the words each caption word is spoken as (what the aligner is told)
SENTENCES = [
    ("The weather today is sunny and warm.", None),
    ("I would like a cup of coffee with milk.", None),
    ("We walked along the river to the old bridge. Then we went home.", None),
    ("It costs $5 today.", [["it"], ["costs"], ["five", "dollars"], ["today"]]),
    ("The train leaves at 7:45 pm.", [["the"], ["train"], ["leaves"], ["at"], ["seven", "forty", "five", "p", "m"]]),
]
CAPTIONS = {"The train leaves at 7:45 pm.": ["The", "train", "leaves", "at", "7:45 pm"]}  # one thing said as 5 words


def captioned(server: str, text: str, path: str = "/v1/audio/speech/captioned", **extra) -> httpx.Response:
    body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "wav", **extra}
    return httpx.post(f"{server}{path}", json=body, timeout=120)


def aligned(decoder: Decoder, wav: bytes, spoken: list[str]) -> list[tuple[float, float]]:
    """pocketsphinx's forced alignment: (start, end) of each spoken word."""
    decoder.set_align_text(" ".join(spoken))
    decoder.start_utt()
    decoder.process_raw(to_16k_int16(wav).tobytes(), full_utt=True)
    decoder.end_utt()
    found = [(segment.start_frame / 100, (segment.end_frame + 1) / 100) for segment in decoder.seg()
             if segment.word not in ("<s>", "</s>", "<sil>", "(NULL)")]
    assert len(found) == len(spoken)
    return found


def test_times_agree_with_an_independent_alignment(server):
    decoder = Decoder()
    differences = []
    for text, spoken in SENTENCES:
        response = captioned(server, text)
        assert response.status_code == 200, response.text
        answer = response.json()
        wav = base64.b64decode(answer["audio"])
        words = answer["words"]
        spoken = spoken or [[word.strip(".,").lower()] for word in text.split()]
        assert [word["word"] for word in words] == CAPTIONS.get(text, [word.strip(".,") for word in text.split()])
        starts = [word["start"] for word in words]
        assert starts == sorted(starts) and all(word["start"] < word["end"] for word in words)
        assert words[-1]["end"] <= duration(wav, "wav") + 0.001
        reference = iter(aligned(decoder, wav, [word for group in spoken for word in group]))
        for word, group in zip(words, spoken, strict=True):
            times = [next(reference) for _ in group]  # a caption word spans its spoken words
            differences += [abs(word["start"] - times[0][0]), abs(word["end"] - times[-1][1])]
    print(f"median {statistics.median(differences):.3f} s, max {max(differences):.3f} s over {len(differences)} edges")
    assert statistics.median(differences) <= 0.150, sorted(differences)


def test_a_streamed_answer_is_ndjson_pieces_with_times_from_the_streams_start(server):
    text = "First sentence here. And a second one, a bit longer than the first."
    response = captioned(server, text, stream=True, response_format="pcm")
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/x-ndjson")
    pieces = [json.loads(line) for line in response.text.splitlines()]
    audio = b"".join(base64.b64decode(piece["audio"]) for piece in pieces)
    words = [word for piece in pieces for word in piece["words"]]
    assert [word["word"] for word in words] == [word.strip(".,") for word in text.split()]
    assert sum(bool(piece["words"]) for piece in pieces) == 2  # one piece per sentence
    starts = [word["start"] for word in words]
    assert starts == sorted(starts) and words[-1]["end"] <= duration(audio, "pcm") + 0.001
    assert words[4]["start"] > pieces[0]["words"][-1]["end"]  # the second sentence after the first


@pytest.mark.parametrize("kind, head, separator", [("vtt", "WEBVTT\n\n", "."), ("srt", "1\n", ",")])
def test_subtitles(server, kind, head, separator):
    response = captioned(server, "Hello there. This is a subtitle test.", timestamps_format=kind)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith({"vtt": "text/vtt", "srt": "application/x-subrip"}[kind])
    assert response.text.startswith(head) and f"00:00:00{separator}" in response.text
    assert "Hello there. This is a subtitle test." in " ".join(  # with the text's punctuation
        line for line in response.text.splitlines() if line and "-->" not in line and not line[0].isdigit())


def test_kokoro_fastapi_clients_get_their_shape(server):
    response = captioned(server, "Hello world.", path="/dev/captioned_speech", response_format="mp3")
    assert response.status_code == 200
    answer = response.json()
    assert answer["audio_format"] == "mp3" and decode(base64.b64decode(answer["audio"]), "mp3")[0].size
    assert [stamp["word"] for stamp in answer["timestamps"]] == ["Hello", "world"]
    assert set(answer["timestamps"][0]) == {"word", "start_time", "end_time"}


def test_ssml_captions_name_the_callers_words_and_keep_the_break(server):
    document = '<speak><sub alias="World Wide Web">WWW</sub> rocks.<break time="1s"/>Fish &amp; chips.</speak>'
    words = captioned(server, document).json()["words"]
    assert [word["word"] for word in words] == ["WWW", "rocks", "Fish", "&", "chips"]
    assert words[2]["start"] - words[1]["end"] >= 1.0


def test_refusals(server):
    streamed_subtitles = captioned(server, "Hello.", stream=True, timestamps_format="srt")
    assert streamed_subtitles.status_code == 400
    assert streamed_subtitles.json()["error"]["param"] == "timestamps_format"
