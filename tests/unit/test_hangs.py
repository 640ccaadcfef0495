"""Nothing hangs: every queued item ends (synthesized, failed with a clear error, or moved to the
reloaded model), whatever unloads, stops or cancels around it."""

import asyncio
import threading

import pytest

from tests.fakes import FakeEngine
from tests.unit.conftest import make_item
from tests.unit.test_pool import make_service, spec
from tts_core.engines import ModelSpec
from tts_core.errors import DeadlineExceeded, Overloaded
from tts_core.monitor import Monitor
from tts_core.request.ask import Ask
from tts_core.request.dispatch import output_of
from tts_core.scheduler.queue import QueueClosed, RequestQueue


def test_an_item_queued_on_a_model_unloaded_meanwhile_runs_on_the_reloaded_model():
    service = make_service([spec("pin", pinned=True), spec("a"), spec("b")], max_loaded_models=2)
    try:
        script = service.validate(Ask("hello", "a-voice"))
        lookup = service.pool.loop

        async def scenario():
            stale = await lookup("a")
            await lookup("b")  # loading b unloads the idle a (the count limit is 2, with the pinned one)
            assert stale.queue.closed and "a" not in service.loops

            async def stale_first(name):  # the caller looked a up just before it was unloaded
                service.pool.loop = lookup
                return stale

            service.pool.loop = stale_first
            items = await service.scheduler.submit(script, None)
            return await asyncio.wait_for(service.scheduler.collect(items, script.voice.sample_rate), 10)

        assert asyncio.run(scenario())[0].audio.size > 0
        assert service.loops["a"] is not None  # loaded again, and the item ran there
    finally:
        service.stop()


def test_an_idle_check_and_a_submission_cannot_interleave():
    queue = RequestQueue(10)
    queue.put_many([make_item(5)])
    assert not queue.close_if_idle()  # something is queued
    taken = queue.next_candidates(1)
    queue.take(taken, 0.1)
    assert not queue.close_if_idle()  # something is running
    queue.done(1)
    assert queue.close_if_idle()
    with pytest.raises(QueueClosed):
        queue.put_many([make_item(5)])


def test_stopping_a_loop_fails_what_is_still_queued(start_loop, clock):
    engine = FakeEngine(clock=clock)
    loop = start_loop(engine, policy="sequential")
    engine.gate.clear()
    running, queued = make_item(5, tag=1), make_item(5, tag=2)
    loop.submit([running])
    assert engine.calls_started.acquire(timeout=5)
    loop.submit([queued])
    stopper = threading.Thread(target=loop.stop)
    stopper.start()
    with pytest.raises(Overloaded, match="stopped"):
        queued.future.result(timeout=5)
    engine.gate.set()
    stopper.join(10)
    assert running.future.result(timeout=5).audio.size > 0  # the batch that was running finishes


def test_a_cancel_racing_an_expiry_neither_raises_nor_loses_the_item():
    queue = RequestQueue(10)
    expired = make_item(5)
    queue.put_many([expired])
    expired.deadline = 0.0
    expired.future.cancel()
    real_cancelled = expired.future.cancelled
    expired.future.cancelled = lambda: False  # the cancel lands between the check and set_exception
    drops = []
    queue.on_drop = lambda reason, count: drops.append(reason)
    assert queue.next_candidates(5) == []
    assert real_cancelled() and drops == ["cancelled"]


def test_a_caller_never_waits_for_ever_on_an_item_nobody_answers():
    lost = make_item(5)
    lost.deadline = 0.0  # already past: only the run allowance is left
    with pytest.raises(DeadlineExceeded, match="no audio"):
        asyncio.run(output_of(lost, run_allowance_s=0.05))
    assert lost.future.cancelled()


class PrecisionEngine(FakeEngine):
    low = False
    switched_on = ""  # the thread that called set_low_precision: only the engine's own may

    def set_low_precision(self, enabled: bool) -> bool:
        self.low, self.switched_on = enabled, threading.current_thread().name
        return True


def test_a_model_loaded_again_while_degraded_is_lowered_too():
    engines = []

    def load():
        engines.append(PrecisionEngine(name="low"))
        return engines[-1]

    low = ModelSpec("low", PrecisionEngine(name="low").voices(), load, pinned=False, source=("low",))
    service = make_service([spec("pin", pinned=True), low, spec("b")], max_loaded_models=2)
    monitor = Monitor(service)
    try:
        asyncio.run(service.pool.loop("low"))
        first = service.loops["low"]
        for switch in monitor._set_precision(service.loops, low=True):  # degrade mode's lower_precision action
            switch.result(timeout=10)  # an errand on the engine's thread
        assert first.precision == "low" and engines[0].low and engines[0].switched_on == "engine-low"
        asyncio.run(service.pool.loop("b"))  # unloads the idle "low" ...
        asyncio.run(service.pool.loop("low"))  # ... and loads it again, while still degraded
        again = service.loops["low"]
        assert again is not first and again.precision == "full" and not engines[1].low
        for switch in monitor._set_precision(service.loops, low=True):
            switch.result(timeout=10)
        assert again.precision == "low" and engines[1].low
    finally:
        service.stop()
