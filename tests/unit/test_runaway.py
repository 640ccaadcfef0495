"""The runaway guard (tts_core.scheduler.runaway; issue 54, item 2): a fake stepped engine that never ends, repeats
one frame or goes silent is stopped, made again once, then refused (a whole answer) or ended with an error event (a
stream that has sent audio); a normal long text is never stopped; the speech a character takes is learned per voice;
a fake upstream that streams without end is stopped by the same rule. The stepped loops run on a FakeClock."""

from __future__ import annotations

import math

import numpy as np
import pytest

from admin.state import runaway_markdown
from tests.fakes import FRAME, FakeUpstream, RunawaySteppedEngine
from tts_core.engines.contract import AudioPieces, EngineInput
from tts_core.errors import ErrorCode, InvalidSetting, RunawaySpeech
from tts_core.ops.metrics import Metrics
from tts_core.request.operating import OperatorSettings
from tts_core.scheduler.clock import SYSTEM_CLOCK
from tts_core.scheduler.engine_loop import EngineLoop
from tts_core.scheduler.queue import RequestQueue
from tts_core.scheduler.records import QueuedItem
from tts_core.scheduler.runaway import (
    LEARNED_AFTER,
    PRIOR_S_PER_CHAR,
    Reason,
    RunawayGuard,
    RunawayLimits,
    repeating,
)
from tts_core.scheduler.strategies import make_engine_loop

VOICE = "fake-ar-voice"
REASONS = {"endless": Reason.LENGTH, "repeat": Reason.REPEAT, "silent": Reason.SILENCE}
WAIT_S = 30


@pytest.fixture
def guarded():
    """start(engine) -> (its loop, the guard, the metrics): the loop started and calibrated."""
    started = []

    def start(engine) -> tuple[EngineLoop, RunawayGuard, Metrics]:
        metrics = Metrics()
        guard = RunawayGuard(metrics)
        queue = RequestQueue(64, clock=getattr(engine, "clock", SYSTEM_CLOCK))  # (the fake upstream's: the system's)
        loop = make_engine_loop(engine, queue, metrics, calibration_sizes=(1,), runaway=guard)
        loop.start()
        assert loop.calibrated.wait(WAIT_S)
        started.append(loop)
        return loop, guard, metrics

    yield start
    for loop in started:
        loop.stop()


def submit(loop: EngineLoop, chars: int, voice: str = VOICE, stream: bool = False) -> QueuedItem:
    item = QueuedItem(EngineInput(np.full(chars, 7, dtype=np.int64), voice), key=loop.engine.batch_key(voice, 1.0),
                      deadline=math.inf, sample_rate=loop.engine.sample_rate, chars=chars)
    item.pieces = AudioPieces() if stream else None
    loop.submit([item])
    return item


def streamed(item: QueuedItem) -> tuple[int, BaseException | None]:
    """The samples a stream played, and the error it ended with (None: its end)."""
    samples, head = 0, item.pieces.head
    while True:
        try:
            piece, head = head.result(WAIT_S)
        except RunawaySpeech as error:
            return samples, error
        if piece is None:
            return samples, None
        samples += piece.size


def stopped(metrics: Metrics, reason: Reason, model: str = "fake-ar", voice: str = VOICE) -> float:
    return metrics.registry.get_sample_value("tts_runaway_stopped_total",
                                             {"model": model, "voice": voice, "reason": reason.value}) or 0.0


def admits(engine: RunawaySteppedEngine) -> int:
    return sum(1 for kind, _ in engine.events if kind == "admit")


