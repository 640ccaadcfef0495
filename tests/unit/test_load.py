"""Load and overload: the queue's fair order, its wait predictions, admission by predicted wait,
and a load score that measures load (a long text alone is not load; an overload is)."""

import asyncio
import math

import pytest

from tests.fakes import FakeEngine
from tests.unit.conftest import make_item
from tts_core.config import Settings
from tts_core.errors import Overloaded
from tts_core.monitor import Monitor
from tts_core.ops.metrics import Metrics
from tts_core.request.access import Caller, Tier
from tts_core.request.ask import Ask
from tts_core.request.operating import OperatorSettings
from tts_core.scheduler.queue import QueueFull, RequestQueue, WaitTarget
from tts_core.service import SpeechService


def item(length: int, tag: int, caller: str = "", cost_s: float = 1.0, priority: int = 0):
    made = make_item(length, tag=tag, priority=priority)
    made.caller, made.cost_s = caller, cost_s
    return made


def order(queue: RequestQueue) -> list[int]:
    return [int(queued.input.tokens[0]) for queued in queue.next_candidates(100)]


def test_short_goes_first_between_callers_but_a_caller_keeps_its_own_order(clock):
    queue = RequestQueue(20, clock=clock)
    queue.put_many([item(300, 1, "ip:a", cost_s=3.0)])  # a's long first sentence...
    queue.put_many([item(20, 2, "ip:a", cost_s=0.2)])  # ...then its short ones
    queue.put_many([item(20, 3, "ip:a", cost_s=0.2)])
    queue.put_many([item(20, 4, "ip:b", cost_s=0.2)])  # another caller's short text
    assert order(queue) == [4, 1, 2, 3]


def test_under_a_standing_queue_a_short_text_goes_ahead_of_longer_ones_queued_before_it(clock):
    # eight callers' long sentences of 2 s each wait; 5 s later a ninth caller's short one (0.2 s) arrives. By arrival
    # and a fixed horizon it would rank behind all eight; its lead is two turns of its own length for each further
    # caller (3 s), theirs two turns of theirs (30 s)
    queue = RequestQueue(20, aging_horizon_s=2.0, clock=clock)
    for tag in range(8):
        queue.put_many([item(300, tag, f"ip:{tag}", cost_s=2.0)])
    clock.sleep(5.0)
    assert queue.predicted_wait(length=20, caller="ip:short") == pytest.approx(0.0)  # (costed as the queued, per token)
    queue.put_many([item(20, 99, "ip:short", cost_s=0.2)])
    assert order(queue)[0] == 99
    # a long text is never starved: what arrives past its lead ranks behind it
    clock.sleep(30.0)
    queue.put_many([item(20, 100, "ip:late", cost_s=0.2)])
    assert order(queue)[:2] == [99, 0] and order(queue)[-1] == 100


def test_one_callers_long_text_takes_turns_with_a_newcomer(clock):
    # 10 pieces of 1 s each from one caller: the newcomer, arriving now, is ranked after the
    # pieces that would have run by now (none yet) and not after all ten.
    queue = RequestQueue(20, aging_horizon_s=2.0, clock=clock)
    queue.put_many([item(100, tag, "ip:long") for tag in range(1, 11)])
    queue.put_many([item(20, 99, "ip:new")])
    ranked = order(queue)
    assert ranked.index(99) <= 1, ranked
    assert queue.predicted_wait(length=20, caller="ip:other") <= 1.0
    # the long text's caller waits behind its own ten pieces (and the newcomer, who goes before most of them)
    assert queue.predicted_wait(length=20, caller="ip:long") == pytest.approx(11.0)


def test_the_predicted_wait_counts_the_work_ahead_and_the_batch_running(clock):
    queue = RequestQueue(20, clock=clock)
    queue.put_many([item(20, tag, f"ip:{tag}", cost_s=0.5) for tag in range(4)])
    assert queue.predicted_wait(length=20) == pytest.approx(2.0)
    running = queue.next_candidates(1)
    queue.take(running, predicted_s=0.5)
    assert queue.predicted_wait(length=20) == pytest.approx(2.0)  # 0.5 running + 3 x 0.5 queued
    queue.done(1)
    assert queue.predicted_wait(length=20) == pytest.approx(1.5)


def test_queued_items_that_join_a_stepped_engines_free_places_at_once_are_no_wait(clock):
    queue = RequestQueue(20, clock=clock)
    queue.put_many([item(20, tag, f"ip:{tag}", cost_s=0.5) for tag in range(4)])
    queue.expect_free_in(0.0, joining_now=3)  # 3 places free: the first three ranked run beside a newcomer
    assert queue.predicted_wait(length=20) == pytest.approx(0.5)
    queue.expect_free_in(0.0, joining_now=8)
    assert queue.predicted_wait(length=20) == pytest.approx(0.0)
    queue.expect_free_in(1.0)  # all places taken: it waits for a place, and for all four ahead
    assert queue.predicted_wait(length=20) == pytest.approx(3.0)


