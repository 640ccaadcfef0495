"""Fake engines with a controlled cost curve, for policy and loop tests: each spends its cost on its clock (a
FakeClock in unit tests, which that cost advances; the system's, sleeping, in integration tests and benchmarks)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from tts_core.engines.base import OneShotEngine, SteppedEngine, Voice
from tts_core.engines.contract import EngineInput, EngineOutput
from tts_core.scheduler.clock import SYSTEM_CLOCK, Clock

POISON = 999  # a token that makes the fake engine raise
SAMPLES_PER_TOKEN = 100


class FakeEngine(OneShotEngine):
    """Costs `cost(batch_size, padded_tokens)` seconds per call, spent sleeping on `clock` (so the loop, which
    times it on the same clock, and the test see that time pass). Each item's audio is SAMPLES_PER_TOKEN samples per
    token, filled with the item's first token so a test can tell whose audio it got."""

    def __init__(self, cost: Callable[[int, int], float] = lambda size, padded: 0.0,
                 sample_rate: int = 16000, name: str = "fake", voice: str = "fake-voice", language: str = "en",
                 clock: Clock = SYSTEM_CLOCK):
        self.name, self.clock = name, clock
        self.voice, self.language = voice, language
        self.sample_rate = sample_rate
        self.cost = cost
        self.seen: list[list[int]] = []  # first token of each item, per call
        self.gate = threading.Event()  # cleared: calls block until it is set
        self.gate.set()
        self.calls_started = threading.Semaphore(0)

    def voices(self) -> list[Voice]:
        return [Voice(self.voice, "fake", self.language, self.sample_rate)]

    def tokenize(self, text: str, voice: str) -> list[np.ndarray]:
        return [np.full(len(sentence), 7, dtype=np.int64) for sentence in text.split("|") if sentence]

    def synthesize(self, batch: Sequence[EngineInput]) -> list[EngineOutput]:
        self.seen.append([int(item.tokens[0]) for item in batch])
        self.calls_started.release()
        self.gate.wait()
        self.clock.sleep(self.cost(len(batch), len(batch) * max(item.length for item in batch)))
        if any(POISON in item.tokens for item in batch):
            raise RuntimeError("poisoned item")
        return [EngineOutput(np.full(item.length * SAMPLES_PER_TOKEN, item.tokens[0] / 1000, dtype=np.float32))
                for item in batch]


def flat_cost(size: int, padded: int) -> float:
    """Batching pays: a large fixed cost per call, tiny per token (a GPU's shape)."""
    return 0.040 + 0.00001 * padded


def linear_cost(size: int, padded: int) -> float:
    """Batching does not pay: cost grows with every padded token (a small CPU's shape)."""
    return 0.0004 * padded


class FakeSteppedEngine(SteppedEngine):
    """An autoregressive engine with a controlled step cost (spent on `clock`, as FakeEngine's): an item makes
    one frame per step, as many frames as it has tokens (FRAME samples each, filled with its first token / 1000,
    so a test can tell whose audio it got). `gate` cleared: steps block until it is set. `events` records, in order,
    ("admit", tag) and ("take", tag) for each item joining and each piece of audio taken (tag: its
    first token); `on_take(item)` runs at each piece taken (with the item's engine input), before it is, and
    `on_step()` at each step, before it runs; `on_decode(frames)` at each piece decoded, before it is, and
    `decode_cost(frames)` is what decoding a piece of that many frames costs. decodes_apart: a codec thread
    decodes its pieces (as Pocket TTS's)."""

    frame_rate = 10.0
    kv_bytes_per_token = 1000.0

    def __init__(self, step_cost: Callable[[int], float] = lambda running: 0.0, max_running: int = 8,
                 name: str = "fake-ar", fail_admitting: Callable[[int], bool] = lambda running: False,
                 clock: Clock = SYSTEM_CLOCK, decodes_apart: bool = False):
        self.name, self.sample_rate, self.max_running, self.clock = name, 1000, max_running, clock
        self.decodes_apart = decodes_apart
        self.step_cost, self.fail_admitting = step_cost, fail_admitting
        self.gate = threading.Event()
        self.gate.set()
        self.steps_run: list[int] = []  # running requests at each step
        self.events: list[tuple[str, int]] = []
        self.on_take: Callable[[EngineInput], None] = lambda item: None
        self.on_step: Callable[[], None] = lambda: None
        self.on_decode: Callable[[np.ndarray], None] = lambda frames: None
        self.decode_cost: Callable[[int], float] = lambda frames: 0.0
        self._running: dict[int, EngineInput] = {}  # by id, in the order they joined
        self._made: dict[int, int] = {}  # item id -> frames made
        self._taken: dict[int, int] = {}  # item id -> frames whose audio was taken

    def voices(self) -> list[Voice]:
        return [Voice("fake-ar-voice", "fake-ar", "en", self.sample_rate, speed_control=False)]

    def tokenize(self, text: str, voice: str) -> list[np.ndarray]:
        return [np.full(len(text), 7, dtype=np.int64)] if text else []

    def frames_needed(self, item) -> int:
        return item.length

    def context_tokens(self, item) -> int:
        return 2 * item.length

    def context_length(self, item_id: int) -> int:
        return self._running[item_id].length + self._made[item_id]

    def running(self) -> list[int]:
        return list(self._running)

    def admit(self, items: Sequence[EngineInput]) -> list[int]:
        if self.fail_admitting(len(self._running) + len(items)):
            raise MemoryError("no room in the fake cache")
        for item in items:
            self._running[item.id] = item
            self._made[item.id], self._taken[item.id] = 1, 0
            self.events.append(("admit", int(item.tokens[0])))
        return [item.id for item in items if item.length <= 1]

    def step(self) -> list[int]:
        self.gate.wait()
        self.on_step()
        self.steps_run.append(len(self._running))
        self.clock.sleep(self.step_cost(len(self._running)))
        finished = []
        for item_id, item in self._running.items():
            self._made[item_id] += 1
            if self._made[item_id] == item.length:
                finished.append(item_id)
        return finished

    def take_frames(self, item_id: int, final: bool = False) -> np.ndarray | None:
        item = self._running[item_id]
        new = self._made[item_id] - self._taken[item_id]
        self._taken[item_id] = self._made[item_id]
        if not new:
            return None
        self.on_take(item)
        self.events.append(("take", int(item.tokens[0])))
        return np.full(new * FRAME, item.tokens[0] / 1000, dtype=np.float32)

    def decode(self, frames: np.ndarray) -> np.ndarray:
        self.on_decode(frames)
        self.clock.sleep(self.decode_cost(frames.size // FRAME))
        return frames

    def release(self, item_id: int) -> None:
        del self._running[item_id], self._made[item_id], self._taken[item_id]


FRAME = 100  # samples per frame of FakeSteppedEngine (1000 Hz, 10 frames/s)
