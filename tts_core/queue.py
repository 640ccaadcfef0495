"""The request queue of one engine: bounded, priority with aging, cancellation and deadlines.

Order is by a virtual start time: the arrival time, plus a delay that grows with the item's
length (short texts go first), minus a boost for higher priority classes. A stream's later
chunks also count from when their audio will be needed (`due_s`): what plays in a minute does
not go before another caller's first words. Because the length
delay is capped at `aging_horizon_s`, anything that arrives later than that after a long item
ranks behind it: a long request's extra wait is bounded, it is never starved.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence

from .errors import DeadlineExceeded, Overloaded
from .request import SynthesisRequest

PRIORITY_STEP_S = 5.0  # one priority class is worth this much waiting
LONG_TOKENS = 400  # an item this long (in tokens: ~180 characters of Piper phonemes) is delayed the whole horizon


class QueueFull(Overloaded):
    def __init__(self, retry_after_s: int, reason: str = "the queue is full"):
        super().__init__(f"{reason}; retry after {retry_after_s} s", retry_after_s)


class RequestQueue:
    def __init__(self, max_size: int, aging_horizon_s: float = 2.0, long_tokens: int = LONG_TOKENS,
                 on_drop: Callable[[str, int], None] = lambda reason, count: None, fifo: bool = False):
        self.max_size = max_size
        self.fifo = fifo  # arrival order only: how the peers Chorus is benchmarked against queue
        self.on_drop = on_drop  # told of items dropped unsynthesized: ("cancelled" | "deadline", count)
        self.aging_horizon_s = aging_horizon_s
        self.long_tokens = long_tokens
        self._items: list[SynthesisRequest] = []
        self._changed = threading.Condition()
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    def rank(self, item: SynthesisRequest) -> tuple[float, int]:
        if self.fifo:
            return (item.enqueued_at, item.seq)
        length_delay = self.aging_horizon_s * min(1.0, item.length / self.long_tokens)
        return (item.enqueued_at + item.due_s + length_delay - item.priority * PRIORITY_STEP_S, item.seq)

    def has_room(self, count: int = 1) -> bool:
        return len(self._items) + count <= self.max_size

    def put_many(self, items: Sequence[SynthesisRequest], retry_after_s: int = 1,
                 tier_limit: int | None = None) -> None:
        """Enqueue all items or none of them. tier_limit caps how many items of the items' tier
        may wait at once (a tier's share of the queue)."""
        with self._changed:
            if self._closed or not self.has_room(len(items)):
                raise QueueFull(retry_after_s)
            if tier_limit is not None:
                tier = items[0].tier
                if sum(1 for item in self._items if item.tier == tier) + len(items) > tier_limit:
                    raise QueueFull(retry_after_s, f"tier {tier!r} holds its full share of the queue "
                                                   f"({tier_limit} items)")
            now = time.monotonic()
            for item in items:
                item.enqueued_at = now
            self._items.extend(items)
            self._changed.notify_all()

    def wait(self, timeout: float | None = None) -> None:
        """Block until something is put (or closed), or the timeout passes."""
        with self._changed:
            if not self._closed:
                self._changed.wait(timeout)

    def wait_for_items(self) -> None:
        with self._changed:
            while not self._items and not self._closed:
                self._changed.wait()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def next_candidates(self, limit: int) -> list[SynthesisRequest]:
        """The most urgent item and up to limit-1 more of its batch key, most urgent first.

        Items whose caller has gone (future cancelled) are dropped here unsynthesized, and items
        past their deadline are failed with DeadlineExceeded.
        """
        now = time.monotonic()
        with self._changed:
            live: list[SynthesisRequest] = []
            cancelled = expired = 0
            for item in self._items:
                if item.future.cancelled():
                    cancelled += 1
                elif now > item.deadline:
                    expired += 1
                    item.future.set_exception(DeadlineExceeded(
                        f"waited {now - item.enqueued_at:.1f} s in the queue, past its deadline"))
                else:
                    live.append(item)
            live.sort(key=self.rank)
            self._items = live
            candidates = [item for item in live if item.key == live[0].key][:limit] if live else []
        for reason, count in (("cancelled", cancelled), ("deadline", expired)):
            if count:
                self.on_drop(reason, count)
        return candidates

    def remove(self, items: Iterable[SynthesisRequest]) -> None:
        taken = {id(item) for item in items}
        with self._changed:
            self._items = [item for item in self._items if id(item) not in taken]
