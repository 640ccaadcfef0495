"""A batch that fails at degrade mode's lower precision runs again at full, and lower precision stays off for that
model until the operator resets it (issue 43 item 3, issue 44 case 7)."""

import asyncio

import numpy as np

from tests.fakes import SAMPLES_PER_TOKEN, FakeEngine
from tests.unit.conftest import make_item
from tests.unit.test_pool import make_service, spec
from tts_core.engines import ModelSpec


class FailsLow(FakeEngine):
    """Raises at its lower precision, as VITS's flow did in fp16 ("Discriminant has negative values")."""

    low = False

    def set_low_precision(self, enabled: bool) -> bool:
        self.low = enabled
        return True

    def synthesize(self, batch):
        if self.low:
            self.seen.append([-1] * len(batch))
            raise ValueError("Discriminant has negative values")
        return super().synthesize(batch)


def run_items(loop, clock, count: int):
    items = [make_item(20, tag=n) for n in range(1, count + 1)]
    loop.submit(items)
    clock.sleep(0.6)  # static waits 0.5 s for a fuller batch
    return [item.future.result(timeout=5) for item in items]


def test_a_batch_failing_at_lower_precision_runs_again_at_full_and_it_stays_off(start_loop, clock):
    engine = FailsLow(clock=clock)
    loop = start_loop(engine, policy="static")
    assert loop.set_low_precision(True).result(timeout=5) is True and loop.precision == "low"
    outputs = run_items(loop, clock, 4)
    assert [output.audio.size for output in outputs] == [20 * SAMPLES_PER_TOKEN] * 4
    assert [output.audio[0] for output in outputs] == [np.float32(n / 1000) for n in range(1, 5)]
    assert engine.seen == [[-1] * 4, [1, 2, 3, 4]]  # the batch once lower, then again whole at full
    assert not engine.low and loop.precision.startswith("full (lower precision off")
    assert "ValueError" in loop.precision and "ValueError" in loop.status().precision
    # degrade mode goes on asking (its end, then a new start): the model stays at full
    loop.set_low_precision(False).result(timeout=5)
    assert loop.set_low_precision(True).result(timeout=5) is False and not engine.low
    run_items(loop, clock, 2)
    assert engine.seen[-1] == [1, 2]
    # the operator's reset: degrade mode may lower it again
    assert loop.reset_precision() is True and loop.precision == "full"
    assert loop.set_low_precision(True).result(timeout=5) is True and engine.low
    assert loop.reset_precision() is False  # nothing was off


def test_a_failure_at_full_precision_is_retried_item_by_item_as_before(start_loop, clock):
    engine = FailsLow(clock=clock)
    loop = start_loop(engine, policy="static")
    engine.low = True  # raising, though the loop never lowered it: not a lower-precision failure
    items = [make_item(20, tag=n) for n in (1, 2)]
    loop.submit(items)
    clock.sleep(0.6)
    for item in items:
        assert "in model fake (ValueError)" in str(item.future.exception(timeout=5))
    assert engine.seen == [[-1, -1], [-1], [-1]] and loop.precision == "full"


def test_lower_precision_stays_off_for_the_model_when_it_is_loaded_again():
    engines = []

    def load():
        engines.append(FailsLow(name="low"))
        return engines[-1]

    low = ModelSpec("low", FailsLow(name="low").voices(), load, pinned=False, source=("low",))
    service = make_service([spec("pin", pinned=True), low, spec("b")], max_loaded_models=2)
    try:
        first = asyncio.run(service.pool.loop("low"))
        assert first.set_low_precision(True).result(timeout=10)
        item = make_item(20, key=engines[0].batch_key("fake-voice", 1.0))
        first.submit([item])
        assert item.future.result(timeout=10).audio.size == 20 * SAMPLES_PER_TOKEN  # again at full
        off = first.precision
        assert service.degrade.precision_off == {"low": "a batch failed in it (ValueError)"}
        assert off == "full (lower precision off: a batch failed in it (ValueError); reset by the operator)"
        asyncio.run(service.pool.loop("b"))  # unloads the idle "low" ...
        again = asyncio.run(service.pool.loop("low"))  # ... and loads it again
        assert again is not first and again.precision == off
        assert again.set_low_precision(True).result(timeout=10) is False and not engines[1].low
        assert again.reset_precision() and service.degrade.precision_off == {} and again.precision == "full"
    finally:
        service.stop()


class NanLow(FailsLow):
    """Answers NaN at its lower precision (as a Piper int8 graph whose output scale is NaN did), or always."""

    always = False

    def synthesize(self, batch):
        outputs = FakeEngine.synthesize(self, batch)
        if self.low or self.always:
            self.seen.append([-1] * len(batch))
            return [type(output)(np.full_like(output.audio, np.nan)) for output in outputs]
        return outputs


def test_audio_that_is_not_finite_at_lower_precision_is_made_again_at_full_and_it_stays_off(start_loop, clock):
    engine = NanLow(clock=clock)
    loop = start_loop(engine, policy="static")
    assert loop.set_low_precision(True).result(timeout=5) is True
    outputs = run_items(loop, clock, 3)  # served, not 200 with -32768 samples
    assert all(np.isfinite(output.audio).all() and output.audio.size for output in outputs)
    assert engine.seen == [[1, 2, 3], [-1] * 3, [1, 2, 3]] and not engine.low  # NaN lower, then again at full
    assert loop.precision.startswith("full (lower precision off") and "UnsoundAudio" in loop.precision


def test_audio_that_is_not_finite_or_far_out_of_range_is_a_500_to_retry_never_handed_on(start_loop, clock):
    from tts_core.engines.contract import AudioPieces, UnsoundAudio
    from tts_core.errors import ErrorCode

    engine = NanLow(clock=clock)
    engine.always = True
    loop = start_loop(engine, policy="static")
    items = [make_item(20, tag=n) for n in (1, 2)]
    loop.submit(items)
    clock.sleep(0.6)
    for item in items:
        error = item.future.exception(timeout=5)
        assert isinstance(error, UnsoundAudio) and (error.status, error.code) == (500, ErrorCode.SYNTHESIS_FAILED)
        assert "not finite" in error.message and error.retryable
    pieces = AudioPieces()  # a stream's pieces (stepped engines, upstreams): the same check
    pieces.push(np.full(10, 0.5, np.float32))
    pieces.push(np.full(10, 1e30, np.float32))
    first, following = pieces.head.result(0)
    assert first.size == 10 and "reach 1e+30" in str(following.exception(0))
