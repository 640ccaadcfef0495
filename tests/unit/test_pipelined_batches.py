"""One-shot batches back to back (issue 43 item 5): with an engine that pipelines, the loop prepares and starts batch
n+1 while the device still runs batch n, then lands n (waits for it, delivers its audio); results come in order, and
a batch that fails or runs out of memory is retried as before. A fake engine on events plays the device; the tiny
VITS, made to pipeline on the CPU, gives the audio it gives alone."""

import threading
from collections import defaultdict

import numpy as np
import pytest

from bench.random_vits import TINY, save_random_vits
from tests.fakes import POISON, SAMPLES_PER_TOKEN, FakeEngine
from tests.unit.conftest import make_item
from tts_core.engines.base import VoiceSpec
from tts_core.engines.contract import EngineInput, EngineOutput
from tts_core.engines.vits import VitsEngine
from tts_core.errors import SynthesisError
from tts_core.ops.metrics import Metrics
from tts_core.scheduler.clock import FakeClock
from tts_core.scheduler.queue import RequestQueue
from tts_core.scheduler.records import QueuedItem
from tts_core.scheduler.strategies import make_engine_loop


class DeviceFake(FakeEngine):
    """Pipelines: `run` starts a batch on a pretend device and returns at once; `finish` waits until the device is
    done with it (at once, unless the test holds the batch, by its first item's tag). Every call is logged."""

    pipelines = True

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.log: list[tuple[str, list[int]]] = []
        self.held: dict[int, threading.Event] = {}
        self.called = defaultdict(threading.Event)  # ("run", tag) -> set once called
        self.too_large = 0  # batches of more items run out of memory when started

    def hold(self, tag: int) -> threading.Event:
        self.held[tag] = threading.Event()
        return self.held[tag]

    def _called(self, call: str, batch) -> list[int]:
        tags = [int(item.tokens[0]) for item in batch]
        self.log.append((call, tags))
        self.called[call, tags[0]].set()
        return tags

    def prepare(self, batch):
        self._called("prepare", batch)
        return batch

    def run(self, prepared):
        tags = self._called("run", prepared)
        if self.too_large and len(tags) > self.too_large:
            raise MemoryError("device full")
        return prepared

    def finish(self, running):
        tags = [int(item.tokens[0]) for item in running]
        if tags[0] in self.held:
            assert self.held[tags[0]].wait(10)
        self._called("finish", running)
        if POISON in tags:
            raise RuntimeError(f"tensor([nan, nan]) in {tags}")
        return [EngineOutput(np.full(item.length * SAMPLES_PER_TOKEN, item.tokens[0] / 1000, dtype=np.float32))
                for item in running]


def delivered_in(items: list[QueuedItem]) -> list[int]:
    """The items' places in the list, in the order their futures are resolved."""
    order: list[int] = []
    for index, item in enumerate(items):
        item.future.add_done_callback(lambda _, index=index: order.append(index))
    return order


def test_the_next_batch_is_prepared_and_started_while_the_device_runs_this_one(start_loop, clock):
    engine = DeviceFake(clock=clock)
    loop = start_loop(engine, policy="sequential")
    first_on_device = engine.hold(1)
    items = [make_item(10, tag=tag) for tag in (1, 2, 3)]
    order = delivered_in(items)
    loop.submit(items)
    assert engine.called["run", 2].wait(10)
    # batch 2 was prepared and started while batch 1 was still on the device: nothing of 1 delivered yet
    assert engine.log == [("prepare", [1]), ("run", [1]), ("prepare", [2]), ("run", [2])]
    assert order == [] and not items[0].future.done()
    first_on_device.set()
    outputs = [item.future.result(timeout=10) for item in items]
    assert order == [0, 1, 2]
    assert [output.audio[0] for output in outputs] == [np.float32(tag / 1000) for tag in (1, 2, 3)]
    assert [call for call in engine.log if call[0] == "finish"] == [("finish", [1]), ("finish", [2]),
                                                                     ("finish", [3])]
    # 3 was started before 2 landed; with nothing queued after it, 3 landed at once
    assert engine.log.index(("run", [3])) < engine.log.index(("finish", [2]))
    assert not loop.busy and loop.status().queue_length == 0
    # each item is counted running until it lands, once: a later one on the device keeps the model busy (unloadable
    # only when idle)
    held = engine.hold(4)
    later = make_item(10, tag=4)
    loop.submit([later])
    assert engine.called["run", 4].wait(10)
    assert loop.busy and not loop.close_if_idle()
    held.set()
    assert later.future.result(timeout=10).audio[0] == np.float32(0.004)


