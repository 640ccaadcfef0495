"""The request queue of one engine: bounded, ordered, with wait predictions, cancellation and deadlines.

"fair" order (Chorus's) ranks each item by a virtual start time, read from the queue as it stands
(whenever the next batch is chosen or a wait predicted):

- its arrival, plus a lead that grows with its size (short texts go first), the greater of
  - its length's share of `aging_horizon_s` (all of it from `long_tokens` up), and
  - turns as long as its own predicted cost while other callers have items queued: one for the first (when
    it would start if that caller had a turn as long as its own, as in fair queueing), and FURTHER_TURNS
    for each further one, so that the more callers stand in the queue, the more short texts go first.
  The second is the lead that counts under a standing queue. There, a fixed horizon is soon small beside
  the wait, and the order would become arrival order: a short text would wait behind every long one
  queued before it (on a simulated closed loop of 16 callers sending single sentences of 20 to 200
  characters, with this queue: a short sentence's p95 wait 3.3 s instead of 17 s, a long one's 36 s
  instead of 18 s). A stream's later pieces (needed at their due times) and a stepped engine's streams
  (they join the running batch as soon as a place frees) take the horizon's lead alone. A lead is
  bounded by the queue's size, so a long text is never starved: whatever arrives later than its lead
  after it ranks behind it, and as the queue shrinks, so does its lead;
- plus, for a stream's later piece, when its audio will be needed (`due_s`);
- minus a boost per priority class;
- and never before the virtual end (start + predicted cost) of the same caller's previous queued item
  at the same priority. Within one caller, earlier requests go first (a client that sends the
  sentences of an answer at once gets them back in order); between callers, short goes first; and
  one caller's long text or batch takes turns with the others instead of holding the engine
  (a virtual-time fair queue).

"fifo" order is arrival order: how the peers Chorus is benchmarked against queue.

The queue predicts how long a new item would wait: the predicted cost of everything ranked ahead
of it, plus what is left of the batch running now. Admission refuses work whose predicted wait is
past the operator's target or its deadline, with a Retry-After from the same prediction.

The target is lower while the engine is overloaded: offered more work than it does over the last half
second, and half as much again over the last 2 s and the last 5 s (OFFERED_WINDOWS_S: the predicted cost
of every text decided, queued or refused; a text is never an overload of its own making), while a queue
stands: the queued work of every caller but the one with the most is the overload target or more (the
batch running now is no queue, and one caller's long text or burst of sentences, which the fair order puts
behind newcomers, is none either; not the wait of a typical sentence arriving now, which the fair order
puts ahead of longer ones under a standing queue, so that it would read an overload late; replayed, this
reads it sooner and refuses less outside it: docs/benchmarks-history.md). The long window keeps a normal
load's chance bursts out; the short one ends an overload half a second after it does, and the middle one within
1.3 s of a 3x overload's end when a text fills the short window by chance (at 70% load a single text of
over half a second's work does, about a third of the time), while the long one still reads the overload
for 3 s after it. Replayed (bench/overload_replay.py: this queue on a simulated clock, 60 s at 70%, 60 s
at 3x, 60 s at 70%), the middle window leaves fewer runs with 503s outside the overload, most of all in
the seconds after it, while the overload is found as fast and its accepted waits are as short (the runs:
docs/benchmarks-history.md). (A 3 s long window with a fifth's margin read a 70% load as an overload
too often.)

A queue that stands in an overload buys no throughput, only waiting, and at its end it is what
must drain before the server is back to normal; so in an overload the queue is held at
`WaitTarget.overload_s` (CoDel's lesson): a text is refused if its last piece would wait longer
(its later pieces, which the fair order puts behind newcomers, are backlog too; a stream's counted
as if all of it were needed now). Once the overload ends, the queue drains below that at once, and
the usual target applies again: a request that arrives after an overload is not refused for its
backlog, whatever the chance bursts of a normal load.
"""

from __future__ import annotations

import heapq
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..config import QUEUE_ORDERS
from ..engines.contract import EngineInput
from ..errors import DeadlineExceeded, ErrorCode, InvalidRequest, Overloaded
from .clock import SYSTEM_CLOCK, Clock
from .records import QueuedItem

