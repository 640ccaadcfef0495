"""A loop that never wedges (issue 43): a turn that raises ends the requests it concerns with a clear error, leaves
the engine running nothing of theirs, and the others go on; a repeating failure is told once and counted, and the
loop waits between tries instead of spinning; a stop ends a whole batch between two steps and the codec thread
with it; queued items expire at their deadline while a batch runs (issue 44). Fake engines on the fake clock, and
events, never sleeps."""

import logging
import math
import threading

import numpy as np
import pytest

from tests.fakes import FRAME, FakeEngine, FakeSteppedEngine
from tests.serve import wait_until
from tests.unit.conftest import make_item
from tests.unit.test_codec_stage import read_stream, staged
from tests.unit.test_stepping import hold, item, start  # noqa: F401 (start: the loop fixture)
from tts_core.errors import ClientGone, DeadlineExceeded, ErrorCode, Overloaded, SynthesisError
from tts_core.ops.metrics import Metrics
from tts_core.scheduler.faults import Faults
from tts_core.scheduler.queue import RequestQueue
from tts_core.scheduler.strategies import make_engine_loop


class Broken(Exception):
    """A bug planted in a fake engine."""


# --- a turn that raises --------------------------------------------------------------------------------------


@pytest.mark.parametrize("apart", [False, True], ids=["inline", "codec-stage"])
def test_a_turn_that_raises_ends_its_requests_with_a_retryable_error_and_the_next_ones_run(start, clock,  # noqa: F811
                                                                                         apart):
    engine = FakeSteppedEngine(clock=clock, decodes_apart=apart)
    loop = start(engine)
    first, second = item(40, tag=1), item(40, tag=2)

    def taking(taken) -> None:  # taking frames raises: out of the turn, past the step's own handling
        if int(taken.tokens[0]) == 1:
            raise Broken("a bug in taking frames")
    engine.on_take = taking
    loop.submit([first, second])
    for each in (first, second):  # both ran in the turn that failed
        with pytest.raises(SynthesisError, match="internal error \\(Broken\\)") as failed:
            each.future.result(timeout=10)
        assert failed.value.retryable and "a bug" not in failed.value.message  # ours, not the engine's text
    assert wait_until(lambda: not engine.running(), every_s=0.01)  # the engine runs nothing of theirs
    later = item(20, tag=3)
    loop.submit([later])
    assert later.future.result(timeout=10).audio.size == 20 * FRAME
    status = loop.status()
    assert status.turns.count == 1 and status.turns.in_a_row == 0
    assert status.turns.last == "Broken: a bug in taking frames"
    assert wait_until(lambda: not loop.busy, every_s=0.01)  # every request was counted as done


def test_a_request_the_engine_runs_that_the_loop_never_knew_costs_one_turn_not_every_turn(start, clock):  # noqa: F811
    """Issue 43's spin: a second loop had put its own request in the engine, and every turn raised KeyError."""
    engine = FakeSteppedEngine(clock=clock)
    loop = start(engine)
    stranger = item(1_000_000, tag=9)
    loop.run_on_engine(lambda: engine.admit([stranger.input])).result(timeout=10)
    mine = item(20, tag=1)
    loop.submit([mine])
    assert mine.future.result(timeout=10).audio.size == 20 * FRAME
    assert loop.status().turns.count <= 1 and not engine.running()


def test_a_failure_that_repeats_is_logged_once_then_counted(caplog):
    faults = Faults("model", "a turn")

    def fail() -> None:
        try:
            raise KeyError(5)
        except KeyError as error:
            faults.failed(error)
    with caplog.at_level(logging.ERROR, "tts_core.scheduler.faults"):
        for _ in range(1000):
            fail()
    assert [record.exc_info is not None for record in caplog.records] == [True, False, False, False]
    assert "1000 times so far" in caplog.records[-1].getMessage()
    assert faults.counts().to_json("turn") == {"turn_failures": 1000, "turn_failures_in_a_row": 1000,
                                               "last_turn_failure": "KeyError: 5"}
    assert faults.backoff_s() == 1.0
    faults.succeeded()
    assert faults.backoff_s() == 0.0 and faults.counts().in_a_row == 0


