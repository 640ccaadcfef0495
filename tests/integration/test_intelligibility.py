"""Round trip through an offline recogniser: the audio must be recognisable English speech."""

import numpy as np
import pytest
from pocketsphinx import Decoder

from tests.audio_check import to_16k_int16

SENTENCES = [
    "The weather today is sunny and warm.",
    "I would like a cup of coffee with milk.",
    "Please call me tomorrow morning at home.",
    "We walked along the river to the old bridge.",
]


def word_error_rate(reference: str, hypothesis: str) -> float:
    ref, hyp = reference.lower().strip(".").split(), hypothesis.lower().split()
    previous = list(range(len(hyp) + 1))
    for i, ref_word in enumerate(ref, start=1):
        current = [i] + [0] * len(hyp)
        for j, hyp_word in enumerate(hyp, start=1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref_word != hyp_word))
        previous = current
    return previous[-1] / len(ref)


def recognise(decoder: Decoder, pcm16k: np.ndarray) -> str:
    decoder.start_utt()
    decoder.process_raw(pcm16k.tobytes(), full_utt=True)
    decoder.end_utt()
    return decoder.hyp().hypstr if decoder.hyp() else ""


@pytest.fixture(scope="module")
def decoder():
    return Decoder()


def test_synthesized_speech_is_recognised(speak, decoder):
    errors = [word_error_rate(s, recognise(decoder, to_16k_int16(speak(s, "wav").content))) for s in SENTENCES]
    assert np.mean(errors) < 0.35, errors


def test_noise_and_silence_are_not(decoder):
    noise = np.random.default_rng(0).normal(0, 3000, 16000 * 3).astype(np.int16)
    silence = np.zeros(16000 * 3, dtype=np.int16)
    for audio in (noise, silence):
        assert word_error_rate(SENTENCES[0], recognise(decoder, audio)) > 0.9
