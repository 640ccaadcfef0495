"""Word timings for speech whose engine does not time its words (Pocket TTS, VibeVoice, upstream models): found in
the audio after synthesis, off the engine's thread, only where words are asked for.

English is force-aligned: pocketsphinx (its English model ships in its wheel) finds where each word of the known
text is said, and each word's edges are then moved onto the voiced frames around them (the aligner gives a pause
before a word to the word). Other languages, and English where pocketsphinx is missing or cannot place the words,
are estimated: the words share out the audio's voiced stretches by how long each is to say (its syllables, or its
letters in a script without vowels to count). Every answer says which way its words were timed: `native` (the
engine's own durations), `aligned`, `estimated`.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..text.lexicon import language_code
from .encoding import int16
from .playable import resample

log = logging.getLogger(__name__)

NATIVE, ALIGNED, ESTIMATED = "native", "aligned", "estimated"
WAYS = (NATIVE, ALIGNED, ESTIMATED)  # from the closest to the speech to the roughest
ALIGNER_RATE = 16000  # what pocketsphinx's English model listens to: 16 kHz mono 16-bit
FRAME_S = 0.01  # pocketsphinx's frame step, and the voiced frames' length
# A frame is voiced within this many dB of the loudest frame of the piece (quiet consonants stay voiced, the
# pauses between words and sentences do not).
VOICED_DB = -35.0
# Alignments at once: each decoder holds its model (about 90 MB, measured), and two align about 100 s of audio a
# second (0.02 CPU s per audio s: bench/alignment.py); more wait their turn.
MAX_DECODERS = 2
MAX_ADDED_WORDS = 20_000  # words made up for the dictionary before a decoder is made anew (its memory stays bounded)
# How letters sound, roughly, for a word the English dictionary lacks (a name, a made-up word): the aligner only
# needs sounds near enough to find where the word is.
LETTER_PHONES = {"a": "AE", "b": "B", "c": "K", "d": "D", "e": "EH", "f": "F", "g": "G", "h": "HH", "i": "IH",
                 "j": "JH", "k": "K", "l": "L", "m": "M", "n": "N", "o": "AA", "p": "P", "q": "K", "r": "R",
                 "s": "S", "t": "T", "u": "AH", "v": "V", "w": "W", "x": "K S", "y": "Y", "z": "Z"}
VOWELS = set("aeiouyàáâäãåæèéêëìíîïòóôöõøœùúûüýÿаеёиоуыэюяαεηιουωάέήίόύώ")

Spans = list[tuple[float, float]]  # (start s, end s) of each word in its piece's audio


@dataclass(frozen=True)
class SaidWords:
    """The words a queued item's input says, for an engine that does not time them: the passage's words from
    `first` on, in `language`, to be timed in its audio by `timer` once it is made."""

    first: int
    words: tuple[str, ...]
    language: str | None
    timer: WordTimer


@dataclass(frozen=True)
class Timing:
    """How one piece's words were timed, and what that cost (seconds of one core)."""

    spans: Spans
    way: str  # ALIGNED or ESTIMATED
    cpu_s: float


def is_english(language: str | None) -> bool:
    return bool(language) and language_code(language) == "en"


