"""The codec as a stage of its own (tts_core.scheduler.codec_stage), with a fake engine that `decodes_apart`:
the steps go on while a piece decodes, each request's pieces and its end come out in order, a stream's first
piece goes ahead of the pieces waiting, the steps never run more than max_waiting pieces ahead of the codec,
and every accepted request ends (a failed decode, a caller gone, a stop). Events, never sleeps: the codec is
held on a gate the test opens."""

import threading

import numpy as np
import pytest

from tests.fakes import FRAME, FakeSteppedEngine
from tests.serve import wait_until
from tests.unit.test_stepping import hold, item, start  # noqa: F401 (start: the loop fixture)
from tts_core.errors import Overloaded, SynthesisError
from tts_core.ops.metrics import Metrics
from tts_core.scheduler.queue import RequestQueue
from tts_core.scheduler.step_policy import ContinuousPolicy, StepCostModel, StepView
from tts_core.scheduler.strategies import make_engine_loop


class Gate(threading.Event):
    """An event the codec waits on at each piece; `holding` is set once the codec waits at it (closed)."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = threading.Event()

    def clear(self) -> None:
        self.holding.clear()
        super().clear()

    def pass_through(self) -> None:
        if not self.is_set():
            self.holding.set()
        self.wait()


def staged(clock, **settings) -> tuple[FakeSteppedEngine, Gate, list[int]]:
    """A fake engine whose codec stage waits at each piece until `gate` is set; `decoded` lists each decoded
    piece's tag, in order."""
    engine = FakeSteppedEngine(clock=clock, decodes_apart=True, **settings)
    gate, decoded = Gate(), []
    gate.set()

    def decoding(frames: np.ndarray) -> None:
        gate.pass_through()
        decoded.append(round(float(frames[0]) * 1000))
    engine.on_decode = decoding
    return engine, gate, decoded


def read_stream(queued) -> list[np.ndarray]:
    pieces, (audio, following) = [], queued.pieces.head.result(timeout=10)
    while audio is not None:
        pieces.append(audio)
        audio, following = following.result(timeout=10)
    return pieces


def test_the_steps_go_on_while_a_piece_decodes_and_the_audio_comes_whole_and_in_order(start, clock):  # noqa: F811
    engine, gate, decoded = staged(clock)
    loop = start(engine)
    assert loop.strategy.codec.threaded and loop.status().strategy.codec_thread
    gate.clear()
    long, stream = item(60, tag=1), item(40, tag=2, stream=True)
    loop.submit([long, stream])
    decoded.clear()  # (the calibration's)
    # The codec holds the first piece; the steps made the frames of those waiting behind it meanwhile.
    assert wait_until(lambda: loop.strategy.codec.waiting() >= 3, every_s=0.01)
    assert decoded == [] and not loop.strategy.codec.idle()
    gate.set()
    pieces = read_stream(stream)
    assert len(pieces) > 2 and np.concatenate(pieces).size == 40 * FRAME and np.allclose(np.concatenate(pieces), 0.002)
    assert long.future.result(timeout=10).audio.size == 60 * FRAME
    assert stream.future.result(timeout=10).audio.size == 40 * FRAME
    assert wait_until(lambda: not loop.busy and loop.strategy.codec.idle(), every_s=0.01)
    assert decoded.count(1) >= 4 and decoded.count(2) == len(pieces)


def test_a_streams_first_piece_goes_ahead_of_the_pieces_waiting(start, clock):  # noqa: F811
    engine, gate, decoded = staged(clock)
    loop = start(engine)
    decoded.clear()  # (the calibration's)
    running = item(200, tag=1)
    hold(engine, loop, running)
    gate.clear()  # the codec holds running's first piece; its next ones wait behind it
    paused = threading.Event()

    def pausing() -> None:  # the steps stop once 3 pieces wait, well short of max_waiting
        if not paused.is_set() and loop.strategy.codec.waiting() >= 3:
            paused.set()
            engine.gate.clear()
    engine.on_step = pausing
    engine.gate.set()
    assert gate.holding.wait(10) and paused.wait(10)
    joining = item(30, tag=2, stream=True)
    loop.submit([joining])
    engine.gate.set()
    assert wait_until(lambda: engine.events.count(("take", 2)) >= 1, every_s=0.01)
    gate.set()
    assert joining.pieces.head.result(timeout=10)[0].size > 0
    first_of_joining = decoded.index(2)
    assert decoded[:first_of_joining] == [1]  # only the piece being decoded when it was taken came first
    assert running.future.result(timeout=10).audio.size == 200 * FRAME


def test_the_steps_wait_once_max_waiting_pieces_wait(start, clock):  # noqa: F811
    engine, gate, _ = staged(clock, max_running=2)
    loop = start(engine)
    codec = loop.strategy.codec
    waiting_at_steps = []
    engine.on_step = lambda: waiting_at_steps.append(codec.waiting())
    gate.clear()
    first, second = item(300, tag=1), item(300, tag=2)
    loop.submit([first, second])
    assert wait_until(lambda: codec.waiting() == codec.max_waiting, every_s=0.01)
    assert max(waiting_at_steps) <= codec.max_waiting
    gate.set()
    for each in (first, second):
        assert each.future.result(timeout=10).audio.size == 300 * FRAME