def test_a_batch_that_fails_on_landing_is_retried_item_by_item(start_loop, clock):
    engine = DeviceFake(clock=clock)
    loop = start_loop(engine, policy="static")
    items = [make_item(20, tag=1), make_item(20, tag=POISON), make_item(20, tag=3)]
    loop.submit(items)
    clock.sleep(0.6)  # static waits 0.5 s for a fuller batch, then runs the 3
    assert items[0].future.result(timeout=5).audio.size == 20 * SAMPLES_PER_TOKEN
    assert items[2].future.result(timeout=5).audio[0] == np.float32(0.003)
    with pytest.raises(SynthesisError, match=r"in model fake \(RuntimeError\)") as raised:
        items[1].future.result(timeout=5)
    assert "tensor" not in raised.value.message
    assert engine.log[-1] == ("finish", [1, POISON, 3]) and engine.seen[-3:] == [[1], [POISON], [3]]


def test_a_batch_out_of_memory_when_started_runs_again_in_halves(start_loop, clock):
    engine = DeviceFake(clock=clock)
    loop = start_loop(engine, policy="static")
    engine.too_large = 2
    items = [make_item(20, tag=tag) for tag in (1, 2, 3, 4)]
    loop.submit(items)
    clock.sleep(0.6)
    assert [item.future.result(timeout=5).audio[0] for item in items] == [np.float32(t / 1000) for t in (1, 2, 3, 4)]
    assert engine.seen[-2:] == [[1, 2], [3, 4]] and loop.memory.out_of_memory_count == 1


class PipelinedVits(VitsEngine):
    pipelines = True  # as on CUDA: the loop runs it through prepare, run and finish
    started: list[int]  # the inputs' ids, in the order their batches were started

    def run(self, prepared):
        self.started.extend(id(item) for item in prepared.batch)
        return super().run(prepared)


def test_the_vits_engine_pipelined_gives_each_item_the_audio_it_gives_alone(tmp_path):
    folder = save_random_vits(tmp_path / "tiny-vits", **TINY)
    engine = PipelinedVits(str(folder), [VoiceSpec("tiny", "en")], device="cpu", noise_scale=0.0,
                           noise_scale_duration=0.0)
    texts = ["hello there.", "a much longer sentence, to run after it.", "hi", "and the last one."]
    inputs = [EngineInput(engine.tokenize(text, "tiny")[0], "tiny") for text in texts]
    engine.started = []
    alone = [engine.synthesize([item])[0] for item in inputs]
    loop = make_engine_loop(engine, RequestQueue(64, 2.0, long_tokens=400, clock=FakeClock()), Metrics(),
                            "sequential", calibration_sizes=(1,))
    loop.start()
    try:
        assert loop.ready.wait(60)
        items = [QueuedItem(item, key=engine.batch_key("tiny", 1.0), deadline=float("inf")) for item in inputs]
        order = delivered_in(items)
        loop.submit(items)
        for item, expected in zip(items, alone):
            output = item.future.result(timeout=60)
            assert np.array_equal(output.audio, expected.audio)
            assert np.array_equal(output.token_samples, expected.token_samples)
        assert order == [[id(item) for item in inputs].index(started) for started in engine.started[-4:]]
    finally:
        loop.stop()


class FailsLowOnLanding(DeviceFake):
    """Its lower precision makes audio that is not finite, found when a batch lands (as VITS's `finish` finds it)."""

    low = False

    def set_low_precision(self, enabled: bool) -> bool:
        self.low = enabled
        return True

    def run(self, prepared):
        return super().run(prepared), self.low

    def finish(self, running):
        batch, ran_low = running
        outputs = super().finish(batch)
        if ran_low:
            raise FloatingPointError("audio that is not finite at torch.float16")
        return outputs


def test_batches_failing_at_lower_precision_on_landing_run_again_at_full_and_it_stays_off(start_loop, clock):
    engine = FailsLowOnLanding(clock=clock)
    loop = start_loop(engine, policy="sequential")
    assert loop.set_low_precision(True).result(timeout=5) is True
    engine.hold(1)  # 2 is started (lowered) before 1 lands and fails
    items = [make_item(10, tag=tag) for tag in (1, 2, 3)]
    loop.submit(items)
    assert engine.called["run", 2].wait(10)
    engine.held[1].set()
    assert [item.future.result(timeout=10).audio[0] for item in items] == [np.float32(t / 1000) for t in (1, 2, 3)]
    assert not engine.low and "FloatingPointError" in loop.precision
    assert engine.seen[-2:] == [[1], [2]]  # both lowered batches ran again whole at full (synthesize); 3 ran full
    assert ("run", [3]) in engine.log and loop.set_low_precision(False).result(timeout=5)
    assert loop.set_low_precision(True).result(timeout=5) is False and not engine.low
