"""The records an engine reads and returns (the queue's own, `QueuedItem`, is in tts_core/scheduler/records.py).

`EngineInput` is what an engine reads of one piece of text (its input ids, voice and speed) and
`EngineOutput` what it returns (the audio, and the samples each token spans where it times words).
Engines read only these; they never see a queued item.

A one-shot engine answers an item once, on its `future` (an EngineOutput). A stepped (autoregressive)
engine also hands its audio out piece by piece as frames are made, on its `pieces` (a chain of futures,
safe to fill from the engine's thread and to read from the event loop); the future still resolves with
the whole audio at the end.
"""

from __future__ import annotations

import itertools
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

import numpy as np

_input_ids = itertools.count()


@dataclass(frozen=True, eq=False)
class EngineInput:
    """What an engine reads of one piece: its model input ids, voice and speaking rate. A stepped engine keeps
    a running input's state under its `id`."""

    tokens: np.ndarray  # int64 model input ids
    voice: str
    speed: float = 1.0
    instructions: str | None = None  # how to speak, for a model that takes them
    id: int = field(default_factory=lambda: next(_input_ids))

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])


@dataclass(frozen=True, eq=False)
class EngineOutput:
    """What an engine returns for one input: float32 mono audio in [-1, 1], and (an engine that times words)
    the audio samples each token spans, summing to the audio's length."""

    audio: np.ndarray
    token_samples: np.ndarray | None = None


class AudioPieces:
    """Audio pieces of one item in order, as the engine makes them: `head` resolves to (piece, next
    future), and (None, None) after the last. Written by the engine's thread only."""

    def __init__(self) -> None:
        self.head: Future = Future()
        self._tail = self.head

    def push(self, audio: np.ndarray) -> None:
        following: Future = Future()
        try:
            self._tail.set_result((audio, following))
        except InvalidStateError:  # the reader gave up waiting (cancelled): no one reads on
            return
        self._tail = following

    def end(self, error: BaseException | None = None) -> None:
        if self._tail.done():  # already ended
            return
        if error is None:
            self._tail.set_result((None, None))
        else:
            self._tail.set_exception(error)