@pytest.mark.parametrize("way", list(REASONS))
def test_a_whole_answer_that_runs_away_is_stopped_made_again_once_then_refused(clock, guarded, way):
    engine = RunawaySteppedEngine(clock=clock, step_cost=lambda running: 0.01)
    loop, guard, metrics = guarded(engine)
    engine.events.clear()
    engine.steps_run.clear()
    engine.way = way
    item = submit(loop, 20)
    with pytest.raises(RunawaySpeech) as refused:
        item.future.result(WAIT_S)
    error = refused.value
    assert (error.status, error.code, error.retryable) == (500, ErrorCode.RUNAWAY_SPEECH, True)
    assert error.body()["error"]["type"] == "server_error" and "model fake-ar" in error.message
    assert admits(engine) == 2  # made again once, then refused
    assert stopped(metrics, REASONS[way]) == 2
    assert guard.status()["fake-ar"][VOICE]["stopped"] == {REASONS[way].value: 2}
    assert f"`fake-ar` {VOICE}: 0.120 s a character (the prior), **stopped 2 {REASONS[way].value}**" in \
        runaway_markdown(guard.status())  # the Admin tab's line
    # 20 characters at the prior's 0.12 s: 2.4 s expected, stopped past 7.2 s (the repeat at 2.4 s, the silence at 5 s)
    most_frames = {"endless": 73, "repeat": 25, "silent": 62}[way]
    assert all(made <= 1 for made in engine.steps_run)  # (one request at a time)
    assert len(engine.steps_run) <= 2 * most_frames + 5
    assert not engine.running() and loop.queue_length == 0


@pytest.mark.parametrize("way", list(REASONS))
def test_a_stream_that_has_sent_audio_ends_with_an_error_event(clock, guarded, way):
    engine = RunawaySteppedEngine(clock=clock, step_cost=lambda running: 0.01)
    loop, _, metrics = guarded(engine)
    engine.events.clear()
    engine.way = way
    samples, error = streamed(submit(loop, 20, stream=True))
    assert isinstance(error, RunawaySpeech) and error.code == ErrorCode.RUNAWAY_SPEECH
    assert samples > 0  # what it played before the stop
    assert samples <= 73 * FRAME
    assert admits(engine) == 1 and stopped(metrics, REASONS[way]) == 1


def test_a_runaway_made_again_that_ends_well_is_served(clock, guarded):
    engine = RunawaySteppedEngine(clock=clock, step_cost=lambda running: 0.01)
    loop, _, metrics = guarded(engine)
    engine.events.clear()
    engine.way, engine.runaways = "endless", 1
    output = submit(loop, 20).future.result(WAIT_S)
    assert output.audio.size == 20 * FRAME  # the second run's, whole
    assert admits(engine) == 2 and stopped(metrics, Reason.LENGTH) == 1


def test_a_runaway_leaves_the_requests_running_beside_it_as_they_were(clock, guarded):
    engine = RunawaySteppedEngine(clock=clock, step_cost=lambda running: 0.01)
    loop, _, metrics = guarded(engine)
    engine.events.clear()
    engine.way, engine.runaways = "endless", 1
    endless = submit(loop, 20)
    beside = [submit(loop, 60 + number) for number in range(3)]  # (they join while it runs)
    for number, item in enumerate(beside):
        assert item.future.result(WAIT_S).audio.size == (60 + number) * FRAME
    assert endless.future.result(WAIT_S).audio.size == 20 * FRAME  # made again: the second run ended well
    assert max(engine.steps_run) > 1 and stopped(metrics, Reason.LENGTH) == 1


def test_a_normal_long_text_is_never_stopped_and_teaches_its_voice_its_rate(clock, guarded):
    engine = RunawaySteppedEngine(clock=clock, step_cost=lambda running: 0.01)
    loop, guard, metrics = guarded(engine)
    guard_before = guard.s_per_char("fake-ar", VOICE)
    for chars in (40, 80, 120):
        assert submit(loop, chars).future.result(WAIT_S).audio.size == chars * FRAME
    assert guard_before == PRIOR_S_PER_CHAR
    assert guard.s_per_char("fake-ar", VOICE) == pytest.approx(0.1, rel=0.02)  # a frame (0.1 s) a character
    long = submit(loop, 600, stream=True)  # a minute of speech, in 200 pieces
    assert streamed(long) == (600 * FRAME, None)
    assert sum(stopped(metrics, reason) for reason in Reason) == 0
    described = guard.status()["fake-ar"][VOICE]
    assert described["learned_from"] == 4 and described["stopped"] == {}


