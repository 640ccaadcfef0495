"""The runaway guard: an autoregressive generation (a stepped engine's, an upstream's) that misses its end of speech
is stopped, rather than babble or stay silent until its frame budget.

The speech a text takes is learned per voice, in seconds a character (at speed 1), from its finished requests: a
running mean weighted by characters, PRIOR_S_PER_CHAR until a voice has LEARNED_AFTER of them. A generation is
stopped (docs/operating.md#the-runaway-guard) once

- its audio passes max(length_factor x the expected length, the expected length + floor_s);
- its last repeat_s of frames repeat (each within REPEAT_TOLERANCE of the frame one period before, for a period of
  up to half that window: one frame again and again, or one stretch in a loop), read through a stepped engine's
  optional `frame_vectors` (an engine without it, and an upstream, are checked by length and silence only);
- its last silence_s of audio are quiet (RMS below QUIET_RMS).

The thresholds are operator settings (tts_core.request.operating); 0 turns the repeat or the silence check off.
What to do with a stopped generation (made again once, then refused) is its strategy's (stepped.py, upstream.py).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from ..errors import RunawaySpeech
from ..ops.metrics import Metrics

PRIOR_S_PER_CHAR = 0.12  # speech a character takes before a voice has taught its own (English at a usual pace)
LEARNED_AFTER = 3  # finished requests of a voice before its own rate replaces the prior
KEPT = 50  # requests the running mean spans (older ones fade)
REPEAT_TOLERANCE = 0.01  # of a frame's norm: closer than this to the frame one period before is a repeat
QUIET_RMS = 0.002  # of full scale: quieter than this is silence


class Reason(StrEnum):
    """Why a generation was stopped: the metric's label."""

    LENGTH = "length"
    REPEAT = "repeat"
    SILENCE = "silence"


@dataclass(frozen=True)
class RunawayLimits:
    """The thresholds in force (the operator's settings runaway_*)."""

    length_factor: float = 3.0
    floor_s: float = 4.0
    repeat_s: float = 2.0  # 0: not checked
    silence_s: float = 5.0  # 0: not checked

    def most_s(self, expected_s: float) -> float:
        return max(self.length_factor * expected_s, expected_s + self.floor_s)


class RunawayWatch:
    """One generation's check, asked as its audio (or its frames) arrive. Once it has stopped, `reason` says why."""

    def __init__(self, limits: RunawayLimits, expected_s: float, sample_rate: int):
        self.limits, self.expected_s, self.sample_rate = limits, expected_s, sample_rate
        self.most_s = limits.most_s(expected_s)
        self.reason: Reason | None = None
        self.why = ""
        self._heard: deque[tuple[int, float]] = deque()  # the recent pieces: (samples, sum of squares)
        self._heard_samples = 0

    def _stop(self, reason: Reason, why: str) -> Reason:
        if self.reason is None:
            self.reason, self.why = reason, why
        return self.reason

    def made(self, audio_s: float) -> Reason | None:
        """Its audio so far is `audio_s` long: stopped where that is past what its text may take."""
        if self.reason is None and audio_s > self.most_s:
            return self._stop(Reason.LENGTH, f"it made {audio_s:.0f} s of audio where about {self.expected_s:.0f} s "
                              "were expected")
        return self.reason

    def frames(self, vectors: np.ndarray, frame_rate: float) -> Reason | None:
        """Its latest frames (oldest first, one vector each): stopped where the last repeat_s of them repeat."""
        window = math.ceil(self.limits.repeat_s * frame_rate)
        if self.reason is None and window >= 2 and len(vectors) >= window and repeating(vectors[-window:]):
            return self._stop(Reason.REPEAT, f"its last {self.limits.repeat_s:g} s of frames repeat")
        return self.reason

    def heard(self, audio: np.ndarray) -> Reason | None:
        """A new piece of its audio: stopped where its last silence_s are quiet (and its length is checked)."""
        if self.reason is not None or not audio.size:
            return self.reason
        self._heard.append((audio.size, float(np.dot(audio, audio))))
        self._heard_samples += audio.size
        window = self.limits.silence_s * self.sample_rate
        while self._heard and self._heard_samples - self._heard[0][0] >= window:  # (whole pieces, at least window)
            self._heard_samples -= self._heard.popleft()[0]
        if window > 0 and self._heard_samples >= window:
            rms = math.sqrt(sum(squares for _, squares in self._heard) / self._heard_samples)
            if rms < QUIET_RMS:
                return self._stop(Reason.SILENCE, f"its last {self.limits.silence_s:g} s were silent")
        return self.reason

    def error(self, model: str) -> RunawaySpeech:
        return RunawaySpeech(model, self.why)