def test_a_loop_whose_turns_keep_failing_waits_between_tries_instead_of_spinning(start, clock):  # noqa: F811
    engine = FakeSteppedEngine(clock=clock)
    loop = start(engine)
    broken = threading.Event()
    running = engine.running

    def failing_running() -> list[int]:
        if broken.is_set():
            raise Broken("the engine's books are broken")
        return running()
    engine.running = failing_running
    broken.set()
    waiting = item(10, tag=1)
    loop.submit([waiting])
    assert wait_until(lambda: loop.faults.in_a_row >= 2, every_s=0.01)
    # The fake clock stands still: the loop waits for its backoff to pass, it does not retry hot.
    assert not wait_until(lambda: loop.faults.in_a_row > 2, timeout_s=0.3, every_s=0.01)
    broken.clear()
    clock.sleep(1.0)  # the backoff passes
    assert waiting.future.result(timeout=10).audio.size == 10 * FRAME
    assert loop.faults.count == 2 and loop.faults.in_a_row == 0


# --- stopping ----------------------------------------------------------------------------------------------------


def test_a_stop_whose_ending_fails_still_ends_the_codec_thread_and_tells_the_callers(start, clock):  # noqa: F811
    engine, _, _ = staged(clock, max_running=2)
    loop = start(engine)
    running = item(100_000, tag=1)
    hold(engine, loop, running)

    def failing_release(item_id: int) -> None:
        raise Broken("release failed")
    engine.release = failing_release
    stopper = threading.Thread(target=loop.stop)
    stopper.start()
    assert wait_until(lambda: loop.queue.closed, every_s=0.01)
    engine.gate.set()
    stopper.join(10)
    assert not loop._thread.is_alive() and not loop.strategy.codec._thread.is_alive()
    with pytest.raises(Overloaded, match="stopped"):
        running.future.result(timeout=5)


def test_a_stop_meets_a_long_whole_batch_and_ends_it_between_two_steps(start, clock):  # noqa: F811
    """Under a peer's policy a stepped engine runs a whole batch to its end; a stop ends it at its next step, so
    that no two loops ever drive one engine (issue 43: the check's next loop started while this one ran on)."""
    engine = FakeSteppedEngine(clock=clock, max_running=8)
    loop = start(engine, policy="static")
    long = [item(10_000_000, tag=tag) for tag in range(1, 9)]
    stepping = threading.Event()
    engine.on_step = lambda: len(engine.steps_run) >= 20 and stepping.set()
    loop.submit(long)
    assert stepping.wait(10)
    assert loop.stop(timeout=10)  # the thread has ended
    for each in long:
        with pytest.raises(Overloaded, match="stopped") as stopped:
            each.future.result(timeout=5)
        assert stopped.value.code == ErrorCode.MODEL_STOPPED
    assert not engine.running()
    engine.on_step = lambda: None
    again = start(engine, policy="static")  # the engine is free for the next loop
    short = item(5, tag=1)
    again.submit([short])
    clock.sleep(0.6)  # static waits 0.5 s for 8
    assert short.future.result(timeout=10).audio.size == 5 * FRAME


# --- the codec as a stage, steps much faster than decodes (a GPU's proportion) -----------------------------------


def test_with_decodes_far_slower_than_steps_callers_hang_up_mid_stream_and_everyone_else_is_served(start,  # noqa: F811
                                                                                                    clock):
    engine = FakeSteppedEngine(clock=clock, decodes_apart=True, max_running=4, step_cost=lambda running: 0.001)
    engine.decode_cost = lambda frames: 0.02 * frames  # 20x a step a frame
    loop = start(engine)
    kept = [item(60, tag=tag, stream=True) for tag in (1, 2, 3)] + [item(40, tag=4)]
    leaving = [item(200, tag=tag, stream=True) for tag in (5, 6, 7)]
    loop.submit(kept + leaving)
    for each in leaving:  # each hangs up after its first piece, while its next pieces are made or in flight
        assert each.pieces.head.result(timeout=10)[0].size > 0
        each.abandon()
    for each in kept[:3]:
        pieces = read_stream(each)
        assert np.concatenate(pieces).size == 60 * FRAME and np.allclose(np.concatenate(pieces), each.input.tokens[0]
                                                                         / 1000)
    assert kept[3].future.result(timeout=10).audio.size == 40 * FRAME
    assert wait_until(lambda: not loop.busy and loop.strategy.codec.idle() and not engine.running(), every_s=0.01)
    for each in leaving:
        assert each.future.cancelled() or isinstance(each.future.exception(timeout=5), ClientGone)
    status = loop.status()
    assert status.turns.count == 0 and status.strategy.codec_jobs.count == 0


# --- deadlines while a batch runs --------------------------------------------------------------------------------