def test_the_learned_rate_is_per_voice_and_sets_the_length_a_text_may_take():
    guard = RunawayGuard(Metrics())
    assert guard.watch("m", "slow", 100, 1.0, 1000).most_s == pytest.approx(3 * 100 * PRIOR_S_PER_CHAR)
    assert guard.watch("m", "slow", 10, 1.0, 1000).most_s == pytest.approx(10 * PRIOR_S_PER_CHAR + 4)  # the floor
    for number in range(LEARNED_AFTER):
        guard.learn("m", "slow", 100, 1.0, 20.0)  # 0.2 s a character
        expected = PRIOR_S_PER_CHAR if number < LEARNED_AFTER - 1 else 0.2
        assert guard.s_per_char("m", "slow") == pytest.approx(expected)
    guard.learn("m", "slow", 50, 0.5, 20.0)  # at half speed: 10 s at speed 1, still 0.2 s a character
    assert guard.s_per_char("m", "slow") == pytest.approx(0.2)
    assert guard.s_per_char("m", "other") == PRIOR_S_PER_CHAR and guard.s_per_char("n", "slow") == PRIOR_S_PER_CHAR
    watch = guard.watch("m", "slow", 100, 2.0, 1000)  # twice as fast: 10 s expected
    assert (watch.expected_s, watch.most_s) == (pytest.approx(10.0), pytest.approx(30.0))
    assert watch.made(29.9) is None and watch.made(30.1) is Reason.LENGTH and "30 s of audio" in watch.why
    assert guard.watch("m", "slow", 0, 1.0, 1000) is None  # a text of unknown length (a benchmark's) is not watched


def test_repeats_and_silence_are_read_as_the_limits_say():
    rng = np.random.default_rng(0)
    loop = rng.standard_normal((3, 8))
    assert repeating(np.tile(loop, (8, 1)))  # one stretch of three frames, again and again
    assert repeating(np.tile(loop, (8, 1)) * (1 + 0.004 * rng.standard_normal((24, 8))))  # within 1 %
    assert not repeating(rng.standard_normal((24, 8)))
    assert not repeating(np.tile(loop, (8, 1)) * (1 + 0.05 * rng.standard_normal((24, 8))))
    watch = RunawayGuard(Metrics()).watch("m", "v", 1000, 1.0, 1000)  # 120 s expected
    for _ in range(4):
        assert watch.heard(np.zeros(1000, np.float32)) is None  # 4 s quiet
    assert watch.heard(np.full(1000, 0.01, np.float32)) is None  # then a second of speech
    for _ in range(4):
        assert watch.heard(np.zeros(1000, np.float32)) is None
    assert watch.heard(np.zeros(1000, np.float32)) is Reason.SILENCE  # 5 s quiet
    off = RunawayGuard(Metrics(), lambda: RunawayLimits(repeat_s=0, silence_s=0)).watch("m", "v", 1000, 1.0, 1000)
    assert all(off.heard(np.zeros(1000, np.float32)) is None for _ in range(20))
    assert off.frames(np.ones((40, 4)), 10.0) is None


def test_the_thresholds_are_operator_settings():
    settings = OperatorSettings()
    assert settings.runaway_limits() == RunawayLimits()
    changed = settings.merged({"runaway_length_factor": 5.0, "runaway_silence_s": 0})
    assert changed.runaway_limits() == RunawayLimits(length_factor=5.0, silence_s=0)
    with pytest.raises(InvalidSetting, match="runaway_length_factor"):
        settings.merged({"runaway_length_factor": 1.0})
    in_force = [settings]
    guard = RunawayGuard(Metrics(), lambda: in_force[0].runaway_limits())
    assert guard.watch("m", "v", 100, 1.0, 1000).most_s == pytest.approx(36.0)
    in_force[0] = changed  # the next generation reads the new ones
    assert guard.watch("m", "v", 100, 1.0, 1000).most_s == pytest.approx(60.0)


def test_an_upstream_that_streams_without_end_is_stopped_by_the_same_rule(guarded):
    engine = FakeUpstream()
    loop, guard, metrics = guarded(engine)
    assert submit(loop, 20, "far-voice").future.result(WAIT_S).audio.size == 2000  # a normal answer
    engine.endless, engine.requests = True, 0
    with pytest.raises(RunawaySpeech, match="model far"):
        submit(loop, 20, "far-voice").future.result(WAIT_S)
    assert engine.requests == 2  # sent again once, then refused
    samples, error = streamed(submit(loop, 20, "far-voice", stream=True))
    assert isinstance(error, RunawaySpeech) and 0 < samples <= 7200  # 7.2 s: 3 x 20 characters at 0.12 s
    assert engine.requests == 3
    assert stopped(metrics, Reason.LENGTH, "far", "far-voice") == 3
    assert loop.status().strategy.in_flight == 0