PRIORITY_STEP_S = 5.0  # one priority class is worth this much waiting
FURTHER_TURNS = 2.0  # a text's lead under a standing queue: turns of its cost per caller past the first (module doc)
LONG_TOKENS = 400  # an item this long (in tokens: ~180 characters of Piper phonemes) is delayed the whole horizon
TYPICAL_TOKENS = LONG_TOKENS // 4  # a typical sentence: the load score is the wait one arriving now would have
# an overload: work offered over each window (seconds), over what the engine does in it times the factor
OFFERED_WINDOWS_S = {0.5: 1.0, 2.0: 1.5, 5.0: 1.5}


@dataclass(frozen=True)
class WaitTarget:
    """The longest predicted queue wait a request is accepted with: `usual_s`, or the lower `overload_s`
    while its engine is offered more work than it can do (operator settings queue_wait_target_s and
    overload_wait_target_s)."""

    usual_s: float = math.inf
    overload_s: float = math.inf

    def limit_s(self, overloaded: bool) -> float:
        return min(self.usual_s, self.overload_s) if overloaded else self.usual_s


class QueueFull(Overloaded):
    def __init__(self, retry_after_s: float, reason: str = "the queue is full", code: str = ErrorCode.QUEUE_FULL):
        retry = max(1, math.ceil(retry_after_s))
        super().__init__(f"{reason}; retry after {retry} s", retry, code)


def _refuse_if_late(wait_s: float, target: WaitTarget, overloaded: bool, deadline_in_s: float,
                    last_wait_s: float | None = None) -> None:
    """QueueFull if a predicted wait is over the operator's target or past the work's deadline. The wait is
    the first piece's; in an overload, the last piece's (`last_wait_s`, where known; a stream's as if all of
    it were needed now): a text's later pieces, which the fair order puts behind newcomers, are backlog too."""
    limit = target.limit_s(overloaded)
    counted = last_wait_s if overloaded and last_wait_s is not None else wait_s
    if counted > limit:
        why = "; the server is overloaded, and queues less for now" if limit < target.usual_s else ""
        whole = " for the whole text" if counted > wait_s else ""
        raise QueueFull(counted - limit, f"the predicted wait{whole} is {counted:.0f} s, over this server's target "
                        f"of {limit:.0f} s{why}", ErrorCode.QUEUE_WAIT)
    if wait_s > deadline_in_s:
        raise QueueFull(wait_s, f"the predicted wait of {wait_s:.0f} s is past the request's deadline",
                        ErrorCode.DEADLINE_UNREACHABLE)


def most_per_text(max_size: int, max_per_caller: int, caller: str, tier_limit: int | None = None) -> int:
    """The most pieces one text (or script) of this caller could ever have queued at once in a queue of max_size:
    the queue's size, its tier's share (tier_limit items), the caller's share (max_per_caller; 0: none)."""
    caps = (max_size, tier_limit, max_per_caller if caller else 0)
    return min(cap for cap in caps if cap)


def tier_share(queue_share: float, max_size: int) -> int | None:
    """The most pieces a tier with this share of the queue (a fraction) may hold; None: no limit of its own."""
    return None if queue_share >= 1 else max(1, int(queue_share * max_size))


def _moving_average(average: float, value: float) -> float:
    return value if not average else 0.9 * average + 0.1 * value


class QueueClosed(Exception):
    """The queue's model was unloaded: submit to the model's batcher again (it loads anew)."""