def voiced_frames(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """Whether each FRAME_S of the audio is voiced (within VOICED_DB of its loudest frame)."""
    size = max(1, round(FRAME_S * sample_rate))
    count = audio.size // size
    if not count:
        return np.zeros(0, dtype=bool)
    frames = np.asarray(audio[:count * size], dtype=np.float32).reshape(count, size)
    rms = np.sqrt(np.mean(frames ** 2, axis=1)) + 1e-9
    return 20 * np.log10(rms / rms.max()) > VOICED_DB


def _weight(word: str) -> int:
    """How long a word takes to say, roughly: its syllables (vowel groups), else its letters, at least 1."""
    letters = [char for char in unicodedata.normalize("NFC", word.lower()) if char.isalnum()]
    groups = sum(1 for index, char in enumerate(letters) if char in VOWELS
                 and (index == 0 or letters[index - 1] not in VOWELS))
    return max(1, groups or len(letters))


def estimate(words: Sequence[str], audio: np.ndarray, sample_rate: int) -> Spans:
    """Each word's span, the words in order sharing out the voiced frames by their weights (all of the audio where
    none is voiced)."""
    if not words:
        return []
    voiced = voiced_frames(audio, sample_rate)
    at = np.flatnonzero(voiced) if voiced.any() else np.arange(max(1, voiced.size))
    duration = audio.size / sample_rate
    weights = np.array([_weight(word) for word in words], dtype=np.float64)
    bounds = np.round(np.concatenate([[0.0], np.cumsum(weights)]) / weights.sum() * at.size).astype(int)
    spans = []
    for first, stop in zip(bounds[:-1], bounds[1:], strict=True):
        first = min(first, at.size - 1)
        last = max(first, stop - 1)
        spans.append((min(duration, float(at[first]) * FRAME_S),
                      min(duration, float(at[min(last, at.size - 1)] + 1) * FRAME_S)))
    return spans


def _parts(word: str) -> list[str]:
    """What of a written word the English dictionary may know: its letter runs, lower case ("well-known" is
    "well", "known"; "don't" stays whole); a pronunciation's span by its word ("[Worcester](/.../)")."""
    if word.startswith("[") and "]" in word:
        word = word[1:word.index("]")]
    plain = unicodedata.normalize("NFKD", word.lower())
    plain = "".join(char for char in plain if not unicodedata.combining(char))
    return [part.strip("'") for part in re.findall(r"[a-z']+", plain) if part.strip("'")]


class _Decoder:
    """One pocketsphinx decoder set to align (not for two threads at once)."""

    def __init__(self):
        from pocketsphinx import Decoder  # here: where it is missing, words are estimated

        self.decoder = Decoder(bestpath=False, loglevel="FATAL")
        self.added = 0

    def known(self, part: str) -> str:
        """The part's dictionary word, added with its letters' rough sounds where the dictionary lacks it."""
        if self.decoder.lookup_word(part) is None:
            phones = " ".join(LETTER_PHONES[char] for index, char in enumerate(part)
                              if char in LETTER_PHONES and (index == 0 or part[index - 1] != char))
            self.decoder.add_word(part, phones, True)
            self.added += 1
        return part

    def segments(self, parts: list[str], pcm: np.ndarray) -> list[tuple[float, float]]:
        """Each part's (start s, end s) in the 16 kHz audio, in order; [] where the aligner could not place them."""
        self.decoder.set_align_text(" ".join(self.known(part) for part in parts))
        self.decoder.start_utt()
        self.decoder.process_raw(pcm.tobytes(), full_utt=True)
        self.decoder.end_utt()
        found = [(segment.start_frame * FRAME_S, (segment.end_frame + 1) * FRAME_S) for segment in self.decoder.seg()
                 if not segment.word.startswith(("<", "[", "+", "("))]
        return found if len(found) == len(parts) else []


class WordTimer:
    """Times a piece's words in its audio: aligned (English, pocketsphinx there) or estimated. Safe for any number
    of threads (each alignment takes a decoder of its own, at most MAX_DECODERS at once; decoders are made as
    needed, a second or so each, and kept). `observe(way, cpu_s, audio_s)` is told each piece's cost."""

    def __init__(self, observe: Callable[[str, float, float], None] | None = None):
        self._observe = observe
        self._idle: queue.SimpleQueue[_Decoder] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._decoders = threading.BoundedSemaphore(MAX_DECODERS)
        self._missing: str | None = None  # why pocketsphinx cannot run here, once found

    def way_for(self, language: str | None) -> str:
        """How words in this language are timed here."""
        return ALIGNED if is_english(language) and self._available() else ESTIMATED

    def time_words(self, words: Sequence[str], audio: np.ndarray, sample_rate: int, language: str | None) -> Timing:
        started = time.thread_time()
        spans, way = None, ESTIMATED
        if words and audio.size and self.way_for(language) == ALIGNED:
            spans = self._aligned(words, audio, sample_rate)
            way = ALIGNED if spans is not None else ESTIMATED
        if spans is None:
            spans = estimate(words, audio, sample_rate)
        timing = Timing(spans, way, time.thread_time() - started)
        if self._observe is not None:
            self._observe(way, timing.cpu_s, audio.size / sample_rate)
        return timing

    def _available(self) -> bool:
        if self._missing is None:
            with self._lock:
                try:
                    self._idle.put(self._idle.get_nowait())
                except queue.Empty:
                    try:
                        self._idle.put(_Decoder())
                    except Exception as error:  # pocketsphinx missing or its model unreadable: estimated
                        self._missing = str(error) or type(error).__name__
                        log.warning("word alignment unavailable (%s): words are estimated", self._missing)
                        return False
                    self._missing = ""
        return not self._missing

    def _aligned(self, words: Sequence[str], audio: np.ndarray, sample_rate: int) -> Spans | None:
        """The words' spans, force-aligned then moved onto the voiced frames; None where they cannot be. A word
        with nothing to say in English letters (a dash, a symbol) sits where the words around it meet."""
        parts = [_parts(word) for word in words]
        flat = [part for word_parts in parts for part in word_parts]
        if not flat:
            return None
        pcm = int16(resample(audio, sample_rate, ALIGNER_RATE))
        with self._decoders:
            try:
                decoder = self._idle.get_nowait()
            except queue.Empty:
                decoder = _Decoder()
            try:
                found = decoder.segments(flat, pcm)
            except Exception as error:  # an alignment the decoder refuses: estimated instead
                log.debug("alignment failed: %s", error)
                found = []
            finally:
                if decoder.added < MAX_ADDED_WORDS:
                    self._idle.put(decoder)
        if not found:
            return None
        return _on_voice(_per_word(parts, found), voiced_frames(audio, sample_rate), audio.size / sample_rate)


def _per_word(parts: list[list[str]], found: list[tuple[float, float]]) -> Spans:
    spans, at, end = [], 0, 0.0
    for word_parts in parts:
        if word_parts:
            spans.append((found[at][0], found[at + len(word_parts) - 1][1]))
            at += len(word_parts)
            end = spans[-1][1]
        else:
            spans.append((end, end))
    return spans


def _on_voice(spans: Spans, voiced: np.ndarray, duration: float) -> Spans:
    """Each span shrunk to its voiced frames (where it has any): a pause the aligner gave a word is not the word."""
    moved = []
    for start, end in spans:
        first, stop = int(round(start / FRAME_S)), min(voiced.size, int(round(end / FRAME_S)))
        inside = np.flatnonzero(voiced[first:stop]) if stop > first else np.zeros(0, dtype=int)
        if inside.size:
            start, end = float(first + inside[0]) * FRAME_S, float(first + inside[-1] + 1) * FRAME_S
        moved.append((min(start, duration), min(end, duration)))
    return moved


def combined(ways: Sequence[str]) -> str | None:
    """The ways an answer's words were timed, as its header and JSON say them: one, or several comma-separated
    (a text whose SSML switches between voices), closest first; None for no words."""
    used = set(ways)
    return ",".join(way for way in WAYS if way in used) or None
