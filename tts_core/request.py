"""The unit of scheduled work: one text chunk of one caller's request."""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

_sequence = itertools.count()


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
    enqueued_at: float = 0.0
    start: float = 0.0  # the queue's rank: virtual start time, set when queued
    future: Future = field(default_factory=Future)
    seq: int = field(default_factory=lambda: next(_sequence))
    # Stamped by the batcher when the item runs:
    queue_s: float = 0.0
    batch_s: float = 0.0
    batch_size: int = 0

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])
