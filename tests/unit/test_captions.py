"""Caption words from spoken-word times: named as the caller wrote them, one per written thing; and
subtitles made of them."""

import asyncio
from dataclasses import replace

import pytest

from tests.fakes import FakeEngine
from tts_core.config import Settings
from tts_core.engines.base import Voice
from tts_core.ops.metrics import Metrics
from tts_core.request.ask import Ask
from tts_core.request.captions import CaptionWord, caption_words, subtitles
from tts_core.request.script import Passage, Script
from tts_core.service import SpeechService
from tts_core.text.chunks import words
from tts_core.text.frontend import normalize_text, spoken_parts, ssml

VOICE = Voice("v", "fake", "en", 16000)


def caption_words_of(text: str) -> list[CaptionWord]:
    """Each spoken word said for 1 s, one after another: the caption words."""
    if ssml.is_ssml(text):
        passages = tuple(Passage(spoken_parts(raw.parts, "en"), VOICE, "fake", 1.0)
                         for raw in ssml.parse(text).passages)
    else:
        passages = (Passage(normalize_text(text, "en"), VOICE, "fake", 1.0),)
    script = Script(passages, VOICE, "fake")
    timed, at = [], 0.0
    for index, passage in enumerate(passages):
        for word in range(len(words(passage.spoken.text))):
            timed.append((index, word, at, at + 1.0))
            at += 1.0
    return caption_words(script, text, timed)


def captions_of(text: str) -> list[tuple[str, float, float]]:
    """The caption words and their times."""
    return [(word.word, word.start, word.end) for word in caption_words_of(text)]


@pytest.mark.parametrize("text, expected", [
    ("Hello, world!", [("Hello", 0, 1), ("world", 1, 2)]),
    ("It costs $5 today.", [("It", 0, 1), ("costs", 1, 2), ("$5", 2, 4), ("today", 4, 5)]),
    ("Meet   me\nat 7:45 pm.", [("Meet", 0, 1), ("me", 1, 2), ("at", 2, 3), ("7:45 pm", 3, 7)]),
    ("**Bold** and [a link](http://x.y) H2O", [("Bold", 0, 1), ("and", 1, 2), ("a", 2, 3), ("link", 3, 4),
                                                ("H2O", 4, 7)]),
    ("Visit [Worcester](/ˈwʊstər/) now", [("Visit", 0, 1), ("Worcester", 1, 2), ("now", 2, 3)]),
    ('<speak><sub alias="World Wide Web">WWW</sub> &amp; <say-as interpret-as="characters">abc</say-as>'
     '<break time="1s"/>caf&#233;</speak>', [("WWW", 0, 3), ("&", 3, 4), ("abc", 4, 7), ("café", 7, 8)]),
])
def test_caption_words_are_the_callers_words(text, expected):
    assert captions_of(text) == expected


@pytest.mark.parametrize("kind", ["srt", "vtt"])
def test_subtitles_keep_the_texts_punctuation(kind):
    words = caption_words_of("Hello there. This is a subtitle test.")
    assert [word.word for word in words] == ["Hello", "there", "This", "is", "a", "subtitle", "test"]  # the times'
    cues = [line for line in subtitles(words, kind).splitlines()[1:] if line and "-->" not in line
            and not line.isdigit()]
    assert " ".join(cues) == "Hello there. This is a subtitle test."


@pytest.mark.parametrize("text, shown", [
    ('He said "Wait..." and left; ¿Qué? Costs $5, at 7:45 pm.',
     ["He", "said", '"Wait..."', "and", "left;", "¿Qué?", "Costs", "$5,", "at", "7:45 pm."]),
    ("Mr. Smith's toys, e.g. these!", ["Mr.", "Smith's", "toys,", "e.g.", "these!"]),
    # markdown's and SSML's marks are not the text's
    ("**Bold** and [a link](http://x.y) H2O?", ["Bold", "and", "a", "link", "H2O?"]),
    ('<speak><sub alias="World Wide Web">WWW</sub> &amp; <break time="1s"/>chips. Fish!</speak>',
     ["WWW", "&", "chips.", "Fish!"]),
])
def test_a_subtitle_word_keeps_the_punctuation_written_beside_it(text, shown):
    assert [word.shown for word in caption_words_of(text)] == shown


