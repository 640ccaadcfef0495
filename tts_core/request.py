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
    due_s: float = 0.0  # a stream's later chunk: how long after the stream's first audio it is needed
    enqueued_at: float = 0.0
    future: Future = field(default_factory=Future)
    seq: int = field(default_factory=lambda: next(_sequence))
    # Stamped by the batcher when the item runs:
    queue_s: float = 0.0
    batch_s: float = 0.0
    batch_size: int = 0

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])
