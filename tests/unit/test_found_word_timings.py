"""Word timings found in the audio, for voices whose engines do not time their words (tts_core.audio.word_timing):
aligned against the bundled Piper voice's own timings, estimated for other languages, and the benchmark that
measures both (bench/alignment.py, its quick plan)."""

import asyncio
import sys

import numpy as np
import pytest

from bench import alignment as bench_alignment
from tests.fakes import FakeEngine
from tts_core.audio.word_timing import ALIGNED, ESTIMATED, WordTimer, combined, estimate, voiced_frames
from tts_core.config import Settings
from tts_core.engines.piper import PiperEngine, bundled_voice_path
from tts_core.ops.metrics import Metrics
from tts_core.request.ask import Ask
from tts_core.service import SpeechService

# bench/recognition.py's kind of sentence (the benchmark's own are held out of the tests)
SENTENCES = ["The weather today is sunny and warm.", "Please call me tomorrow morning at home.",
             "Wait, did somebody leave the kitchen light on?", "Mister Quillfeather painted forty-two boats."]


@pytest.fixture(scope="module")
def piper():
    """The bundled voice without its sampling noise: it says a sentence the same way every time (the benchmark
    measures the voice as served, noise on)."""
    return PiperEngine(bundled_voice_path(), noise_scale=0.0, noise_w=0.0)


def test_aligned_word_starts_are_near_the_voices_own(piper):
    """The Piper voice's audio, its words aligned as a voice that cannot time them has them: their starts within
    the benchmark's bars of the voice's own (a word the dictionary lacks included), their cost counted."""
    metrics = Metrics()
    timer = WordTimer(metrics.word_timing)
    differences = []
    for sentence in SENTENCES:
        words, native, audio = bench_alignment.native_and_audio(piper, sentence)
        timing = timer.time_words(words, audio, piper.sample_rate, "en-US")
        assert timing.way == ALIGNED and len(timing.spans) == len(words)
        starts = [start for start, _ in timing.spans]
        assert starts == sorted(starts) and all(start <= end for start, end in timing.spans)
        differences += list(np.abs(np.array(starts) - native))
    assert np.median(differences) <= 0.060 and np.percentile(differences, 90) <= 0.120
    audio_s = metrics.registry.get_sample_value("tts_word_timing_audio_seconds_total", {"way": ALIGNED})
    cpu_s = metrics.registry.get_sample_value("tts_word_timing_cpu_seconds_sum", {"way": ALIGNED})
    assert audio_s > 4 and 0 < cpu_s < audio_s


def voiced_stretches(rate: int, stretches: list[tuple[float, float]], length_s: float) -> np.ndarray:
    """A tone in each (start, end) stretch, silence around them."""
    audio = np.zeros(round(length_s * rate), dtype=np.float32)
    for start, end in stretches:
        times = np.arange(round(start * rate), round(end * rate))
        audio[times] = 0.5 * np.sin(2 * np.pi * 180 * times / rate)
    return audio


def test_a_text_in_another_language_is_estimated_in_order_over_the_voiced_audio():
    """French words: estimated (never aligned, never none), in order, inside the audio, each starting where the
    audio is voiced; longer words (more syllables) take longer."""
    rate, words = 24000, "Bonjour à tous, merveilleuse journée d'automne.".split()
    audio = voiced_stretches(rate, [(0.2, 1.1), (1.5, 2.6)], 3.0)
    timing = WordTimer().time_words(words, audio, rate, "fr-FR")
    assert timing.way == ESTIMATED and len(timing.spans) == len(words)
    starts = [start for start, _ in timing.spans]
    assert starts == sorted(starts) and 0.2 <= starts[0] and timing.spans[-1][1] <= 2.6 + 0.01
    voiced = voiced_frames(audio, rate)
    assert all(voiced[round(start / 0.01)] for start in starts)
    lengths = [end - start for start, end in timing.spans]
    assert lengths[3] > lengths[1]  # "merveilleuse" over "à"


def test_words_are_estimated_where_the_aligner_is_missing(monkeypatch, piper):
    """Without pocketsphinx (a server installed without it), English words are estimated: never none."""
    monkeypatch.setitem(sys.modules, "pocketsphinx", None)  # `import pocketsphinx` raises ImportError
    words, _, audio = bench_alignment.native_and_audio(piper, SENTENCES[0])
    timer = WordTimer()
    assert timer.way_for("en") == ESTIMATED
    timing = timer.time_words(words, audio, piper.sample_rate, "en")
    assert timing.way == ESTIMATED and timing.spans == estimate(words, audio, piper.sample_rate)


def test_silence_and_nothing_to_say_still_give_every_word_a_place():
    rate = 16000
    spans = estimate(["one", "two"], np.zeros(rate, dtype=np.float32), rate)  # no voiced frame: the whole audio
    assert len(spans) == 2 and spans[0][0] == 0 and spans[1][1] <= 1.0
    assert WordTimer().time_words([], np.zeros(rate, dtype=np.float32), rate, "en").spans == []
    assert combined(["estimated", "native", "native"]) == "native,estimated" and combined([]) is None


def test_the_alignment_benchmark_quick_plan_measures_both_ways(tmp_path):
    results = bench_alignment.run(quick=True, out=tmp_path)
    assert (tmp_path / "alignment.json").exists() and results["sentences"] == bench_alignment.QUICK_SENTENCES
    for way in (ALIGNED, ESTIMATED):
        assert results[way]["words"] > 30 and results[way]["median_ms"] >= 0 and results[way]["cpu_s_per_audio_s"] > 0
    assert results["within_bars"] and results["fell_back"] == 0
    assert len(bench_alignment.SENTENCES) >= 40


def test_a_dialogues_words_are_found_in_each_turn_whole_and_streamed():
    """Voices that do not time their words (two rates: the recording's is the higher) in a dialogue: each turn's
    words, with its speaker, inside that turn's span of the recording; streamed, the same words in order."""
    engines = [FakeEngine(name="a", voice="a-voice", language="fr"),
               FakeEngine(name="b", voice="b-voice", language="fr", sample_rate=24000)]
    service = SpeechService(Settings(batch_policy="sequential"), engines, Metrics())
    service.start()
    script, voices = "Ann: Un deux trois.\nBob: Quatre cinq.\nAnn: Six.", {"Ann": "a-voice", "Bob": "b-voice"}
    try:
        spoken = asyncio.run(service.answer(Ask(script=script, voices=voices, response_format="pcm", words=True)))
        said = [(word.speaker, word.word) for word in spoken.words]
        assert said == [("Ann", "Un"), ("Ann", "deux"), ("Ann", "trois"), ("Bob", "Quatre"), ("Bob", "cinq"),
                        ("Ann", "Six")]
        assert {word.timing for word in spoken.words} == {ESTIMATED}
        turn_of = [0, 0, 0, 1, 1, 2]
        for word, turn in zip(spoken.words, turn_of, strict=True):
            span = spoken.turns[turn]
            assert span.start - 0.011 <= word.start <= word.end <= span.end + 0.011

        async def streamed():
            stream = await service.answer(Ask(script=script, voices=voices, response_format="pcm", words=True,
                                              stream=True))
            return [words async for _, _, words in stream.encoded("pcm")]
        assert [(word.speaker, word.word) for words in asyncio.run(streamed()) for word in words] == said
    finally:
        service.stop()
