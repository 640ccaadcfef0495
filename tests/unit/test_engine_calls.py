"""Calls handed to an engine's own thread (EngineLoop.run_on_engine), with either strategy: they wake an
idle loop, wait for the running step (never beside one), return their result or exception on a Future,
and a loop that has ended takes no more."""

import math
import threading
import time

import numpy as np
import pytest

from tests.fakes import FakeEngine, FakeSteppedEngine
from tts_core.engines.contract import EngineInput
from tts_core.ops.metrics import Metrics
from tts_core.scheduler.clock import FakeClock
from tts_core.scheduler.queue import QueueClosed, RequestQueue
from tts_core.scheduler.records import QueuedItem
from tts_core.scheduler.strategies import make_engine_loop


class RecordingEngine(FakeSteppedEngine):
    """Notes which thread runs its steps and whether anything else ran while one did."""

    def __init__(self, clock: FakeClock):
        super().__init__(clock=clock)
        self.stepping = False
        self.overlapped = False
        self.stepped = threading.Event()  # a step has begun

    def step(self):
        self.stepping = True
        self.stepped.set()
        try:
            return super().step()
        finally:
            self.stepping = False

    def errand(self) -> str:
        self.overlapped |= self.stepping
        return threading.current_thread().name


@pytest.fixture
def stepped(clock):
    engine = RecordingEngine(clock)
    loop = make_engine_loop(engine, RequestQueue(64, clock=clock), Metrics(), calibration_sizes=(1,))
    loop.start()
    assert loop.calibrated.wait(30)
    yield engine, loop
    loop.stop()


def test_an_idle_loop_wakes_for_a_call_and_runs_it_on_the_engines_thread(stepped):
    engine, loop = stepped
    started = time.monotonic()
    assert loop.run_on_engine(engine.errand).result(timeout=5) == "engine-fake-ar"
    assert time.monotonic() - started < 1.0


def test_a_one_shot_engines_loop_runs_calls_the_same_way(start_loop, clock):
    loop = start_loop(FakeEngine(clock=clock))
    started = time.monotonic()
    assert loop.run_on_engine(lambda: threading.current_thread().name).result(timeout=5).startswith("engine-")
    assert time.monotonic() - started < 1.0


def test_a_call_waits_for_the_running_step_and_never_runs_beside_one(stepped):
    engine, loop = stepped
    engine.gate.clear()  # the next step blocks
    long = QueuedItem(EngineInput(np.full(50, 7, dtype=np.int64), "fake-ar-voice"), key="fake-ar", deadline=math.inf)
    engine.stepped.clear()
    loop.submit([long])
    assert engine.stepped.wait(10)
    calls = [loop.run_on_engine(engine.errand) for _ in range(5)]
    assert not any(call.done() for call in calls)  # held behind the step (each notes whether one ran beside it)
    engine.gate.set()
    assert all(call.result(timeout=5) == "engine-fake-ar" for call in calls)
    long.future.result(timeout=10)
    assert not engine.overlapped


def test_a_failing_call_fails_on_its_future_and_the_loop_goes_on(stepped):
    engine, loop = stepped

    def broken():
        raise ValueError("no such latents")

    with pytest.raises(ValueError, match="no such latents"):
        loop.run_on_engine(broken).result(timeout=5)
    assert loop.run_on_engine(lambda: 42).result(timeout=5) == 42


def test_a_stopped_loop_takes_no_more_calls(stepped):
    _, loop = stepped
    loop.stop()
    with pytest.raises(QueueClosed):
        loop.run_on_engine(lambda: None)
