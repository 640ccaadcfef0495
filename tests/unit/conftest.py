import math
import threading

import numpy as np
import pytest

from tests.fakes import FakeEngine
from tts_core.engines.contract import EngineInput
from tts_core.ops.metrics import Metrics
from tts_core.scheduler.clock import FakeClock
from tts_core.scheduler.queue import RequestQueue
from tts_core.scheduler.records import QueuedItem
from tts_core.scheduler.strategies import make_engine_loop


def make_item(length: int, tag: int = 7, key="k", deadline: float = math.inf, priority: int = 0):
    tokens = np.full(length, 7, dtype=np.int64)
    tokens[0] = tag
    return QueuedItem(EngineInput(tokens, "fake-voice"), key=key,
                            deadline=deadline, priority=priority)


@pytest.fixture
def clock() -> FakeClock:
    """The simulated time a test's loops run on: only a fake engine's cost (or the test) moves it."""
    return FakeClock()


@pytest.fixture
def start_loop(clock):
    started = []

    def start(engine: FakeEngine, policy: str = "adaptive", max_queue: int = 64,
              aging_horizon_s: float = 2.0, max_batch_size: int = 16, calibration_sizes=(1, 2, 8), instances: int = 0):
        assert engine.clock is clock, "the engine spends its cost on the loop's clock: FakeEngine(clock=clock)"
        queue = RequestQueue(max_queue, aging_horizon_s, long_tokens=400, clock=clock)
        loop = make_engine_loop(engine, queue, Metrics(), policy, max_batch_size, 100_000, calibration_sizes,
                                instances=instances)
        loop.start()
        assert loop.calibrated.wait(30)
        engine.seen.clear()
        engine.calls_started = threading.Semaphore(0)  # count calls after warm-up only
        started.append(loop)
        return loop

    yield start
    for loop in started:
        loop.stop()
