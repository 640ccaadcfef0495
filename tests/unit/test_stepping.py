"""Continuous batching of a stepped (autoregressive) engine, with a fake engine whose step costs are
controlled: requests join at the next step, leave when done, stream their audio as it is made, and
every request ends (audio, a clear error, or back in the queue), whatever happens around it."""

import asyncio
import math
import threading

import numpy as np
import pytest

from tests.fakes import FRAME, FakeSteppedEngine
from tests.serve import wait_until
from tts_core.config import Settings
from tts_core.engines.contract import AudioPieces, EngineInput
from tts_core.errors import InvalidRequest, Overloaded, SynthesisError
from tts_core.ops.metrics import Metrics
from tts_core.request.ask import Ask
from tts_core.scheduler.engine_loop import EngineLoop
from tts_core.scheduler.policy import make_policy
from tts_core.scheduler.queue import RequestQueue
from tts_core.scheduler.records import QueuedItem
from tts_core.scheduler.step_policy import ContinuousPolicy, StepView
from tts_core.scheduler.stepped import synthesize_whole
from tts_core.scheduler.strategies import make_engine_loop
from tts_core.service import SpeechService


def item(frames: int, tag: int = 7, stream: bool = False) -> QueuedItem:
    tokens = np.full(frames, 7, dtype=np.int64)
    tokens[0] = tag
    made = QueuedItem(EngineInput(tokens, "fake-ar-voice"), key="fake-ar", deadline=math.inf)
    made.pieces = AudioPieces() if stream else None
    return made


@pytest.fixture
def start(clock):
    started = []

    def start(engine: FakeSteppedEngine, policy: str = "adaptive", cpu_cache_mb: int = 1024) -> EngineLoop:
        assert engine.clock is clock, "the engine spends its cost on the loop's clock: FakeSteppedEngine(clock=clock)"
        loop = make_engine_loop(engine, RequestQueue(64, clock=clock), Metrics(), policy, calibration_sizes=(1, 2),
                                cpu_cache_mb=cpu_cache_mb, codec_stage="on")  # (for a fake that decodes apart)
        loop.start()
        assert loop.calibrated.wait(30)
        engine.steps_run.clear()
        started.append(loop)
        return loop

    yield start
    for loop in started:
        loop.stop()


def hold(engine: FakeSteppedEngine, loop: EngineLoop, first: QueuedItem) -> None:
    """Start `first` and hold the engine in its next step (so what is submitted now queues)."""
    engine.gate.clear()
    loop.submit([first])
    # first (or, for a peer's whole batch, the engine's copy of it)
    assert wait_until(lambda: engine.running(), every_s=0.01)


@pytest.mark.parametrize("apart", [False, True], ids=["inline", "codec-stage"])
def test_a_short_request_joins_a_running_long_one_and_leaves_first(start, clock, apart):
    engine = FakeSteppedEngine(clock=clock, decodes_apart=apart)
    loop = start(engine)
    long, short = item(60, tag=1), item(5, tag=2)
    long_done_when_short_came = []
    short.future.add_done_callback(lambda _: long_done_when_short_came.append(long.future.done()))
    hold(engine, loop, long)
    loop.submit([short])
    engine.gate.set()
    audio = short.future.result(timeout=10).audio
    assert long_done_when_short_came == [False]  # nobody waits for the longest member
    assert long.future.result(timeout=10).audio.size == 60 * FRAME
    assert audio.size == 5 * FRAME and np.allclose(audio, 0.002)  # its own audio, every frame of it
    assert max(engine.steps_run) == 2  # the two ran in the same steps


@pytest.mark.parametrize("apart", [False, True], ids=["inline", "codec-stage"])
def test_a_stream_gets_its_audio_while_it_is_still_being_made(start, clock, apart):
    engine = FakeSteppedEngine(clock=clock, decodes_apart=apart)
    loop = start(engine)
    streamed = item(40, tag=3, stream=True)
    order = []
    streamed.pieces.head.add_done_callback(lambda _: order.append("first piece"))
    streamed.future.add_done_callback(lambda _: order.append("whole audio"))
    hold(engine, loop, streamed)
    engine.gate.set()
    audio, following = streamed.pieces.head.result(timeout=10)
    pieces = [audio]
    while following is not None:
        audio, following = following.result(timeout=10)
        if audio is not None:
            pieces.append(audio)
    assert len(pieces) > 2 and np.concatenate(pieces).size == 40 * FRAME
    assert streamed.future.result(timeout=1).audio.size == 40 * FRAME
    assert order == ["first piece", "whole audio"]