def test_admission_refuses_a_wait_past_the_target_or_the_deadline_with_an_honest_retry_after(clock):
    queue = RequestQueue(50, clock=clock)
    queue.put_many([item(20, tag, f"ip:{tag}", cost_s=1.0) for tag in range(12)])  # 12 s of work ahead
    with pytest.raises(QueueFull) as raised:
        queue.put_many([item(20, 99, "ip:late")], target=WaitTarget(10.0))
    assert raised.value.code == "queue_wait" and raised.value.retry_after_s == 2  # 12 s - 10 s
    assert "12 s" in raised.value.message
    late = item(20, 98, "ip:deadline")
    late.deadline = -math.inf
    with pytest.raises(QueueFull) as raised:
        queue.put_many([late])
    assert raised.value.code == "deadline_unreachable"
    assert queue.put_many([item(20, 97, "ip:patient")], target=WaitTarget(20.0)) == pytest.approx(12.0)


def test_in_an_overload_the_queue_is_kept_short_until_half_a_second_after_it(clock):
    queue = RequestQueue(100, clock=clock)
    target = WaitTarget(usual_s=10.0, overload_s=2.0)

    def offer(tag: int) -> float:  # a caller's sentence of 1 s, as the scheduler offers it
        queue.check(1, caller=f"ip:{tag}", target=target)
        return queue.put_many([item(20, tag, f"ip:{tag}")], target=target)

    # no overload yet: 7 s offered in 5 s, under half as much again as is done
    assert [offer(tag) for tag in range(8)] == pytest.approx([float(tag) for tag in range(8)])
    assert queue.overloaded(target)  # 8 s of work offered within 5 s (and half a second): over 1.5x, and a queue
    with pytest.raises(QueueFull) as raised:
        offer(8)  # 8 s of wait: under the usual target, over the overload's
    assert raised.value.code == "queue_wait" and raised.value.retry_after_s == 6
    assert "overloaded" in raised.value.message
    clock.sleep(0.6)  # nothing offered for half a second: the usual target is back, the queue as it was
    assert not queue.overloaded(target)
    assert offer(9) == pytest.approx(8.0)


@pytest.mark.parametrize("stream", [False, True])
def test_in_an_overload_a_text_is_taken_only_if_its_last_piece_starts_within_the_target(stream, clock):
    queue = RequestQueue(100, clock=clock)
    target = WaitTarget(usual_s=10.0, overload_s=2.0)
    for tag in range(3):  # three callers' texts of 2.6 s at once: offered faster than done, a queue 7.8 s deep
        queue.put_many([item(60, tag, f"ip:{tag}", cost_s=2.6)], target=target)
    assert queue.overloaded(target)
    three = [item(20, 10 + tag, "ip:three", cost_s=2.0) for tag in range(3)]
    for tag, piece in enumerate(three if stream else []):
        piece.due_s = 10.0 * tag  # a stream's later pieces, when they will be needed: backlog all the same
    # its shorter sentences go first (short first), but its last would start behind all three and its own two
    with pytest.raises(QueueFull) as raised:
        queue.put_many(three, target=target)
    assert "whole text is 12 s" in raised.value.message and raised.value.retry_after_s == 10
    assert queue.put_many([item(20, 20, "ip:one", cost_s=1.5)], target=target) == pytest.approx(0.0)  # taken


def test_one_callers_burst_of_sentences_is_no_overload(clock):
    queue = RequestQueue(100, clock=clock)
    target = WaitTarget(usual_s=10.0, overload_s=2.0)
    for tag in range(8):  # an answer's sentences at once: 4 s of work offered in an instant
        queue.check(1, caller="ip:reader", target=target)
        wait = queue.put_many([item(20, tag, "ip:reader", cost_s=0.5)], target=target)
    assert wait == pytest.approx(3.5)  # the last, behind its own seven: accepted
    assert not queue.overloaded(target)  # a new caller's sentence goes ahead of most of them


def test_a_long_text_beside_a_running_batch_is_no_overload(clock):
    queue = RequestQueue(100, clock=clock)
    target = WaitTarget(usual_s=10.0, overload_s=2.0)
    queue.put_many([item(20, tag, "ip:batch", cost_s=0.3) for tag in range(8)])
    queue.take(queue.next_candidates(8), predicted_s=2.5)  # another caller's batch: 2.5 s left to run
    queue.check(30, caller="ip:reader", target=target)  # 9 s of work in one text
    wait = queue.put_many([item(20, 100 + tag, "ip:reader", cost_s=0.3) for tag in range(30)], target=target)
    assert wait == pytest.approx(2.5)  # over the overload target, under the usual one: accepted
    assert not queue.overloaded(target)  # the running batch is no queue, and a text no overload of its own
    # a newcomer's sentence of 1 s: behind the running batch and a turn as long as its own of the text (its first
    # three pieces), not behind all of it; accepted at once
    assert queue.put_many([item(20, 99, "ip:newcomer")], target=target) == pytest.approx(3.4)


def test_one_caller_may_not_fill_the_queue(clock):
    queue = RequestQueue(20, max_per_caller=5, clock=clock)
    queue.put_many([item(20, tag, "ip:greedy") for tag in range(5)])
    with pytest.raises(QueueFull) as raised:
        queue.put_many([item(20, 9, "ip:greedy")])
    assert raised.value.code == "caller_queue_full"
    queue.put_many([item(20, 10, "ip:other")])  # everyone else still gets in


