import threading
import time

import pytest

from tests.fakes import POISON, SAMPLES_PER_TOKEN, FakeEngine, flat_cost, linear_cost
from tests.unit.conftest import make_item
from tts_core.errors import SynthesisError
from tts_core.ops.metrics import Metrics
from tts_core.scheduler.one_shot import CALIBRATION_LENGTHS
from tts_core.scheduler.queue import RequestQueue
from tts_core.scheduler.strategies import make_engine_loop


def submit_while_busy(loop, engine, items):
    """Hold the engine on one blocker call, queue items behind it, then let it go."""
    engine.gate.clear()
    blocker = make_item(5, tag=0)
    loop.submit([blocker])
    assert engine.calls_started.acquire(timeout=5)
    loop.submit(items)
    return blocker


def release(engine, blocker):
    engine.gate.set()
    blocker.future.result(timeout=5)


def test_one_bad_item_fails_alone_and_the_loop_keeps_running(start_loop, clock):
    engine = FakeEngine(clock=clock)
    loop = start_loop(engine, policy="static")  # static: the 4 items surely share a batch
    items = [make_item(20, tag=1), make_item(20, tag=POISON), make_item(20, tag=3), make_item(20, tag=4)]
    loop.submit(items)
    clock.sleep(0.6)  # static waits 0.5 s for a fuller batch, then runs the 4
    assert items[0].future.result(timeout=5).audio.size == 20 * SAMPLES_PER_TOKEN
    with pytest.raises(SynthesisError, match=r"in model fake \(RuntimeError\)"):
        items[1].future.result(timeout=5)
    assert all(item.future.result(timeout=5) is not None for item in items[2:])
    assert len(engine.seen[0]) == 4  # tried as one batch, then item by item
    later = make_item(30, tag=5)
    loop.submit([later])
    clock.sleep(0.6)
    assert later.future.result(timeout=5).audio.size == 30 * SAMPLES_PER_TOKEN


def test_each_item_gets_its_own_audio(start_loop, clock):
    engine = FakeEngine(cost=flat_cost, clock=clock)
    loop = start_loop(engine)
    items = [make_item(10 + tag, tag=tag) for tag in range(1, 20)]
    blocker = submit_while_busy(loop, engine, items)
    release(engine, blocker)
    for item in items:
        audio = item.future.result(timeout=5).audio
        assert audio.size == item.length * SAMPLES_PER_TOKEN
        assert audio[0] == pytest.approx(item.input.tokens[0] / 1000)


def test_cancelled_request_is_never_synthesized(start_loop, clock):
    engine = FakeEngine(clock=clock)
    loop = start_loop(engine)
    gone, kept = make_item(20, tag=1), make_item(20, tag=2)
    blocker = submit_while_busy(loop, engine, [gone, kept])
    assert gone.future.cancel()  # the client left while it was queued
    release(engine, blocker)
    kept.future.result(timeout=5)
    assert all(1 not in call for call in engine.seen)


@pytest.mark.parametrize("cost, expect_batching", [(flat_cost, True), (linear_cost, False)])
def test_adaptive_batcher_learns_whether_batching_pays(start_loop, clock, cost, expect_batching):
    """On the fake clock: the calibration sweep and the batches cost simulated time only, measured exactly."""
    wall_started, simulated_started = time.perf_counter(), clock.now()
    engine = FakeEngine(cost=cost, clock=clock)
    loop = start_loop(engine, calibration_sizes=(1, 2, 4, 8, 16))
    items = [make_item(40 + i % 7, tag=i + 1) for i in range(24)]
    blocker = submit_while_busy(loop, engine, items)
    release(engine, blocker)
    for item in items:
        item.future.result(timeout=10)
    sizes = [len(call) for call in engine.seen[1:]]
    if expect_batching:
        assert max(sizes) == 16 and len(sizes) <= 3, engine.seen
    else:
        assert sizes == [1] * 24
    simulated_s = clock.now() - simulated_started
    assert simulated_s > 1.0  # the sweep's and the items' engine time
    assert time.perf_counter() - wall_started < 0.5 * simulated_s  # none of it spent waiting


def test_retry_after_grows_with_the_backlog(start_loop, clock):
    engine = FakeEngine(cost=lambda size, padded: 0.05, clock=clock)
    loop = start_loop(engine, policy="sequential")
    blocker = submit_while_busy(loop, engine, [make_item(10) for _ in range(40)])
    assert loop.queue.backlog_s() >= 1.9  # 40 queued items of 50 ms: what a full queue's Retry-After says
    release(engine, blocker)


class HeldAfterWarmUp(FakeEngine):
    """Its first call after the warm-up's (the calibration sweep's first point) waits until `go` is set."""

    warm_up_calls = 1 + len(CALIBRATION_LENGTHS)  # a cold run, one per length

    def __init__(self, **options):
        super().__init__(**options)
        self.held, self.go = threading.Event(), threading.Event()

    def synthesize(self, batch):
        if len(self.seen) == self.warm_up_calls:
            self.held.set()
            assert self.go.wait(10)
        return super().synthesize(batch)


def test_the_batcher_serves_before_its_calibration_sweep_is_done(clock):
    """Ready after the warm-up; the sweep's points run between requests: one that comes mid-sweep waits for
    the point under way, not for the rest of the sweep."""
    engine = HeldAfterWarmUp(cost=lambda size, padded: 0.05, clock=clock)  # a sweep of 2 lengths x 5 sizes x 2 runs
    loop = make_engine_loop(engine, RequestQueue(64, 2.0, clock=clock), Metrics(), "adaptive", 16, 100_000,
                            (1, 2, 4, 8, 16))
    loop.start()
    try:
        assert loop.ready.wait(30)
        assert engine.held.wait(10) and not loop.calibrated.is_set()  # the sweep's first point is under way
        item = make_item(10, tag=42)
        loop.submit([item])
        engine.go.set()
        item.future.result(timeout=10)
        assert loop.calibrated.wait(30)
        served_at = engine.seen.index([42])
        assert served_at <= engine.warm_up_calls + 2  # after the point under way (two runs), not the whole sweep
        # the warm-up, the sweep (two runs of each length and size), the item
        assert len(engine.seen) == engine.warm_up_calls + 2 * len(CALIBRATION_LENGTHS) * 5 + 1
    finally:
        engine.go.set()
        loop.stop()
