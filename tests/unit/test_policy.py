import math
from dataclasses import dataclass

import pytest

from tests.fakes import flat_cost, linear_cost
from tts_core.scheduler.policy import (
    SOLO_AFTER_MISS,
    AdaptivePolicy,
    BatchPolicy,
    CostModel,
    TimeoutPolicy,
    make_policy,
)


@dataclass
class Item:
    length: int
    deadline: float = math.inf
    enqueued_at: float = 0.0


def calibrated(cost, max_batch_size=16, max_batch_tokens=100_000) -> AdaptivePolicy:
    policy = AdaptivePolicy(max_batch_size, max_batch_tokens)
    for length in (24, 96):
        for size in (1, 2, 4, 8, 16):
            policy.observe(size, size * length, cost(size, size * length), calibration=True)
    return policy


def test_cost_model_recovers_the_curve():
    model = CostModel()
    for size in (1, 2, 4, 8, 16):
        for length in (20, 100):
            model.add(size, size * length, 0.03 + 0.002 * size + 0.0001 * size * length)
    assert model.coefficients == pytest.approx([0.03, 0.002, 0.0001], rel=1e-6, abs=1e-9)


def test_cost_model_never_fits_negative_costs():
    model = CostModel()
    for size, seconds in [(1, 0.05), (2, 0.09), (4, 0.21), (8, 0.39)]:
        model.add(size, size * 50, seconds)
    assert (model.coefficients >= 0).all()


def test_flat_cost_grows_batches_to_the_maximum():
    policy = calibrated(flat_cost)
    queued = [Item(50 + i % 5) for i in range(20)]
    assert len(policy.plan(queued, now=0.0).take) == 16


def test_linear_cost_runs_batch_size_one():
    policy = calibrated(linear_cost)
    queued = [Item(50 + i % 5) for i in range(20)]
    assert policy.plan(queued, now=0.0).take == (0,)


def test_linear_cost_with_equal_lengths_still_runs_alone():
    # Equal lengths: no padding waste, throughput is flat in size; no gain, so no batching.
    policy = calibrated(linear_cost)
    assert policy.plan([Item(60)] * 10, now=0.0).take == (0,)


def test_batches_never_push_a_member_past_its_deadline():
    policy = calibrated(flat_cost)
    now = 100.0
    # t = 40 ms + 0.01 ms per padded token: a member due in 43 ms allows 300 tokens, 6 items.
    queued = [Item(50, deadline=now + 10)] * 4 + [Item(50, deadline=now + 0.043)] + [Item(50, deadline=now + 10)] * 11
    take = policy.plan(queued, now).take
    assert 4 in take and len(take) == 6


def test_padded_token_budget_caps_the_batch():
    policy = calibrated(flat_cost, max_batch_tokens=400)
    take = policy.plan([Item(100)] * 16, now=0.0).take
    assert len(take) == 4


def test_head_is_always_in_the_batch_with_the_closest_lengths():
    policy = calibrated(flat_cost, max_batch_size=3)
    queued = [Item(40), Item(200), Item(42), Item(300), Item(39)]
    take = policy.plan(queued, now=0.0).take
    assert take[0] == 0
    assert sorted(take) == [0, 2, 4]


def test_uncalibrated_adaptive_dispatches_the_head_alone():
    assert AdaptivePolicy(16, 10_000).plan([Item(10)] * 5, now=0.0).take == (0,)


def test_sequential_takes_one():
    assert BatchPolicy().plan([Item(10)] * 5, now=0.0).take == (0,)


def test_timeout_policy_waits_then_dispatches():
    policy = TimeoutPolicy("static", 8, 0.5, 10_000)
    queued = [Item(10, enqueued_at=10.0)] * 3
    waiting = policy.plan(queued, now=10.1)
    assert waiting.take == () and waiting.wait_s == pytest.approx(0.4)
    assert policy.plan(queued, now=10.6).take == (0, 1, 2)
    assert policy.plan([Item(10, enqueued_at=10.0)] * 9, now=10.0).take == tuple(range(8))


def test_make_policy_knows_every_setting_value():
    assert {make_policy(n, 16, 1000).name for n in ("adaptive", "sequential", "static", "window")} == {
        "adaptive", "sequential", "static", "window"}
    with pytest.raises(ValueError):
        make_policy("fastest", 16, 1000)


def test_a_batch_must_beat_its_own_items_run_one_by_one_not_just_the_head():
    """Seen on a 2-core CPU: a small fixed cost made one 12-sentence batch of mixed lengths look
    faster than the short head alone, though padding made it slower than running the twelve one by
    one, and it held a stream's first audio back (docs/benchmarks-history.md)."""
    policy = calibrated(lambda size, padded: 0.027 + 0.0117 * size + 0.00196 * padded)
    lengths = [21, 57, 101, 209, 255, 361, 393, 397, 483, 495, 525, 561]
    assert policy.plan([Item(length) for length in lengths], now=0.0).take == (0,)
    # Equal lengths, where padding wastes nothing, still batch when the fixed costs make it pay.
    assert len(policy.plan([Item(21) for _ in lengths], now=0.0).take) > 1


def test_a_batch_that_did_not_pay_sends_the_next_dispatches_alone():
    # Calibrated on a curve where batching pays (a noisy sweep can say so on a CPU where it does not) ...
    policy = calibrated(flat_cost)
    queued = [Item(50) for _ in range(20)]
    assert len(policy.plan(queued, now=0.0).take) == 16
    # ... then a batch of 16 takes longer than its items would have taken alone.
    alone = 16 * policy.cost_model.predict(1, 50)
    policy.observe(16, 16 * 50, 2 * alone, real_tokens=16 * 50)
    assert all(policy.plan(queued, now=0.0).take == (0,) for _ in range(SOLO_AFTER_MISS))
    # a batch that pays does not
    fresh = calibrated(flat_cost)
    fresh.observe(16, 16 * 50, flat_cost(16, 16 * 50), real_tokens=16 * 50)
    assert len(fresh.plan(queued, now=0.0).take) == 16
