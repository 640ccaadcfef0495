"""The queue's record of scheduled work: `QueuedItem`, what the queue orders and the answer is assembled from.

It holds the caller, tier, priority, deadline and due time, where its audio goes in the answer, the timings, and
how its audio comes back; the engine reads only its `input` (an EngineInput) and returns an EngineOutput (both
records of the engine contract, tts_core/engines/contract.py), and never sees the queued item.

Its audio comes back on its `future` (an EngineOutput), and as it is made on its `pieces` where a caller plays it
so (a stepped engine's frames: AudioPieces).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

import numpy as np

from ..audio.word_timing import SaidWords
from ..engines.contract import AudioPieces, EngineInput, EngineOutput, UnsoundAudio, audio_fault

_sequence = itertools.count()


@dataclass(eq=False)
class QueuedItem:
    input: EngineInput
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
    passage: int = 0  # which passage of its script it speaks (tts_core.request.script)
    word_ids: np.ndarray | None = None  # asked for word timestamps: each input token's word of the passage, or -1
    said: SaidWords | None = None  # asked for word timestamps of an engine that does not time words: its words
    enqueued_at: float = 0.0
    rank: float = 0.0  # the queue's virtual start for it, when the next batch was last chosen
    future: Future = field(default_factory=Future)
    pieces: AudioPieces | None = None  # set by a caller that plays the audio as it is made
    abandoned: bool = False  # the caller has gone: a running item is stopped at the next step
    seq: int = field(default_factory=lambda: next(_sequence))
    # Stamped by its engine loop when it runs:
    queue_s: float = 0.0
    batch_s: float = 0.0
    batch_size: int = 0

    @property
    def length(self) -> int:
        return self.input.length

    def resolve(self, outcome: EngineOutput | BaseException) -> None:
        """Its audio (or why there is none), unless its caller cancelled it meanwhile (then no one waits). Audio that
        is not audio (audio_fault: NaN, +1e30) is never handed on: its caller gets a 500 to retry instead."""
        if isinstance(outcome, EngineOutput) and (fault := audio_fault(outcome.audio)) is not None:
            outcome = UnsoundAudio(fault)
        try:
            if isinstance(outcome, BaseException):
                self.future.set_exception(outcome)
            else:
                self.future.set_result(outcome)
        except InvalidStateError:
            pass

    def claim(self) -> bool:
        """Whether its answer is still to be given, made so that no cancel can land before it: False where its
        caller cancelled it or it has its answer. (A future already running, one taken and put back, is claimed:
        asking again would raise and end the thread that asked.)"""
        try:
            return self.future.set_running_or_notify_cancel()
        except RuntimeError:  # not pending: running (claimed already) or done
            return not self.future.done()

    def abandon(self) -> None:
        """The caller no longer wants it: dropped from the queue, or stopped if it is running."""
        self.abandoned = True
        self.future.cancel()