# --- the service and the monitor, with an engine whose calls cost a known time -----------------

@pytest.fixture
def world():
    made = []

    def make(cost_s: float = 0.05, **settings) -> tuple[SpeechService, FakeEngine, Monitor]:
        engine = FakeEngine(cost=lambda size, padded: cost_s)
        service = SpeechService(Settings(batch_policy="sequential", calibration_sizes=[1], voice_aliases={},
                                         model_aliases={}, **settings), [engine], Metrics())
        service.start()
        made.append(service)
        assert service.loops["fake"].calibrated.wait(10)
        return service, engine, Monitor(service)

    yield make
    for service in made:
        service.stop()


def caller(name: str) -> Caller:
    return Caller(f"ip:{name}", "open", Tier(max_chars=100_000))


def test_a_long_text_on_an_idle_server_is_not_load(world):
    # times scaled down together: pieces of 50 ms, a 0.2 s aging horizon, a 0.5 s wait target
    service, engine, monitor = world(aging_horizon_s=0.2)
    service.degrade.configure(OperatorSettings(queue_wait_target_s=0.5, exit_hold_s=0))
    engine.gate.clear()
    text = " ".join(f"Sentence number {n} is here." for n in range(40))  # 40 pieces: 2 s of work

    async def scenario():
        long = asyncio.ensure_future(service.answer(Ask(text, "fake-voice", caller=caller("reader"))))
        assert await asyncio.to_thread(engine.calls_started.acquire, True, 5)  # its first piece runs, the rest wait
        monitor.tick()
        state = service.degrade.state
        assert not state.active and state.parts["queue_wait"] < 0.5, state
        # another caller arriving now is served next, not after the 40 pieces
        other = asyncio.ensure_future(service.answer(Ask("Short one.", "fake-voice", caller=caller("other"))))
        engine.gate.set()
        await asyncio.wait_for(other, 5)
        assert not long.done()
        await asyncio.wait_for(long, 10)

    asyncio.run(scenario())


def test_an_overload_is_refused_fast_and_raises_the_score(world):
    service, engine, monitor = world(cost_s=0.05, aging_horizon_s=0.2)
    service.degrade.configure(OperatorSettings(queue_wait_target_s=0.5, enter_threshold=0.5, exit_threshold=0.2,
                                               exit_hold_s=0))
    engine.gate.clear()

    async def scenario():
        requests = [asyncio.ensure_future(service.answer(Ask(f"Caller {n} speaks.", "fake-voice",
                                                             caller=caller(str(n)))))
                    for n in range(30)]
        # refusals come at once, before any synthesis runs: wait until each request is refused or queued
        for _ in range(1000):
            if sum(request.done() for request in requests) + service.queue_length() == 30 - 1:  # 1 running
                break
            await asyncio.sleep(0.01)
        refused = [request.exception() for request in requests if request.done()]
        assert refused and all(isinstance(error, Overloaded) and error.code == "queue_wait" for error in refused)
        assert all(1 <= error.retry_after_s <= 2 for error in refused)
        monitor.tick()
        assert service.degrade.state.active and service.degrade.state.parts["queue_wait"] >= 0.5
        engine.gate.set()
        answered = await asyncio.gather(*requests, return_exceptions=True)
        assert sum(not isinstance(outcome, Exception) for outcome in answered) == 30 - len(refused)
        monitor.tick()  # drained: the score falls at once (exit_hold_s 0 here)
        assert not service.degrade.state.active and service.degrade.state.score == 0.0

    asyncio.run(scenario())


def test_the_sentences_one_caller_sends_at_once_come_back_in_order(world):
    # Open WebUI sends each sentence of an answer as its own request, all at once, and plays them in
    # order: the long first sentence must not come back last because short ones overtook it.
    service, engine, _ = world(cost_s=0.02)
    engine.gate.clear()
    sentences = ["A long first sentence that goes on for quite a while before it ends.", "Short.", "Tiny."]

    async def scenario():
        blocker = asyncio.ensure_future(service.answer(Ask("Someone else.", "fake-voice", caller=caller("x"))))
        assert await asyncio.to_thread(engine.calls_started.acquire, True, 5)
        finished = []

        async def say(index: int, text: str, who: str):
            await service.answer(Ask(text, "fake-voice", caller=caller(who)))
            finished.append((who, index))

        tasks = [asyncio.ensure_future(say(index, text, "webui")) for index, text in enumerate(sentences)]
        tasks.append(asyncio.ensure_future(say(9, "Hi.", "other")))  # another caller's short text
        for _ in range(500):
            if service.queue_length() == 4:
                break
            await asyncio.sleep(0.01)
        engine.gate.set()
        await asyncio.wait_for(asyncio.gather(blocker, *tasks), 10)
        return finished

    finished = asyncio.run(scenario())
    assert [index for who, index in finished if who == "webui"] == [0, 1, 2]
    assert finished[0] == ("other", 9)  # between callers, short still goes first