def test_a_piece_that_fails_to_decode_fails_its_request_alone(start, clock):  # noqa: F811
    engine, _, _ = staged(clock)

    def decoding(frames: np.ndarray) -> None:
        if round(float(frames[0]) * 1000) == 9:
            raise RuntimeError("codec broke")
    engine.on_decode = decoding
    loop = start(engine)
    good, bad = item(40, tag=1, stream=True), item(40, tag=9, stream=True)
    loop.submit([good, bad])
    with pytest.raises(SynthesisError, match=r"\(RuntimeError\)"):
        bad.future.result(timeout=10)
    with pytest.raises(SynthesisError):
        read_stream(bad)
    assert np.concatenate(read_stream(good)).size == 40 * FRAME
    assert wait_until(lambda: not loop.busy, every_s=0.01)  # each request counted done once
    assert loop.metrics.item_errors.labels(engine.name)._value.get() == 1


def test_a_caller_gone_while_its_pieces_wait_is_ended_without_decoding_them(start, clock):  # noqa: F811
    engine, gate, decoded = staged(clock)
    loop = start(engine)
    gone = item(200, tag=4, stream=True)
    gate.clear()
    loop.submit([gone])
    assert gate.holding.wait(10) and wait_until(lambda: loop.strategy.codec.waiting() >= 2, every_s=0.01)
    gone.abandon()
    gate.set()
    assert wait_until(lambda: not loop.busy and loop.strategy.codec.idle(), every_s=0.01)
    assert decoded.count(4) == 1  # the piece being decoded when the caller left, no more
    assert loop.metrics.dropped.labels("cancelled")._value.get() == 1


def test_stopping_decodes_what_waits_and_ends_what_runs(start, clock):  # noqa: F811
    engine, gate, _ = staged(clock, max_running=4)
    loop = start(engine)
    short, long = item(5, tag=1), item(100_000, tag=2)
    gate.clear()
    loop.submit([short, long])
    assert wait_until(lambda: engine.events.count(("take", 1)) == 1, every_s=0.01)  # short is done, not decoded
    stopper = threading.Thread(target=loop.stop)
    stopper.start()
    assert wait_until(lambda: loop.queue.closed, every_s=0.01)
    gate.set()
    stopper.join(10)
    assert short.future.result(timeout=5).audio.size == 5 * FRAME  # accepted and made: delivered
    with pytest.raises(Overloaded, match="stopped"):
        long.future.result(timeout=5)


def test_the_slower_stage_sets_the_time_per_frame_when_the_codec_is_a_stage():
    cost = StepCostModel()
    for running in (1, 2, 4, 8):
        cost.observe_step(running, 10, 0.05 + 0.001 * running, calibration=True)
    cost.observe_decode(10, 0.1)  # 10 ms a frame
    one_thread = cost.frame_s(8, 10)
    cost.pipelined = True
    assert one_thread == pytest.approx(cost.step_s(8, 10) + 8 * 0.01)
    assert cost.frame_s(8, 10) == pytest.approx(8 * 0.01)  # the codec is the slower stage at 8
    assert cost.frame_s(1, 10) == pytest.approx(cost.step_s(1, 10))  # the steps at 1


def test_where_the_codec_is_the_slower_stage_a_request_still_joins():
    """More running does not make more frames a second then, nor fewer: the request shares them rather than
    waiting for a place."""
    policy = ContinuousPolicy(max_running=8)
    for running in (1, 2, 4, 8):
        policy.cost.observe_step(running, 10, 0.05 + 0.001 * running, calibration=True)
    policy.cost.observe_decode(10, 0.1)
    policy.cost.pipelined = True
    running = [StepView(10, 40)] * 6  # 6 x 10 ms of decoding a frame: the codec is slower than a step
    assert policy.plan(running, [StepView(10, 40), StepView(10, 40)], now=0.0).take == (0, 1)


def test_the_codec_stage_is_on_where_the_engine_runs_on_cuda_unless_the_setting_says():
    """TTS_CODEC_STAGE: auto puts it on a thread of its own on CUDA only (on a CPU it made a lone request slower)."""
    def threaded(device: str, setting: str, apart: bool = True) -> bool:
        engine = FakeSteppedEngine(decodes_apart=apart)
        engine.device = device
        loop = make_engine_loop(engine, RequestQueue(8), Metrics(), "adaptive", codec_stage=setting)
        return loop.strategy.codec.threaded

    assert threaded("cuda", "auto") and not threaded("cpu", "auto")
    assert threaded("cpu", "on") and not threaded("cuda", "off")
    assert not threaded("cuda", "on", apart=False)  # an engine whose steps already decode keeps it inline
