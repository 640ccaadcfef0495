import threading
import time

import pytest

from tests.fakes import FakeEngine
from tests.unit.conftest import make_item
from tts_core.errors import DeadlineExceeded, InvalidRequest
from tts_core.queue import QueueFull, RequestQueue


def test_shorter_items_go_first():
    queue = RequestQueue(10, aging_horizon_s=2.0)
    long, short, medium = make_item(300, tag=1), make_item(20, tag=2), make_item(100, tag=3)
    queue.put_many([long, short, medium])
    assert [item.input.tokens[0] for item in queue.next_candidates(10)] == [2, 3, 1]


def test_higher_priority_goes_first():
    queue = RequestQueue(10)
    queue.put_many([make_item(20, tag=1), make_item(300, tag=2, priority=1)])
    assert queue.next_candidates(10)[0].input.tokens[0] == 2


def test_candidates_share_the_head_batch_key():
    queue = RequestQueue(10)
    queue.put_many([make_item(20, tag=1, key="a"), make_item(21, tag=2, key="b"), make_item(22, tag=3, key="a")])
    assert [item.input.tokens[0] for item in queue.next_candidates(10)] == [1, 3]


def test_aging_puts_a_long_item_ahead_of_later_short_ones():
    now = [100.0]
    queue = RequestQueue(10, aging_horizon_s=0.05, clock=lambda: now[0])
    long = make_item(400, tag=1)
    queue.put_many([long])
    now[0] += 0.06  # past the horizon: everything arriving now ranks behind it
    queue.put_many([make_item(10, tag=2)])
    assert queue.next_candidates(10)[0] is long


def test_full_queue_rejects_all_or_nothing():
    queue = RequestQueue(3)
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
def test_a_text_that_could_never_be_queued_is_refused_as_invalid_not_full(count, caller, tier_limit, most):
    queue = RequestQueue(10, max_per_caller=4)  # empty: no wait would ever let it in
    assert queue.most_per_text(caller, tier_limit) == most
    with pytest.raises(InvalidRequest) as raised:
        queue.check(count, caller=caller, tier_limit=tier_limit)
    assert raised.value.code == "text_above_queue_capacity" and raised.value.retry_after_s is None
    assert f"at most {most}" in raised.value.message
    queue.check(most, caller=caller, tier_limit=tier_limit)  # as many as fit: accepted


def test_put_many_refuses_more_items_than_the_queue_holds_as_invalid():
    queue = RequestQueue(3)
    with pytest.raises(InvalidRequest):
        queue.put_many([make_item(10) for _ in range(4)])
    assert len(queue) == 0


def test_cancelled_items_are_dropped_and_expired_items_fail():
    queue = RequestQueue(10)
    cancelled, expired, live = make_item(10, tag=1), make_item(10, tag=2, deadline=0.0), make_item(10, tag=3)
    queue.put_many([cancelled, expired, live])
    cancelled.future.cancel()
    assert queue.next_candidates(10) == [live]
    assert isinstance(expired.future.exception(), DeadlineExceeded)
    assert len(queue) == 1


def test_long_request_wait_is_bounded_under_a_stream_of_short_ones(start_loop):
    # Each call costs 20 ms and a short item arrives every 20 ms, so the queue never empties and,
    # ranked by length alone, the long item would wait forever. Aging bounds its wait.
    engine = FakeEngine(cost=lambda size, padded: 0.02)
    batcher = start_loop(engine, policy="sequential", aging_horizon_s=0.3)
    stop = threading.Event()

    def flood():
        while not stop.is_set():
            batcher.submit([make_item(10, tag=2)])
            time.sleep(0.02)

    flooder = threading.Thread(target=flood)
    flooder.start()
    try:
        time.sleep(0.1)
        long = make_item(400, tag=1)
        submitted = time.monotonic()
        batcher.submit([long])
        long.future.result(timeout=10)
        waited = time.monotonic() - submitted
    finally:
        stop.set()
        flooder.join()
    assert waited < 1.0, waited  # the horizon, plus the backlog ahead of it and one call
    first_long = next(i for i, call in enumerate(engine.seen) if call == [1])
    assert first_long > 2, "short items that arrived after the long one still went first"
