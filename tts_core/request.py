"""The unit of scheduled work: one text chunk of one caller's request, and how its audio comes back.

A one-shot engine answers an item once, on its `future`. A stepped (autoregressive) engine also
hands its audio out piece by piece as frames are made, on its `pieces` (a chain of futures, safe
to fill from the engine's thread and to read from the event loop); the future still resolves with
the whole audio at the end.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

import numpy as np

_sequence = itertools.count()


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


@dataclass(eq=False)
class SynthesisRequest:
    tokens: np.ndarray  # int64 model input ids
    voice: str
    speed: float
    key: Hashable  # items batch together only when their keys are equal
    deadline: float  # time.monotonic() after which the caller no longer waits
    priority: int = 0  # higher runs earlier; 0 is the default tier
    tier: str = ""  # the caller's tier, for its share of the queue
    caller: str = ""  # who asked ("key:<id>", "ip:<address>"): one caller's items keep their order
    due_s: float = 0.0  # a stream's later chunk: how long after the stream's first audio it is needed
    cost_s: float = 0.0  # predicted engine time, for the queue's wait predictions
    sample_rate: int = 0  # the engine's: its audio's rate
    pause_s: float = 0.0  # silence before its audio where the answer joins it to the item before
    cut: bool = False  # a stream's piece cut from the chunk before it: joined with no pause and no quiet edges
    passage: int = 0  # which passage of its script it speaks (tts_core.script)
    word_ids: np.ndarray | None = None  # asked for word timestamps: each token's word of the passage, or -1
    enqueued_at: float = 0.0
    start: float = 0.0  # the queue's rank: virtual start time, set when queued
    future: Future = field(default_factory=Future)
    pieces: AudioPieces | None = None  # set by a caller that plays the audio as it is made
    abandoned: bool = False  # the caller has gone: a running item is stopped at the next step
    seq: int = field(default_factory=lambda: next(_sequence))
    # Stamped by the batcher when the item runs:
    queue_s: float = 0.0
    batch_s: float = 0.0
    batch_size: int = 0
    # Stamped by an engine that times words: audio samples each token spans, summing to the item's audio length
    token_samples: np.ndarray | None = None

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])

    def resolve(self, outcome: np.ndarray | BaseException) -> None:
        """Its audio (or why there is none), unless its caller cancelled it meanwhile (then no one waits)."""
        try:
            if isinstance(outcome, BaseException):
                self.future.set_exception(outcome)
            else:
                self.future.set_result(outcome)
        except InvalidStateError:
            pass

    def abandon(self) -> None:
        """The caller no longer wants it: dropped from the queue, or stopped if it is running."""
        self.abandoned = True
        self.future.cancel()