def repeating(vectors: np.ndarray) -> bool:
    """Every frame is within REPEAT_TOLERANCE (of its norm) of the frame one period before, for some period up to
    half the frames."""
    vectors = np.asarray(vectors, dtype=np.float32).reshape(len(vectors), -1)
    norms = np.linalg.norm(vectors, axis=1)
    for period in range(1, len(vectors) // 2 + 1):
        apart = np.linalg.norm(vectors[period:] - vectors[:-period], axis=1)
        if np.all(apart <= REPEAT_TOLERANCE * norms[period:]):
            return True
    return False


@dataclass
class _Rate:
    seconds: float = 0.0  # decayed sums over the voice's finished requests
    chars: float = 0.0
    requests: int = 0


class RunawayGuard:
    """The guard the service's engine loops share: each voice's learned rate, what was stopped (counted per voice in
    the metrics, and for the status page), and a watch for each generation. Engine, codec and I/O threads call it."""

    def __init__(self, metrics: Metrics, limits: Callable[[], RunawayLimits] = RunawayLimits):
        """limits: the thresholds in force now (read at each generation's start: an operator's change applies to
        the next)."""
        self.metrics, self.limits = metrics, limits
        self._rates: dict[tuple[str, str], _Rate] = {}
        self._stopped: dict[tuple[str, str], dict[str, int]] = {}
        self._lock = threading.Lock()

    def s_per_char(self, model: str, voice: str) -> float:
        rate = self._rates.get((model, voice))
        return rate.seconds / rate.chars if rate and rate.requests >= LEARNED_AFTER else PRIOR_S_PER_CHAR

    def watch(self, model: str, voice: str, chars: int, speed: float, sample_rate: int) -> RunawayWatch | None:
        """The check of one generation of `chars` characters; None where its text's length is not known."""
        if chars <= 0:
            return None
        return RunawayWatch(self.limits(), chars * self.s_per_char(model, voice) / speed, sample_rate)

    def learn(self, model: str, voice: str, chars: int, speed: float, audio_s: float) -> None:
        """A request of the voice finished (not stopped): `audio_s` of audio for `chars` characters."""
        if chars <= 0 or audio_s <= 0:
            return
        with self._lock:
            rate = self._rates.setdefault((model, voice), _Rate())
            fade = 1 - 1 / KEPT
            rate.seconds = rate.seconds * fade + audio_s * speed
            rate.chars = rate.chars * fade + chars
            rate.requests += 1

    def stopped(self, model: str, voice: str, reason: Reason) -> None:
        self.metrics.runaway_stopped.labels(model, voice, reason.value).inc()
        with self._lock:
            counts = self._stopped.setdefault((model, voice), {})
            counts[reason.value] = counts.get(reason.value, 0) + 1

    def status(self) -> dict:
        """By model and voice: the seconds a character expected (learned or the prior), the requests learned from,
        and the generations stopped by reason."""
        with self._lock:
            keys = sorted(set(self._rates) | set(self._stopped))
            described: dict[str, dict] = {}
            for model, voice in keys:
                rate = self._rates.get((model, voice), _Rate())
                described.setdefault(model, {})[voice] = {
                    "s_per_char": round(self.s_per_char(model, voice), 4), "learned_from": rate.requests,
                    "stopped": dict(self._stopped.get((model, voice), {}))}
        return described
