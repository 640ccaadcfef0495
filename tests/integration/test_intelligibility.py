"""Round trip through an offline recogniser: the audio must be recognisable English speech."""

import numpy as np
import pytest

from bench.recognition import SENTENCES, Recogniser, word_error_rate
from tests.audio_check import to_16k_int16


@pytest.fixture(scope="module")
def recogniser():
    return Recogniser()


def test_synthesized_speech_is_recognised(speak, recogniser):
    errors = [word_error_rate(s, recogniser.hear(to_16k_int16(speak(s, "wav").content))) for s in SENTENCES[:4]]
    assert np.mean(errors) < 0.35, errors


def test_noise_and_silence_are_not(recogniser):
    noise = np.random.default_rng(0).normal(0, 3000, 16000 * 3).astype(np.int16)
    silence = np.zeros(16000 * 3, dtype=np.int16)
    for audio in (noise, silence):
        assert word_error_rate(SENTENCES[0], recogniser.hear(audio)) > 0.9