def test_subtitles_in_both_formats():
    words = [CaptionWord("One", 0.0, 0.5, 0, 3), CaptionWord("two", 0.5, 1.0, 4, 7),
             CaptionWord("three", 2.0, 2.5, 8, 13),  # after a pause: a new cue
             *[CaptionWord("word", 3.2 + index * 0.2, 3.4 + index * 0.2, 0, 0) for index in range(10)]]
    srt = subtitles(words, "srt")
    assert srt.startswith("1\n00:00:00,000 --> 00:00:01,000\nOne two\n\n2\n00:00:02,000 --> 00:00:02,500\nthree\n")
    vtt = subtitles(words, "vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.000\nOne two\n\n00:00:02.000 --> 00:00:02.500\n")
    cues = [block.split("\n")[-1] for block in vtt.strip().split("\n\n")[1:]]
    assert all(len(cue) <= 42 for cue in cues) and cues[2:] == ["word word word word word word word word",
                                                                 "word word"]
    assert subtitles([CaptionWord("late", 3725.5, 3726.0, 0, 4)], "srt") == (
        "1\n01:02:05,500 --> 01:02:06,000\nlate\n")


@pytest.mark.parametrize("kind", ["srt", "vtt"])
def test_no_word_or_speaker_can_break_a_cue(kind):
    words = [CaptionWord("a\x00b", 0.0, 0.5, 0, 3, speaker="X\n\n99\n00:00:00,000 --> 00:00:09,000"),
             CaptionWord("c-->d\ne", 0.5, 1.0, 4, 7, speaker="X\n\n99\n00:00:00,000 --> 00:00:09,000")]
    written = subtitles(words, kind)
    assert "\x00" not in written and written.count("-->") == 1  # the one cue's own timing line
    assert len(written.strip().split("\n\n")) == (1 if kind == "srt" else 2)  # (WebVTT's header, then its cue)


def cue_texts(words: list[CaptionWord]) -> list[str]:
    return [block.split("\n")[-1] for block in subtitles(words, "vtt").strip().split("\n\n")[1:]]


def test_a_cue_never_spans_a_sentence_end():
    # the issue's: 0.375 s between the sentences, short of a pause, made "Hello there. This is a subtitle test, with"
    text = "Hello there. This is a subtitle test, with more. Dr. Smith said “Go!” Then e.g. this? Yes! Fine"
    words = caption_words_of(text)
    packed = [replace(word, start=index * 0.3, end=index * 0.3 + 0.3) for index, word in enumerate(words)]
    assert cue_texts(packed) == ["Hello there.", "This is a subtitle test, with more.", "Dr. Smith said “Go!”",
                                 "Then e.g. this?", "Yes!", "Fine"]


def test_a_voice_that_cannot_time_its_words_has_them_found_in_its_audio():
    """Words asked of a voice whose engine does not time them are found in its audio once it is made: in order,
    inside the audio, saying how (estimated where the voice is not English; aligned or estimated in English)."""
    for language, ways in (("fr", {"estimated"}), ("en", {"aligned", "estimated"})):
        service = SpeechService(Settings(batch_policy="sequential"), [FakeEngine(language=language)], Metrics())
        service.start()
        try:
            text = "Un deux trois. Quatre cinq." if language == "fr" else "One two three. Four five."
            spoken = asyncio.run(service.answer(Ask(text, "fake-voice", words=True)))
            assert [word.word for word in spoken.words] == ["Un", "deux", "trois", "Quatre", "cinq"] if (
                language == "fr") else ["One", "two", "three", "Four", "five"]
            assert {word.timing for word in spoken.words} <= ways
            starts = [word.start for word in spoken.words]
            assert starts == sorted(starts) and 0 <= starts[0] and spoken.words[-1].end <= spoken.duration_s + 1e-6
            assert all(word.start <= word.end for word in spoken.words)
            assert asyncio.run(service.answer(Ask(text, "fake-voice"))).words is None  # plain speech is unchanged
            costs = service.metrics.registry.get_sample_value("tts_word_timing_audio_seconds_total",
                                                              {"way": spoken.words[0].timing})
            assert costs and costs > 0  # the timing's cost is in the metrics
        finally:
            service.stop()


def test_markup_beside_a_word_is_not_part_of_it_and_webvtt_cues_are_escaped():
    assert [word for word, _, _ in captions_of('Salt <b>& "pepper"</b> & <i>chips</i>.')] == [
        "Salt", "&", "pepper", "&", "chips"]
    vtt = subtitles([CaptionWord("<3", 0.0, 0.5, 0, 2), CaptionWord("&", 0.5, 1.0, 3, 4)], "vtt")
    assert vtt.endswith("\n&lt;3 &amp;\n")
