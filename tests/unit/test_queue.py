import pytest

from tests.fakes import FakeEngine
from tests.unit.conftest import make_item
from tts_core.errors import DeadlineExceeded, InvalidRequest
from tts_core.scheduler.clock import FakeClock
from tts_core.scheduler.queue import QueueFull, RequestQueue


def test_shorter_items_go_first(clock):
    queue = RequestQueue(10, aging_horizon_s=2.0, clock=clock)
    long, short, medium = make_item(300, tag=1), make_item(20, tag=2), make_item(100, tag=3)
    queue.put_many([long, short, medium])
    assert [item.input.tokens[0] for item in queue.next_candidates(10)] == [2, 3, 1]


def test_higher_priority_goes_first(clock):
    queue = RequestQueue(10, clock=clock)
    queue.put_many([make_item(20, tag=1), make_item(300, tag=2, priority=1)])
    assert queue.next_candidates(10)[0].input.tokens[0] == 2


def test_candidates_share_the_head_batch_key(clock):
    queue = RequestQueue(10, clock=clock)
    queue.put_many([make_item(20, tag=1, key="a"), make_item(21, tag=2, key="b"), make_item(22, tag=3, key="a")])
    assert [item.input.tokens[0] for item in queue.next_candidates(10)] == [1, 3]


def test_aging_puts_a_long_item_ahead_of_later_short_ones(clock):
    queue = RequestQueue(10, aging_horizon_s=0.05, clock=clock)
    long = make_item(400, tag=1)
    queue.put_many([long])
    clock.sleep(0.06)  # past the horizon: everything arriving now ranks behind it
    queue.put_many([make_item(10, tag=2)])
    assert queue.next_candidates(10)[0] is long


def test_full_queue_rejects_all_or_nothing(clock):
    queue = RequestQueue(3, clock=clock)
    queue.put_many([make_item(10), make_item(10)])
    with pytest.raises(QueueFull) as raised:
        queue.put_many([make_item(10), make_item(10)])
    assert raised.value.retry_after_s >= 1
    assert len(queue) == 2


@pytest.mark.parametrize("count, caller, tier_limit, most", [
    (11, "", None, 10),  # more than the whole queue holds
    (5, "ip:reader", None, 4),  # more than one caller may have waiting
    (4, "ip:reader", 3, 3),  # more than the caller's tier may hold
])
def test_a_text_that_could_never_be_queued_is_refused_as_invalid_not_full(count, caller, tier_limit, most, clock):
    queue = RequestQueue(10, max_per_caller=4, clock=clock)  # empty: no wait would ever let it in
    assert queue.most_per_text(caller, tier_limit) == most
    with pytest.raises(InvalidRequest) as raised:
        queue.check(count, caller=caller, tier_limit=tier_limit)
    assert raised.value.code == "text_above_queue_capacity" and raised.value.retry_after_s is None
    assert f"at most {most}" in raised.value.message
    queue.check(most, caller=caller, tier_limit=tier_limit)  # as many as fit: accepted


def test_put_many_refuses_more_items_than_the_queue_holds_as_invalid(clock):
    queue = RequestQueue(3, clock=clock)
    with pytest.raises(InvalidRequest):
        queue.put_many([make_item(10) for _ in range(4)])
    assert len(queue) == 0


def test_cancelled_items_are_dropped_and_expired_items_fail(clock):
    queue = RequestQueue(10, clock=clock)
    cancelled, expired, live = make_item(10, tag=1), make_item(10, tag=2, deadline=0.0), make_item(10, tag=3)
    queue.put_many([cancelled, expired, live])
    cancelled.future.cancel()
    assert queue.next_candidates(10) == [live]
    assert isinstance(expired.future.exception(), DeadlineExceeded)
    assert len(queue) == 1


def test_an_item_put_back_running_still_expires_and_the_queue_goes_on(clock):
    queue = RequestQueue(10, clock=clock)
    put_back, later = make_item(10, tag=1, deadline=clock.now() + 1.0), make_item(10, tag=2)
    queue.put_many([put_back, later])
    queue.take([put_back], 0.0)
    put_back.future.set_running_or_notify_cancel()  # taken, then back (its engine ran out of memory)
    queue.put_back(put_back)
    clock.sleep(2.0)
    assert queue.next_candidates(10) == [later]  # (before: RuntimeError, which ended the deadline watcher)
    assert isinstance(put_back.future.exception(), DeadlineExceeded)


class Flooded(FakeEngine):
    """Each call queues one more short item, for its first `flood` calls after `loop` is set: the queue never
    empties while the flood lasts. At the `long_at`-th call a long item is queued too."""

    loop = None
    calls = 0
    flood, long_at = 60, 5

    def __init__(self, clock: FakeClock):
        super().__init__(cost=lambda size, padded: 0.02, clock=clock)
        self.long = make_item(400, tag=1)

    def synthesize(self, batch):
        if self.loop is not None and self.calls < self.flood:
            self.calls += 1
            self.loop.submit([make_item(10, tag=2)])
            if self.calls == self.long_at:
                self.loop.submit([self.long])
        return super().synthesize(batch)


def test_long_request_wait_is_bounded_under_a_stream_of_short_ones(start_loop, clock):
    # Each call costs 20 ms and a short item arrives with each, so the queue never empties and, ranked by
    # length alone, the long item would wait forever. Aging bounds its wait.
    engine = Flooded(clock)
    loop = start_loop(engine, policy="sequential", aging_horizon_s=0.3)
    engine.loop = loop
    loop.submit([make_item(10, tag=2)])  # the first call: the flood begins
    engine.long.future.result(timeout=10)
    assert engine.long.queue_s <= 0.3 + 2 * 0.02, engine.long.queue_s  # the horizon, plus the call running
    first_long = next(i for i, call in enumerate(engine.seen) if call == [1])
    assert first_long > Flooded.long_at + 2, "short items that arrived after the long one still went first"