class RequestQueue:
    def __init__(self, max_size: int, aging_horizon_s: float = 2.0, long_tokens: int = LONG_TOKENS,
                 on_drop: Callable[[str, int], None] = lambda reason, count: None, order: str = "fair",
                 max_per_caller: int = 0, clock: Clock = SYSTEM_CLOCK,
                 offered_windows: dict[float, float] = OFFERED_WINDOWS_S):
        if order not in QUEUE_ORDERS:
            raise ValueError(f"unknown queue order {order!r}; one of {', '.join(QUEUE_ORDERS)}")
        self.max_size = max_size
        self.max_per_caller = max_per_caller  # 0: no limit
        self.order = order
        self.on_drop = on_drop  # told of items dropped unsynthesized: ("cancelled" | "deadline", count)
        self.aging_horizon_s = aging_horizon_s
        self.long_tokens = long_tokens
        self._items: list[QueuedItem] = []
        self._taken_end: dict[tuple[str, int], float] = {}  # (caller, priority) -> rank + cost of its last item taken
        self._running = 0  # items taken and not yet done
        self._running_until = 0.0  # predicted end of the batch running now
        self._joining_now = 0  # how many queued items would start at once (free places of a stepped engine)
        self._changed = threading.Condition(threading.RLock())
        self._closed = False
        self._woken = False  # the engine thread has other work (EngineLoop.run_on_engine): stop waiting
        self._watching = False  # a thread fails queued items as their deadlines pass (`_expire_on_time`)
        self.clock = clock  # the loop that serves this queue plans on it too (tests move a FakeClock)
        self._offered: deque[tuple[float, float]] = deque()  # (when, predicted cost) of texts offered, decided
        self._offered_windows = offered_windows  # {seconds: factor} (bench/overload_replay.py tries others)
        self._piece_cost_s = 0.0  # moving average of the queued pieces' predicted cost
        self._token_cost_s = 0.0  # and of their cost per token (what a new item's is predicted to be)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def busy(self) -> bool:
        """Work is queued or running."""
        return bool(self._items) or self._running > 0

    @property
    def closed(self) -> bool:
        return self._closed

    # --- ranking and predictions ------------------------------------------------------------------

    def _lead(self, item: QueuedItem, others: int) -> float:
        """How far behind its arrival (or due time) an item ranks, with `others` other callers queued."""
        lead = self.aging_horizon_s * min(1.0, item.length / self.long_tokens)
        if others and not item.due_s and item.pieces is None:  # not a stream's later piece, nor a stepped stream
            lead = max(lead, (1 + FURTHER_TURNS * (others - 1)) * item.cost_s)
        return lead

    def _ranks(self, now: float, new: Sequence[QueuedItem] = (), due: bool = True) -> list[float]:
        """The rank of each queued item, then of each of `new` as if queued now (lowest runs first; ties go to
        the older item), by the queue as it stands: an item's lead depends on how many callers are queued.
        Without `due`, the new items rank as if a stream's pieces were all needed now."""
        items = [*self._items, *new]
        arrivals = [item.enqueued_at for item in self._items] + [now] * len(new)
        if self.order == "fifo":
            return arrivals
        others = len({item.caller for item in items}) - 1  # (anonymous items count as one caller)
        ranks = arrivals[:]
        chain_end = dict(self._taken_end)  # (caller, priority) -> rank + cost of its last item so far
        for index in sorted(range(len(items)), key=lambda index: items[index].seq):
            item = items[index]
            due_s = item.due_s if due or index < len(self._items) else 0.0
            rank = arrivals[index] + due_s + self._lead(item, others) - item.priority * PRIORITY_STEP_S
            if item.caller:
                chain = (item.caller, item.priority)
                rank = max(rank, chain_end.get(chain, -math.inf))
                chain_end[chain] = rank + item.cost_s
            ranks[index] = rank
        return ranks

    def _wait_before(self, ranks: list[float], index: int, now: float, running: bool = True) -> float:
        """The predicted cost of the queued items ranked before the item at `index` of `ranks` (as _ranks gives
        them), less those that would start at once in free places (they run beside it, not before it), and
        (running) what is left of the batch running now."""
        ahead = [((rank, item.seq), item.cost_s) for rank, item in zip(ranks, self._items) if rank <= ranks[index]]
        joining = heapq.nsmallest(self._joining_now, ahead)
        waited = sum(cost for _, cost in ahead) - sum(cost for _, cost in joining)
        return (max(0.0, self._running_until - now) if running else 0.0) + waited

    def predicted_wait(self, length: int = TYPICAL_TOKENS, priority: int = 0, caller: str = "",
                       running: bool = True) -> float:
        """Seconds until a new item like this one would start, by the queue's present contents (without
        `running`: only what is queued ahead of it)."""
        probe = QueuedItem(EngineInput(np.zeros(max(1, length), dtype=np.int64), ""), key=None, deadline=math.inf,
                           priority=priority, caller=caller, cost_s=max(1, length) * self._token_cost_s)
        with self._changed:
            now = self.clock.now()
            return self._wait_before(self._ranks(now, [probe]), len(self._items), now, running)

    def overloaded(self, target: WaitTarget) -> bool:
        """More work was offered over each of its offered windows (queued or refused) than the engine does in
        that time (a second of predicted cost per second) times the window's factor, and a queue stands in
        front of new callers (the batch running now is no queue): see the module's docstring."""
        with self._changed:
            now = self.clock.now()
            self._forget_offers(now)
            offered = all(sum(seconds for when, seconds in self._offered if when >= now - window) > window * factor
                          for window, factor in self._offered_windows.items())
            return offered and self._standing_s() >= target.overload_s

    def _standing_s(self) -> float:
        """The queued work of every caller but the one with the most (one caller's long text or burst of sentences
        is no queue), less what would start at once in free places."""
        by_caller: dict[str, float] = {}
        for item in self._in_order()[self._joining_now:]:
            by_caller[item.caller] = by_caller.get(item.caller, 0.0) + item.cost_s
        return sum(by_caller.values()) - max(by_caller.values(), default=0.0)

    def _in_order(self) -> list[QueuedItem]:
        """The queued items, first to run first (each with its rank)."""
        for item, rank in zip(self._items, self._ranks(self.clock.now())):
            item.rank = rank
        return sorted(self._items, key=lambda item: (item.rank, item.seq))

    def _offer(self, seconds: float) -> None:
        """A text's predicted cost, once it is decided (queued or refused): a text is never an overload of
        its own making."""
        now = self.clock.now()
        self._forget_offers(now)
        self._offered.append((now, seconds))

    def _forget_offers(self, now: float) -> None:
        while self._offered and self._offered[0][0] < now - max(self._offered_windows):
            self._offered.popleft()

    def backlog_s(self) -> float:
        """Predicted seconds until everything queued and running now is done."""
        with self._changed:
            return max(0.0, self._running_until - self.clock.now()) + sum(item.cost_s for item in self._items)

    # --- the callers' side --------------------------------------------------------------------------

    def put_many(self, items: Sequence[QueuedItem], tier_limit: int | None = None,
                 target: WaitTarget = WaitTarget()) -> float:
        """Enqueue all items or none; returns the first item's predicted wait. Refuses (QueueFull)
        when the queue, the items' tier share (tier_limit items) or their caller's share is full,
        or when the first item's predicted wait is over the wait target or past its deadline; InvalidRequest
        for more items than could ever be queued at once. Raises QueueClosed once the queue's model is unloaded."""
        with self._changed:
            if self._closed:
                raise QueueClosed()
            overloaded = self.overloaded(target)
            try:
                self._check_room(len(items), items[0].tier, items[0].caller, tier_limit)
                now = self.clock.now()
                wait = self._wait_before(self._ranks(now, items), len(self._items), now)
                _refuse_if_late(wait, target, overloaded, items[0].deadline - now,
                                self._last_wait(items, now) if overloaded else None)
            finally:
                self._offer(sum(item.cost_s for item in items))
            for item in items:
                item.enqueued_at = now
                self._piece_cost_s = _moving_average(self._piece_cost_s, item.cost_s)
                self._token_cost_s = _moving_average(self._token_cost_s, item.cost_s / max(1, item.length))
            self._items.extend(items)
            self._watch_deadlines()
            self._changed.notify_all()
            return wait

    def _last_wait(self, items: Sequence[QueuedItem], now: float) -> float:
        """When the last of new items would start, counted in an overload: behind the queued work ranked before
        it and its own earlier pieces, a stream's ranked as if all of it were needed now (its later pieces are
        backlog all the same)."""
        undue = self._ranks(now, items, due=False)
        return self._wait_before(undue, len(undue) - 1, now) + sum(item.cost_s for item in items[:-1])

    def check(self, count: int, tier: str = "", caller: str = "", priority: int = 0, tier_limit: int | None = None,
              target: WaitTarget = WaitTarget(), deadline_in_s: float = math.inf) -> None:
        """What put_many would refuse for count new items like these (the cheap check made before
        the work of tokenizing a text; put_many checks again, exactly, when it queues them). A text
        refused here counts as work offered, at the queued pieces' average cost."""
        with self._changed:
            try:
                self._check_room(count, tier, caller, tier_limit)
                # the shortest item's wait: a lower bound, so this never refuses what put_many would take
                _refuse_if_late(self.predicted_wait(1, priority, caller), target, self.overloaded(target),
                                deadline_in_s)
            except QueueFull:
                self._offer(count * self._piece_cost_s)
                raise

    def most_per_text(self, caller: str, tier_limit: int | None = None) -> int:
        """The most pieces one text of this caller could ever have queued at once: the queue's size, its
        tier's share (tier_limit items), the caller's share."""
        return most_per_text(self.max_size, self.max_per_caller, caller, tier_limit)

    def _check_room(self, count: int, tier: str, caller: str, tier_limit: int | None) -> None:
        most = self.most_per_text(caller, tier_limit)
        if count > most:  # no wait would help: a 400, not a 503 to retry
            raise InvalidRequest(f"this text makes {count} pieces to synthesize, and at most {most} of one caller's "
                                 "can ever wait in this server's queue at once; send it in shorter parts", "input",
                                 ErrorCode.TEXT_ABOVE_QUEUE_CAPACITY)
        if len(self._items) + count > self.max_size:
            raise QueueFull(self.backlog_s())
        if tier_limit is not None and sum(1 for item in self._items if item.tier == tier) + count > tier_limit:
            raise QueueFull(self.backlog_s(), f"tier {tier!r} holds its full share of the queue ({tier_limit} items)")
        if self.max_per_caller and caller:
            held = sum(1 for item in self._items if item.caller == caller)
            if held + count > self.max_per_caller:
                mine = sum(item.cost_s for item in self._items if item.caller == caller)
                raise QueueFull(mine, f"you have {held} pieces of text waiting; at most {self.max_per_caller} "
                                f"may wait at once", ErrorCode.CALLER_QUEUE_FULL)

    # --- the engine thread's side -------------------------------------------------------------------

    def wait_until(self, moment: float) -> None:
        """Block until something is put (or closed, or woken), or the clock reaches `moment`."""
        with self._changed:
            if not self._closed and not self._woken:
                self.clock.wait_until(self._changed, moment)
            self._woken = False

    def wait_for_items(self) -> None:
        """Block until something is put, or the queue is closed or woken."""
        with self._changed:
            while not self._items and not self._closed and not self._woken:
                self._changed.wait()
            self._woken = False

    def wake(self) -> None:
        """End the engine thread's present or next wait (it has work that is not a queued item)."""
        with self._changed:
            self._woken = True
            self._changed.notify_all()

    def next_candidates(self, limit: int) -> list[QueuedItem]:
        """The most urgent item and up to limit-1 more of its batch key, most urgent first.

        Items whose caller has gone (future cancelled) are dropped here unsynthesized, and items
        past their deadline are failed with DeadlineExceeded.
        """
        with self._changed:
            dropped = self._drop_dead()
            live = self._items = self._in_order()
            candidates = [item for item in live if item.key == live[0].key][:limit] if live else []
        self._tell_dropped(*dropped)
        return candidates

    def _drop_dead(self) -> tuple[int, int]:
        """Drop the items whose caller has gone, and fail those past their deadline (with the lock held); returns
        how many of each."""
        now = self.clock.now()
        live: list[QueuedItem] = []
        cancelled = expired = 0
        for item in self._items:
            if item.future.cancelled():
                cancelled += 1
            elif now > item.deadline:
                if item.claim():  # (a cancel landing now cannot make its answer fail)
                    expired += 1
                    item.resolve(DeadlineExceeded(
                        f"request timed out: waited {now - item.enqueued_at:.1f} s in the queue, past its deadline"))
                else:
                    cancelled += 1
            else:
                live.append(item)
        self._items = live
        return cancelled, expired

    def _tell_dropped(self, cancelled: int, expired: int) -> None:
        for reason, count in (("cancelled", cancelled), ("deadline", expired)):
            if count:
                self.on_drop(reason, count)

    def _watch_deadlines(self) -> None:
        """Start the deadline watcher (with the lock held, once items are queued) if an item has a deadline and
        none runs."""
        if not self._watching and not self._closed and any(item.deadline < math.inf for item in self._items):
            self._watching = True
            threading.Thread(target=self._expire_on_time, name="queue-deadlines", daemon=True).start()

    def _expire_on_time(self) -> None:
        """The deadline watcher: a queued item fails with DeadlineExceeded (a 504) as soon as its deadline has
        passed, not when the engine's thread next looks at the queue, which a long batch or a step that waits on
        its codec can put off for minutes (issue 44). It ends once no queued item has a deadline."""
        while True:
            with self._changed:
                soonest = min((item.deadline for item in self._items), default=math.inf)
                if self._closed or soonest == math.inf:
                    self._watching = False
                    return
                if self.clock.now() <= soonest:  # an item is expired once the clock is past its deadline
                    self.clock.wait_until(self._changed, math.nextafter(soonest, math.inf))
                    continue
                dropped = self._drop_dead()
            self._tell_dropped(*dropped)

    def refuse(self, matches: Callable[[QueuedItem], bool], error: Callable[[], BaseException]) -> int:
        """Fail the queued items that `matches` now, each with its own `error()` (the running ones are not here):
        how many."""
        with self._changed:  # (answered with the lock held, as _drop_dead answers: a candidate taken is then done)
            refused = {id(item): item for item in self._items if matches(item)}
            self._items = [item for item in self._items if id(item) not in refused]
            for item in refused.values():
                if item.claim():
                    item.resolve(error())
            self._changed.notify_all()
        return len(refused)

    def take(self, items: Iterable[QueuedItem], predicted_s: float) -> None:
        """Items leave the queue to run (for about predicted_s seconds); `done` when they have. (One may have
        expired since it was a candidate: its future is done, and it runs for nobody.)"""
        taken = {id(item): item for item in items}
        with self._changed:
            self._items = [item for item in self._items if id(item) not in taken]
            now = self.clock.now()
            for item in taken.values():  # a caller's next item ranks after this one's virtual end
                if item.caller:
                    self._taken_end[(item.caller, item.priority)] = item.rank + item.cost_s
            if len(self._taken_end) > 4 * self.max_size:  # ends in the past no longer hold anyone back
                self._taken_end = {chain: end for chain, end in self._taken_end.items() if end > now}
            self._running += len(taken)
            self._running_until = self.clock.now() + predicted_s

    def expect_free_in(self, seconds: float, joining_now: int = 0) -> None:
        """A stepped engine's loop says when its next place frees up (its items stay running across steps),
        and how many queued items would join at its next step."""
        with self._changed:
            self._running_until = self.clock.now() + seconds
            self._joining_now = joining_now

    def put_back(self, item: QueuedItem) -> None:
        """A taken item that could not run (its engine ran out of memory) goes back where it was ranked."""
        with self._changed:
            self._running -= 1
            self._items.append(item)
            self._watch_deadlines()
            self._changed.notify_all()

    def done(self, count: int) -> None:
        with self._changed:
            self._running -= count
            if not self._running:
                self._running_until = 0.0
            self._changed.notify_all()

    def close_if_idle(self) -> bool:
        """Close the queue if nothing is queued or running (so its model can be unloaded); in the same
        lock that puts take, so no item can slip in between the check and the close."""
        with self._changed:
            if self._closed or self.busy:
                return self._closed
            self._closed = True
            self._changed.notify_all()
            return True

    def close(self) -> list[QueuedItem]:
        """Close for good; returns the items still queued (the caller must end them)."""
        with self._changed:
            self._closed = True
            left, self._items = self._items, []
            self._changed.notify_all()
            return left