def test_a_queued_item_expires_at_its_deadline_not_when_the_engine_next_looks(clock):
    drops = []
    queue = RequestQueue(10, clock=clock, on_drop=lambda reason, count: drops.append((reason, count)))
    late, later = make_item(5, tag=1, deadline=clock.now() + 5), make_item(5, tag=2, deadline=clock.now() + 50)
    queue.put_many([late, later])
    clock.advance_to(clock.now() + 6)
    assert isinstance(late.future.exception(timeout=10), DeadlineExceeded)
    assert wait_until(lambda: drops == [("deadline", 1)], every_s=0.01) and len(queue) == 1
    assert not later.future.done()
    clock.advance_to(clock.now() + 50)
    assert isinstance(later.future.exception(timeout=10), DeadlineExceeded)
    assert wait_until(lambda: not queue._watching, every_s=0.01)  # the watcher ends once no deadline is queued


def test_a_deadline_passes_while_a_batch_runs_and_the_queued_item_is_answered_at_once(clock):
    engine = FakeEngine(clock=clock)
    loop = make_engine_loop(engine, RequestQueue(16, clock=clock), Metrics(), "sequential")
    loop.start()
    try:
        assert loop.calibrated.wait(30)
        engine.gate.clear()
        running = make_item(5, tag=1, key=engine.batch_key("fake-voice", 1.0))
        loop.submit([running])
        assert wait_until(lambda: engine.seen and engine.seen[-1] == [1], every_s=0.01)  # the batch is held
        queued = make_item(5, tag=2, key=engine.batch_key("fake-voice", 1.0), deadline=clock.now() + 120)
        loop.submit([queued])
        clock.advance_to(clock.now() + 121)
        with pytest.raises(DeadlineExceeded, match="waited 121"):
            queued.future.result(timeout=10)
        assert not running.future.done()  # the batch still runs
        engine.gate.set()
        assert running.future.result(timeout=10).audio.size > 0
        assert wait_until(lambda: not loop.busy, every_s=0.01)
    finally:
        engine.gate.set()
        loop.stop()


def test_an_item_without_a_deadline_starts_no_watcher(clock):
    queue = RequestQueue(10, clock=clock)
    queue.put_many([make_item(5, deadline=math.inf)])
    assert not queue._watching


def test_a_turn_that_fails_while_pieces_are_in_flight_hands_them_out_before_the_error(start, clock):  # noqa: F811
    engine, gate, decoded = staged(clock)
    loop = start(engine)
    decoded.clear()  # (the calibration's)
    stream = item(200, tag=1, stream=True)
    gate.clear()  # the codec holds the stream's first piece; the next ones are handed over behind it
    loop.submit([stream])
    assert gate.holding.wait(10) and wait_until(lambda: loop.strategy.codec.waiting() >= 2, every_s=0.01)

    def taking(taken) -> None:
        raise Broken("a bug in taking frames")
    engine.on_take = taking  # the next piece taken raises: the turn fails with pieces in flight
    gate.set()
    pieces, (audio, following) = [], stream.pieces.head.result(timeout=10)
    with pytest.raises(SynthesisError, match="internal error"):
        while audio is not None:
            pieces.append(audio)
            audio, following = following.result(timeout=10)
    assert len(pieces) >= 2 and len(pieces) == decoded.count(1)  # every piece handed over, then the error
    with pytest.raises(SynthesisError):
        stream.future.result(timeout=10)
    engine.on_take = lambda taken: None
    assert wait_until(lambda: not loop.busy and loop.strategy.codec.idle() and not engine.running(), every_s=0.01)
    later = item(10, tag=2)
    loop.submit([later])
    assert later.future.result(timeout=10).audio.size == 10 * FRAME


class Misreporting(FakeEngine):
    """While `broken`, a bug: what it returns are not outputs (read after the batch ran, past its handling)."""

    broken = False

    def synthesize(self, batch):
        outputs = super().synthesize(batch)
        return [object() for _ in batch] if self.broken else outputs


def test_a_one_shot_turn_that_raises_after_its_batch_ran_answers_the_batch_and_the_next_one_runs(clock):
    engine = Misreporting(clock=clock)
    loop = make_engine_loop(engine, RequestQueue(16, clock=clock), Metrics(), "sequential")
    loop.start()
    try:
        assert loop.calibrated.wait(30)
        engine.broken = True
        key = engine.batch_key("fake-voice", 1.0)
        broken = make_item(5, tag=1, key=key)
        loop.submit([broken])
        with pytest.raises(SynthesisError, match="internal error") as failed:
            broken.future.result(timeout=10)
        assert failed.value.retryable
        engine.broken = False
        later = make_item(5, tag=2, key=key)
        loop.submit([later])
        assert later.future.result(timeout=10).audio.size > 0
        assert loop.status().turns.count == 1 and wait_until(lambda: not loop.busy, every_s=0.01)
    finally:
        loop.stop()
