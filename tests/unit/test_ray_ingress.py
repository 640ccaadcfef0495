"""The Ray Serve ingress's side of a passage (deploy/ray_serve.py), against a stand-in for an engine
deployment's event stream: refusals raised whole, audio delivered in order (piece by piece for a
stream), a failure or a lost replica failing every piece, and a piece given up cancelling the call."""

import asyncio
import pickle

import numpy as np
import pytest

from tts_core.config import Settings
from tts_core.engines.contract import EngineInput, EngineOutput
from tts_core.errors import Overloaded, RateLimited, SynthesisError
from tts_core.ops.metrics import Metrics
from tts_core.scheduler.queue import WaitTarget

pytest.importorskip("ray.serve")

from deploy.ray_serve import RemoteScheduler


def test_errors_cross_processes_whole():
    for error in (Overloaded("queue full", 7, "queue_wait"), RateLimited("slow down", 3, {"X-RateLimit-Limit": "5"}),
                  SynthesisError("failed", "input")):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and copy.body() == error.body() and copy.headers() == error.headers()


def described(length: int, streamed: bool = False) -> dict:
    return {"input": EngineInput(np.arange(length), "v"), "key": ("v", 1.0), "priority": 0, "tier": "",
            "caller": "ip:1", "due_s": 0.0, "sample_rate": 16000, "pause_s": 0.1, "passage": 0, "word_ids": None,
            "deadline_in_s": 30.0, "streamed": streamed}


class RequestCancelled(Exception):
    """What Ray raises from a call cancelled by its caller (ray.serve.exceptions.RequestCancelledError)."""


class Events:
    """An engine replica's answer as the handle gives it: events in order, then (maybe) an error."""

    def __init__(self, events: list, error: BaseException | None = None):
        self.events, self.error, self.cancelled = list(events), error, asyncio.Event()

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.events:
            return self.events.pop(0)
        if self.error is not None:
            raise self.error
        await self.cancelled.wait()  # a replica still working: ends when cancelled, as Ray ends it
        raise RequestCancelled("cancelled")

    def cancel(self):
        self.cancelled.set()


class Handle:
    def __init__(self, events: Events):
        self.events = events

    def options(self, stream: bool):
        assert stream
        return self

    @property
    def speak(self):
        return self

    def remote(self, *args):
        return self.events


def scheduler(events: Events) -> RemoteScheduler:
    return RemoteScheduler(Settings(), None, Metrics(), engines={"m": Handle(events)})


async def submit(events: Events, max_wait_s: float = 10.0):
    passage = type("Passage", (), {"model": "m"})()
    return await scheduler(events).submit_passage(passage, 0, True, None, False, WaitTarget(max_wait_s), 0.0, False)


def test_no_engine_replica_answering_is_a_503_within_the_wait_target_and_the_call_is_cancelled():
    events = Events([])
    with pytest.raises(Overloaded) as refused:
        asyncio.run(submit(events, max_wait_s=0.2))
    assert refused.value.code == "engine_unavailable" and events.cancelled.is_set()


def test_a_refusal_is_raised_whole():
    with pytest.raises(Overloaded) as refused:
        asyncio.run(submit(Events([("refused", Overloaded("queue full", 4, "queue_wait"))])))
    assert refused.value.code == "queue_wait" and refused.value.retry_after_s == 4


def test_audio_arrives_in_order_whole_and_piece_by_piece():
    async def run():
        one, two = np.ones(4, np.float32), np.full(3, 2.0, np.float32)
        stamps = {"queue_s": 0.5, "batch_s": 0.2, "batch_size": 3}
        events = Events([("queued", [described(5), described(6, streamed=True)], 1.5),
                         ("audio", 0, EngineOutput(one, np.array([4]))), ("done", 0, stamps),
                         ("audio", 1, EngineOutput(two)), ("audio", 1, EngineOutput(one)), ("done", 1, stamps)])
        items, played_s = await submit(events)
        first = await asyncio.wrap_future(items[0].future)
        head, link = await asyncio.wrap_future(items[1].pieces.head)
        second, link = await asyncio.wrap_future(link)
        end = await asyncio.wrap_future(link)
        whole = await asyncio.wrap_future(items[1].future)
        return items, played_s, first, (head, second, end), whole

    items, played_s, first, (head, second, end), whole = asyncio.run(run())
    assert played_s == 1.5 and [item.length for item in items] == [5, 6] and items[0].pieces is None
    assert np.array_equal(first.audio, np.ones(4)) and first.token_samples.tolist() == [4]  # the engine's output
    assert np.array_equal(head, np.full(3, 2.0)) and np.array_equal(second, np.ones(4)) and end == (None, None)
    assert whole.audio.size == 7
    assert items[1].queue_s == 0.5 and items[1].batch_size == 3


@pytest.mark.parametrize("error", [ConnectionError("actor died"), "failed"])
def test_a_failure_or_a_lost_replica_fails_every_piece(error):
    async def run():
        failed = SynthesisError("synthesis failed", code="synthesis_failed")
        events = [("queued", [described(5), described(5)], 1.0)]
        events += [("failed", 0, failed)] if error == "failed" else []
        items, _ = await submit(Events(events, error if error != "failed" else None))
        return await asyncio.gather(*(asyncio.wrap_future(item.future) for item in items), return_exceptions=True)

    outcomes = asyncio.run(run())
    assert all(isinstance(outcome, SynthesisError) for outcome in outcomes)
    if error != "failed":
        assert "engine replica" in outcomes[0].message


def test_a_piece_given_up_cancels_the_call():
    async def run():
        events = Events([("queued", [described(5), described(5)], 1.0)])
        items, _ = await submit(events)
        items[1].abandon()
        await asyncio.wait_for(events.cancelled.wait(), 10)
        with pytest.raises(SynthesisError):  # the rest of the passage ends too: nothing more comes for it
            await asyncio.wait_for(asyncio.wrap_future(items[0].future), 10)


def test_a_call_that_ends_early_ends_every_piece_and_empty_audio_is_audio():
    async def run():
        events = Events([("queued", [described(5, streamed=True), described(5)], 1.0),
                         ("done", 0, {"queue_s": 0.1, "batch_s": 0.1, "batch_size": 1})],
                        StopAsyncIteration())  # the stream ends there
        items, _ = await submit(events)
        return await asyncio.gather(*(asyncio.wrap_future(item.future) for item in items), return_exceptions=True)

    empty, lost = asyncio.run(run())
    assert isinstance(empty, EngineOutput) and empty.audio.size == 0 and isinstance(lost, SynthesisError)

    asyncio.run(run())


def test_engines_scale_on_the_pieces_in_their_queues():
    from types import SimpleNamespace

    from deploy.ray_serve import scale_on_queue

    config = SimpleNamespace(get_target_ongoing_requests=lambda: 8.0)
    context = SimpleNamespace(config=config, aggregated_metrics={"pending_pieces": {"r1": 20.0, "r2": 10.0}})
    assert scale_on_queue(context)[0] == 4  # 30 pieces, 8 a replica
    context.aggregated_metrics = {}  # nothing reported yet: Ray's bounds keep the minimum
    assert scale_on_queue(context)[0] == 0
