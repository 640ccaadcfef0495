"""Copies of a model in one engine (tts_core.engines.instances), and how the one-shot loop chooses how many."""

import math
import threading

import numpy as np
import pytest

from tests.fakes import FakeEngine, linear_cost
from tests.unit.conftest import make_item
from tts_core.engines.contract import EngineInput
from tts_core.engines.instances import Instances, split


def inputs(*lengths: int) -> list[EngineInput]:
    return [EngineInput(np.full(length, tag, dtype=np.int64), "v") for tag, length in enumerate(lengths)]


def test_a_batch_is_split_into_parts_of_about_equal_work_longest_first():
    assert split(inputs(10, 40, 30, 20), 2) == [[1, 0], [2, 3]]  # 50 tokens each
    assert split(inputs(5), 4) == [[0]]  # no empty parts
    assert sorted(index for part in split(inputs(*range(1, 12)), 3) for index in part) == list(range(11))


def test_the_parts_run_at_once_and_the_outputs_keep_the_batchs_order():
    both_running = threading.Barrier(2, timeout=10)  # each part waits for the other: they run at the same time
    threads = set()

    def synthesize(copy: str, part: list[EngineInput]) -> list[str]:
        threads.add(threading.current_thread().name)
        both_running.wait()
        return [f"{copy}:{int(item.tokens[0])}" for item in part]

    copies = Instances(["first", "second"])
    try:
        assert copies.run(inputs(10, 40, 30, 20), synthesize) == ["first:0", "first:1", "second:2", "second:3"]
        assert len(threads) == 2 and threading.current_thread().name in threads  # the first on the caller's thread
        assert copies.run(inputs(7), lambda copy, part: [copy]) == ["first"]  # one item: one copy, no other thread
    finally:
        copies.close()
    with_whole = Instances(["first", "second"], alone="whole")  # a lone item runs on the copy with every thread
    try:
        assert with_whole.run(inputs(7), lambda copy, part: [copy]) == ["whole"]
        assert with_whole.run(inputs(7, 7), lambda copy, part: [copy]) == ["first", "second"]
    finally:
        with_whole.close()


def test_a_failing_part_fails_the_batch_once_every_part_has_ended():
    ended = threading.Event()

    def synthesize(copy: str, part: list[EngineInput]) -> list[str]:
        if copy == "first":
            raise RuntimeError("bad item")
        ended.wait(10)
        return ["ok"] * len(part)

    copies = Instances(["first", "second"])
    try:
        threading.Timer(0.0, ended.set).start()
        with pytest.raises(RuntimeError, match="bad item"):
            copies.run(inputs(10, 20), synthesize)
        assert ended.is_set()
    finally:
        copies.close()


class Copied(FakeEngine):
    """A fake engine that can run copies of its model: a batch's parts cost what `part_cost(copies, size, padded)`
    says for its largest part (the parts run at once)."""

    def __init__(self, clock, part_cost):
        super().__init__(cost=self._batch_cost, clock=clock)
        self.part_cost, self.copies = part_cost, 1

    def _batch_cost(self, size: int, padded: int) -> float:
        largest = math.ceil(size / self.copies)
        return self.part_cost(self.copies, largest, padded * largest // size)

    def instance_counts(self):
        return (1, 2)

    def use_instances(self, count):
        self.copies = count

    @property
    def instances(self):
        return self.copies


def test_copies_are_chosen_where_they_make_an_item_faster(start_loop, clock):
    engine = Copied(clock, lambda copies, size, padded: linear_cost(size, padded))  # each copy has a core of its own
    loop = start_loop(engine)
    assert engine.instances == 2
    assert loop.status().strategy.instance_item_s[2] == pytest.approx(loop.status().strategy.instance_item_s[1] / 2)


def test_with_two_copies_the_policy_sizes_batches_by_one_copys_cost_and_runs_two_at_once(start_loop, clock):
    engine = Copied(clock, lambda copies, size, padded: linear_cost(size, padded))
    loop = start_loop(engine)
    assert loop.strategy.policy.copies == 2
    engine.gate.clear()  # the first call holds the engine while four more items queue
    first = make_item(100, tag=1)
    loop.submit([first])
    assert engine.calls_started.acquire(timeout=10)
    queued = [make_item(100, tag=tag) for tag in range(2, 6)]
    loop.submit(queued)
    engine.gate.set()
    for item in [first, *queued]:
        item.future.result(timeout=10)
    assert [len(call) for call in engine.seen] == [1, 2, 2]  # a batch of two costs what one item does


def test_copies_that_only_share_the_cores_are_not_chosen(start_loop, clock):
    engine = Copied(clock, lambda copies, size, padded: copies * linear_cost(size, padded))  # no faster an item
    loop = start_loop(engine)
    assert engine.instances == 1 and loop.status().strategy.instances == 1
    item = make_item(20)
    loop.submit([item])
    assert item.future.result(timeout=10).audio.size > 0


def test_tts_engine_instances_sets_the_copies_without_measuring(start_loop, clock):
    engine = Copied(clock, lambda copies, size, padded: copies * linear_cost(size, padded))
    loop = start_loop(engine, instances=4)  # more than the engine runs: its most
    assert engine.instances == 2 and loop.status().strategy.instance_item_s is None