@pytest.mark.parametrize("apart", [False, True], ids=["inline", "codec-stage"])
def test_a_caller_that_leaves_frees_its_place_at_the_next_step(start, clock, apart):
    engine = FakeSteppedEngine(clock=clock, decodes_apart=apart)
    loop = start(engine)
    gone = item(100, tag=4)
    hold(engine, loop, gone)
    gone.abandon()
    engine.gate.set()
    assert wait_until(lambda: not engine.running(), every_s=0.01)
    assert loop.metrics.dropped.labels("cancelled")._value.get() == 1
    kept = item(3, tag=5)
    loop.submit([kept])
    assert kept.future.result(timeout=10).audio.size == 3 * FRAME


def test_running_requests_never_exceed_the_engine_or_the_memory(start, clock):
    engine = FakeSteppedEngine(clock=clock, max_running=3)
    loop = start(engine)
    items = [item(20, tag=n) for n in range(8)]
    loop.submit(items)
    for each in items:
        each.future.result(timeout=20)
    assert max(engine.steps_run) == 3
    # 1 MB of cache at 1000 bytes a position: 1048 positions; each request holds 2 x 200
    small = FakeSteppedEngine(clock=clock, max_running=8, name="small")
    loop = start(small, cpu_cache_mb=1)
    items = [item(200, tag=n) for n in range(6)]
    loop.submit(items)
    for each in items:
        each.future.result(timeout=30)
    assert max(small.steps_run) == 2


def test_a_request_the_engine_has_no_memory_for_goes_back_to_the_queue(start, clock):
    engine = FakeSteppedEngine(clock=clock, fail_admitting=lambda running: running > 2)
    loop = start(engine)
    first, second, third = item(30, tag=1), item(30, tag=2), item(5, tag=3)
    hold(engine, loop, first)
    loop.submit([second, third])  # the two join together: out of memory; back to the queue they go
    engine.gate.set()
    for each in (first, second, third):
        assert each.future.result(timeout=20).audio.size == each.length * FRAME
    assert loop.metrics.out_of_memory.labels("fake-ar")._value.get() >= 1


@pytest.mark.parametrize("apart", [False, True], ids=["inline", "codec-stage"])
def test_a_failing_step_fails_only_the_newest_request(start, clock, apart):
    class Flaky(FakeSteppedEngine):
        def step(self):
            if any(each.tokens[0] == 99 for each in self._running.values()):
                raise RuntimeError("bad input")
            return super().step()

    engine = Flaky(clock=clock, decodes_apart=apart)
    loop = start(engine)
    good, bad = item(30, tag=1), item(10, tag=99)
    hold(engine, loop, good)
    loop.submit([bad])
    engine.gate.set()
    with pytest.raises(SynthesisError, match=r"in model fake-ar \(RuntimeError\)"):
        bad.future.result(timeout=10)
    assert good.future.result(timeout=10).audio.size == 30 * FRAME


@pytest.mark.parametrize("apart", [False, True], ids=["inline", "codec-stage"])
def test_stopping_ends_what_is_running_and_queued_with_a_clear_error(start, clock, apart):
    engine = FakeSteppedEngine(clock=clock, max_running=1, decodes_apart=apart)
    loop = start(engine)
    running, queued = item(50, tag=1), item(5, tag=2)
    hold(engine, loop, running)
    loop.submit([queued])
    stopper = threading.Thread(target=loop.stop)
    stopper.start()
    engine.gate.set()
    stopper.join(10)
    for each in (running, queued):
        with pytest.raises(Overloaded, match="stopped"):
            each.future.result(timeout=5)


@pytest.mark.parametrize("policy", ["adaptive", "static"])
def test_the_warm_up_hands_the_engine_a_whole_batch_run_to_measure_its_memory_with(start, clock, policy):
    """A stepped engine has no whole-batch call of its own: its strategy's warm-up (continuous, or a peer's)
    hands measure_memory the run (synthesize_whole), which runs a batch through the engine's steps."""
    class Measuring(FakeSteppedEngine):
        made: list[int] = []

        def measure_memory(self, tokens, run):
            self.made = [output.audio.size for output in run([EngineInput(tokens, "fake-ar-voice")] * 2)]

    engine = Measuring(clock=clock)
    start(engine, policy=policy)
    assert engine.made == [12 * FRAME] * 2  # the warm-up's 12 tokens, each input its whole audio


