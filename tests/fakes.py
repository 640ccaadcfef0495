"""A fake engine with a controlled cost curve, for policy and batcher tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from tts_core.engines.base import Engine, Voice

POISON = 999  # a token that makes the fake engine raise
SAMPLES_PER_TOKEN = 100


class FakeEngine(Engine):
    """Costs `cost(batch_size, padded_tokens)` seconds per call, spent sleeping (so both the
    batcher and the test see real time pass). Each item's audio is SAMPLES_PER_TOKEN samples per
    token, filled with the item's first token so a test can tell whose audio it got."""

    def __init__(self, cost: Callable[[int, int], float] = lambda size, padded: 0.0,
                 sample_rate: int = 16000, name: str = "fake"):
        self.name = name
        self.sample_rate = sample_rate
        self.cost = cost
        self.seen: list[list[int]] = []  # first token of each item, per call
        self.gate = threading.Event()  # cleared: calls block until it is set
        self.gate.set()
        self.calls_started = threading.Semaphore(0)

    def voices(self) -> list[Voice]:
        return [Voice("fake-voice", "fake", "en", self.sample_rate)]

    def tokenize(self, text: str, voice: str) -> list[np.ndarray]:
        return [np.full(len(sentence), 7, dtype=np.int64) for sentence in text.split("|") if sentence]

    def synthesize(self, batch: Sequence) -> list[np.ndarray]:
        self.seen.append([int(item.tokens[0]) for item in batch])
        self.calls_started.release()
        self.gate.wait()
        time.sleep(self.cost(len(batch), len(batch) * max(item.length for item in batch)))
        if any(POISON in item.tokens for item in batch):
            raise RuntimeError("poisoned item")
        return [np.full(item.length * SAMPLES_PER_TOKEN, item.tokens[0] / 1000, dtype=np.float32)
                for item in batch]


def flat_cost(size: int, padded: int) -> float:
    """Batching pays: a large fixed cost per call, tiny per token (a GPU's shape)."""
    return 0.040 + 0.00001 * padded


def linear_cost(size: int, padded: int) -> float:
    """Batching does not pay: cost grows with every padded token (a small CPU's shape)."""
    return 0.0004 * padded
