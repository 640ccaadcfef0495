"""Speech heard back by an offline recogniser (pocketsphinx, which the server also aligns words with:
tts_core/audio/word_timing.py): its word error rate against the text that was spoken. The intelligibility tests
and the precision benchmark (bench/precision.py) listen the same way."""

from __future__ import annotations

import numpy as np

from tts_core.audio.encoding import int16
from tts_core.audio.playable import resample

RATE = 16000  # what pocketsphinx's default model listens to: 16 kHz mono 16-bit

# Plain sentences whose every word is in pocketsphinx's dictionary (no numbers, names or symbols).
SENTENCES = [
    "The weather today is sunny and warm.",
    "I would like a cup of coffee with milk.",
    "Please call me tomorrow morning at home.",
    "We walked along the river to the old bridge.",
    "The children played in the park after school.",
    "She opened the window to let in some fresh air.",
    "My brother bought a new car last week.",
    "The train leaves the station in ten minutes.",
    "Can you tell me the way to the library?",
    "The doctor said that I should rest for a few days.",
    "We are going to visit our friends this weekend.",
    "He reads the newspaper every morning before work.",
    "The meeting has been moved to next Tuesday.",
    "Please turn off the lights when you leave the room.",
    "The garden is full of flowers in the spring.",
    "They cooked a big dinner for the whole family.",
    "I lost my keys somewhere in the house.",
    "The store closes early on Sunday evening.",
    "Our teacher gave us a lot of homework today.",
    "The dog barked at the man who walked past the gate.",
]


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word edits (substitutions, insertions, deletions) from the reference to what was heard, per reference word;
    case and sentence punctuation do not count."""
    ref = [word.strip(".,?!") for word in reference.lower().split()]
    hyp = hypothesis.lower().split()
    previous = list(range(len(hyp) + 1))
    for i, ref_word in enumerate(ref, start=1):
        current = [i] + [0] * len(hyp)
        for j, hyp_word in enumerate(hyp, start=1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref_word != hyp_word))
        previous = current
    return previous[-1] / len(ref)


def as_heard(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """float32 audio at any rate as the recogniser listens to it."""
    return int16(resample(audio, sample_rate, RATE))


class Recogniser:
    """One recogniser (loading its model takes a second); not for two threads at once."""

    def __init__(self):
        from pocketsphinx import Decoder  # here: what only reads or resamples audio needs no recogniser

        self._decoder = Decoder()

    def hear(self, pcm16k: np.ndarray) -> str:
        """The words heard in 16 kHz 16-bit audio (as_heard's)."""
        self._decoder.start_utt()
        self._decoder.process_raw(np.ascontiguousarray(pcm16k, dtype=np.int16).tobytes(), full_utt=True)
        self._decoder.end_utt()
        hypothesis = self._decoder.hyp()
        return hypothesis.hypstr if hypothesis else ""

    def error_rate(self, text: str, audio: np.ndarray, sample_rate: int) -> float:
        """The word error rate of speech of text."""
        return word_error_rate(text, self.hear(as_heard(audio, sample_rate)))