def test_the_request_level_peer_holds_results_until_its_batch_is_done(start, clock):
    """Under a peer's policy a stepped engine runs one whole batch at a time (the one-shot strategy, through
    synthesize_whole, the stepped strategy's code)."""
    engine = FakeSteppedEngine(clock=clock)
    loop = start(engine, policy="static")
    short, long = item(3, tag=1), item(30, tag=2)
    steps_when_short_came = []
    short.future.add_done_callback(lambda _: steps_when_short_came.append(len(engine.steps_run)))
    loop.submit([short, long])
    clock.sleep(0.6)  # static waits 0.5 s for 8; then both run as one batch
    audio = short.future.result(timeout=10).audio
    assert audio.size == 3 * FRAME and long.future.result(timeout=10).audio.size == 30 * FRAME
    assert steps_when_short_came == [29]  # handed out with the long one, once its 29 steps were done
    later = item(3, tag=3)
    engine.steps_run.clear()
    engine.gate.clear()
    loop.submit([item(20, tag=4)])
    clock.sleep(0.6)
    assert wait_until(lambda: engine.running(), every_s=0.01)  # the batch of one runs, held in a step
    loop.submit([later])
    clock.sleep(0.6)  # waited for here, once the running batch is done
    engine.gate.set()
    later.future.result(timeout=10)
    assert max(engine.steps_run) == 1  # it waited for the running batch to finish before starting


def always_joins(monkeypatch) -> None:
    """The policy admits whoever has a place (as it does where a step costs little more with one more running;
    fitted from timings, it might not on a busy machine)."""
    monkeypatch.setattr(ContinuousPolicy, "_pays", lambda *args: True)


@pytest.mark.parametrize("joining_due_s", [0.0, 5.0])  # a stream's first sentence; a later one, 5 s into it
def test_a_joining_streams_first_piece_comes_before_the_running_ones_next_pieces(start, clock, monkeypatch,
                                                                                 joining_due_s):
    always_joins(monkeypatch)
    engine = FakeSteppedEngine(clock=clock)
    loop = start(engine)
    running, joining = item(60, tag=1, stream=True), item(20, tag=2, stream=True)
    joining.due_s = joining_due_s

    def join_at_the_third_step() -> None:  # on the engine's thread: no race
        if len(engine.steps_run) == 2:  # the running stream's first piece (3 frames) is out
            loop.submit([joining])  # it joins at the next turn, when the running one is 1 frame into its next piece

    engine.on_step = join_at_the_third_step
    loop.submit([running])
    assert joining.future.result(timeout=10).audio.size == 20 * FRAME
    assert running.future.result(timeout=10).audio.size == 60 * FRAME  # its deferred frames came later, all of them
    events = engine.events
    joined, first = events.index(("admit", 2)), events.index(("take", 2))
    # its listener waits for it, and has nothing: the running one's next piece waits; else it does not
    assert (("take", 1) in events[joined:first]) == (joining_due_s > 0), events[:first + 1]


def test_a_request_queued_to_join_stops_the_decoding_of_later_pieces(start, clock, monkeypatch):
    always_joins(monkeypatch)
    engine = FakeSteppedEngine(clock=clock)
    loop = start(engine)
    one, other, joining = item(60, tag=1, stream=True), item(60, tag=3, stream=True), item(20, tag=2, stream=True)
    taken = []

    def join_at_the_second_piece(piece_of: EngineInput) -> None:  # the two are due at the same steps
        taken.append(piece_of)
        if taken.count(one.input) == 2 and joining.enqueued_at == 0.0:
            loop.submit([joining])

    engine.on_take = join_at_the_second_piece
    loop.submit([one, other])
    for made in (one, other, joining):
        made.future.result(timeout=10)
    events = engine.events
    second_of_other = [index for index, event in enumerate(events) if event == ("take", 3)][1]
    assert events.index(("admit", 2)) < second_of_other, events


def test_a_queued_request_that_cannot_join_does_not_stop_a_streams_pieces(start, clock):
    engine = FakeSteppedEngine(clock=clock)
    loop = start(engine, cpu_cache_mb=2)  # 2,097 cache positions: one of these fits, two do not
    running, waiting = item(600, tag=1, stream=True), item(600, tag=2, stream=True)
    engine.on_step = lambda: loop.submit([waiting]) if len(engine.steps_run) == 2 else None
    loop.submit([running])
    assert running.future.result(timeout=10).audio.size == 600 * FRAME
    assert waiting.future.result(timeout=10).audio.size == 600 * FRAME
    events = engine.events
    assert events.index(("admit", 2)) > events.index(("take", 1))  # it waited for the running one to end
    assert events.count(("take", 1)) >= 600 // 6 - 1  # pieces kept coming, two pieces' worth at a time at most


# --- the pure policy -----------------------------------------------------------------------------------

def view(context: int = 50, final: int = 200) -> StepView:
    return StepView(context, final)


def calibrated() -> ContinuousPolicy:
    policy = ContinuousPolicy(max_running=16)
    for running in (1, 2, 4, 8, 16):
        for longest in (100, 400):  # the research's CPU fit: 25.8 ms + 2.37 ms a request + 3.08 us a position
            policy.cost.observe_step(running, longest, 0.0258 + 0.00237 * running + 3.08e-6 * running * longest,
                                     calibration=True)
    policy.cost.observe_decode(1, 0.007)  # the codec's seconds per frame
    return policy


def test_the_continuous_policy_grows_the_running_set_while_it_pays():
    policy = calibrated()
    plan = policy.plan([], [view() for _ in range(20)], now=0.0)
    assert plan.take == tuple(range(16))  # each short one more still raises the frames per second: all places fill
    # a long prompt joining short ones makes every step attend over its context: more than it brings
    long_one = policy.plan([view() for _ in range(8)], [view(context=40_000, final=40_100), view()], now=0.0)
    assert long_one.take == ()
    assert policy.plan([], [view(context=40_000, final=40_100)], now=0.0).take == (0,)  # alone it runs


def test_the_memory_budget_bounds_who_joins():
    policy = calibrated()
    plan = policy.plan([view(final=300)], [view(final=300) for _ in range(5)], now=0.0, memory_tokens=1000)
    assert plan.take == (0, 1)  # 300 running + 2 x 300 joining <= 1000


def test_the_request_level_peer_waits_then_takes_a_batch():
    peer = make_policy("static", FakeSteppedEngine().max_running, 100_000)
    queued = [QueuedItem(EngineInput(np.zeros(10, np.int64), "v"), key="k", deadline=math.inf) for _ in range(3)]
    assert peer.plan(queued, now=0.1).take == () and peer.plan(queued, now=0.6).take == (0, 1, 2)


# --- through the service -------------------------------------------------------------------------------

@pytest.fixture
def service():
    engine = FakeSteppedEngine()
    service = SpeechService(Settings(calibration_sizes=[1], voice_aliases={}, model_aliases={}), [engine], Metrics())
    service.start()
    assert service.loops["fake-ar"].calibrated.wait(10)
    yield service
    service.stop()


def test_a_stepped_voice_streams_and_speaks_through_the_service(service):
    async def scenario():
        stream = await service.answer(Ask("A sentence long enough for many frames.", "fake-ar-voice",
                                          response_format="pcm", stream=True))
        pieces = [audio async for audio in stream]
        whole = await service.synthesize(Ask("A sentence long enough for many frames.", "fake-ar-voice"))
        return pieces, whole

    pieces, whole = asyncio.run(scenario())
    assert len(pieces) > 1 and sum(piece.size for piece in pieces) == whole.audio.size
    status = service.status()["engines"]["fake-ar"]
    assert status["running"] == 0 and status["steps_per_s"] > 0 and status["frames_per_step"] >= 1


def test_a_voice_without_speed_control_refuses_other_speeds(service):
    with pytest.raises(InvalidRequest) as refused:
        asyncio.run(service.synthesize(Ask("Hello there.", "fake-ar-voice", speed=1.5)))
    assert refused.value.param == "speed" and "speaking-rate" in refused.value.message


def test_a_whole_batch_joins_late_items_and_decodes_whole_files_in_pieces():
    """synthesize_whole (warm-up, the benchmark's ceiling) runs more items than fit, each joining
    when a place frees, and takes each item's audio every FILE_PIECE_S (as the loop does for a file)."""
    from tts_core.engines.base import FILE_PIECE_S

    class Counting(FakeSteppedEngine):
        takes: list[int] = []

        def take_frames(self, item, final=False):
            frames = super().take_frames(item, final)
            self.takes.append(0 if frames is None else frames.size // FRAME)
            return frames

    engine = Counting(max_running=2)
    batch = [item(40, tag=1).input, item(5, tag=2).input, item(30, tag=3).input]
    audio = [output.audio for output in synthesize_whole(engine, batch)]
    assert [a.size for a in audio] == [40 * FRAME, 5 * FRAME, 30 * FRAME]
    assert [float(a[0]) for a in audio] == pytest.approx([0.001, 0.002, 0.003])  # each its own audio
    piece = math.ceil(FILE_PIECE_S * engine.frame_rate)
    assert max(engine.takes) == piece and len(engine.takes) == 40 // piece + 1 + 30 // piece + 1 + 1
    assert max(engine.steps_run) == 2  # never more running than places
