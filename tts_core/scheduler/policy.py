"""Batch sizing: which of the queued items to run next, and when.

The policies are pure: they see the queued items of one batch key (most urgent first) and the
time, and answer with a `BatchPlan`. They never touch the engine; the batcher feeds each executed
batch's timing back through `observe`, which only the adaptive policy uses.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Schedulable(Protocol):
    length: int
    deadline: float
    enqueued_at: float


@dataclass(frozen=True)
class BatchPlan:
    take: tuple[int, ...]  # indices into the queued items, in batch order; empty when waiting
    wait_s: float = 0.0  # when nothing is taken: re-plan after this long (or on a new arrival)


def padded_tokens(items: Sequence[Schedulable]) -> int:
    return len(items) * max(item.length for item in items)


def _within_budget(items: Sequence[Schedulable], max_tokens: int) -> int:
    """How many leading items fit the padded-token budget (always at least one)."""
    longest = 0
    for count, item in enumerate(items, start=1):
        longest = max(longest, item.length)
        if count > 1 and count * longest > max_tokens:
            return count - 1
    return len(items)


class CostModel:
    """t = a + b*batch_size + c*padded_tokens, fitted by non-negative least squares.

    Calibration rows are kept for good (they span batch sizes, so the fit stays well posed);
    online rows live in a sliding window so the model follows the machine as it warms or loads.
    """

    def __init__(self, window: int = 64):
        self._seed: list[tuple[float, float, float]] = []
        self._recent: deque[tuple[float, float, float]] = deque(maxlen=window)
        self.coefficients = np.zeros(3)

    @property
    def fitted(self) -> bool:
        return len(self._seed) + len(self._recent) >= 3

    def add(self, batch_size: int, padded: int, seconds: float, calibration: bool = False) -> None:
        row = (float(batch_size), float(padded), float(seconds))
        (self._seed.append if calibration else self._recent.append)(row)
        if self.fitted:
            self.coefficients = self._fit()

    def reseed(self, rows: Sequence[tuple[float, float, float]]) -> None:
        """Replace the calibration rows (a sweep measured again, or one kept from an earlier start)."""
        self._seed = [(float(size), float(padded), float(seconds)) for size, padded, seconds in rows]
        if self.fitted:
            self.coefficients = self._fit()

    def observations(self) -> list[dict]:
        """The batches the model is fitted on (calibration rows, then the recent window): at most
        the sweep's points plus `window`. Another thread may read them: under the GIL, copying a list
        or a deque is one C call that the engine thread's appends cannot interleave with."""
        rows = [(row, True) for row in list(self._seed)] + [(row, False) for row in list(self._recent)]
        return [{"size": int(size), "padded_tokens": int(padded), "seconds": seconds, "calibration": calibration}
                for (size, padded, seconds), calibration in rows]

    def predict(self, batch_size: int, padded: int) -> float:
        a, b, c = self.coefficients
        return a + b * batch_size + c * padded

    def _fit(self) -> np.ndarray:
        rows = np.array(self._seed + list(self._recent))
        return nonnegative_fit(np.column_stack([np.ones(len(rows)), rows[:, 0], rows[:, 1]]), rows[:, 2])


def nonnegative_fit(design: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a few unknowns: the optimum is the unconstrained fit on
    some subset of the columns whose coefficients are all non-negative."""
    unknowns = design.shape[1]
    best, best_residual = np.zeros(unknowns), np.inf
    for size in range(unknowns, 0, -1):
        for columns in itertools.combinations(range(unknowns), size):
            solution, *_ = np.linalg.lstsq(design[:, columns], seconds, rcond=None)
            if (solution < 0).any():
                continue
            residual = float(np.sum((design[:, columns] @ solution - seconds) ** 2))
            if residual < best_residual:
                best_residual = residual
                best = np.zeros(unknowns)
                best[list(columns)] = solution
    return best


class ItemCost:
    """Engine seconds an item takes as batches run now: batch seconds ~ per_item * items + per_token *
    real tokens, fitted (non-negative) over the recent batches. It is what the queue's wait
    predictions add up; with batches that pay, both terms shrink with the batch sizes in use."""

    def __init__(self, window: int = 64):
        self._rows: deque[tuple[float, float, float]] = deque(maxlen=window)
        self.per_item, self.per_token = 0.0, 0.0

    def add(self, items: int, real_tokens: int, seconds: float) -> None:
        self._rows.append((float(items), float(real_tokens), float(seconds)))
        rows = np.array(self._rows)
        self.per_item, self.per_token = (float(value) for value in nonnegative_fit(rows[:, :2], rows[:, 2]))

    def predict(self, tokens: int) -> float:
        return self.per_item + self.per_token * tokens


class BatchPolicy:
    """Base: take the most urgent item alone. Subclasses differ only in `plan`."""

    name = "sequential"
    learns = False
    cost_model: CostModel | None = None  # the fitted model a learning policy sizes batches by

    def __init__(self, max_batch_size: int = 1, max_batch_tokens: int = 1 << 30):
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.copies = 1  # copies of the engine's model a batch is split between (set once they are chosen)

    def plan(self, queued: Sequence[Schedulable], now: float, memory_tokens: int | None = None) -> BatchPlan:
        """memory_tokens: the device memory's padded-token budget now (None: no limit but ours)."""
        return BatchPlan(take=(0,))

    def token_budget(self, memory_tokens: int | None) -> int:
        """The smaller of the configured budget and the memory's answer."""
        return self.max_batch_tokens if memory_tokens is None else min(self.max_batch_tokens, memory_tokens)

    def observe(self, batch_size: int, padded: int, seconds: float, calibration: bool = False,
                real_tokens: int | None = None) -> None:
        pass

    def calibrate(self, rows: Sequence[tuple[int, int, float]]) -> None:
        """The calibration sweep's batches (size, padded tokens, the faster run's seconds), replacing any before."""

    def describe(self) -> dict:
        return {"name": self.name, "max_batch_size": self.max_batch_size, "max_batch_tokens": self.max_batch_tokens}


class TimeoutPolicy(BatchPolicy):
    """The classic peer: wait until the batch is full or the oldest item has waited max_wait_s."""

    def __init__(self, name: str, max_batch_size: int, max_wait_s: float, max_batch_tokens: int):
        super().__init__(max_batch_size, max_batch_tokens)
        self.name = name
        self.max_wait_s = max_wait_s

    def plan(self, queued: Sequence[Schedulable], now: float, memory_tokens: int | None = None) -> BatchPlan:
        oldest = min(item.enqueued_at for item in queued)
        waited = now - oldest
        if len(queued) < self.max_batch_size and waited < self.max_wait_s:
            return BatchPlan(take=(), wait_s=self.max_wait_s - waited)
        count = _within_budget(queued[: self.max_batch_size], self.token_budget(memory_tokens))
        return BatchPlan(take=tuple(range(count)))


SOLO_AFTER_MISS = 200


class AdaptivePolicy(BatchPolicy):
    """Pick the batch that maximises predicted real tokens per second, deadlines permitting.

    Candidates are the most urgent item plus the queued items closest to it in length (a length
    bucket formed on the fly). A batch is only a candidate when it is predicted to beat running
    its own items one after the other by `min_gain`; so when batching does not pay (per-item cost
    linear in batch size, or padding eats the gain) the answer is size 1: never slower than
    sequential by the model's own account.

    The model can be wrong (a calibration sweep timed while other processes took the cores once
    made batches of 16 look cheap on a CPU where they cost more than their items run alone, and a deep
    queue then cut the server's throughput). So each executed batch is checked against its own
    items' predicted time alone, which the many single-item runs keep accurate: a batch that did
    not pay sends the next SOLO_AFTER_MISS dispatches alone while the model takes the new timing in.
    """

    name = "adaptive"
    learns = True

    def __init__(self, max_batch_size: int, max_batch_tokens: int, min_gain: float = 0.10,
                 cost_model: CostModel | None = None):
        super().__init__(max_batch_size, max_batch_tokens)
        self.min_gain = min_gain
        self.cost_model = cost_model or CostModel()
        self.solo_left = 0  # dispatches still to run alone after a batch that did not pay

    def observe(self, batch_size: int, padded: int, seconds: float, calibration: bool = False,
                real_tokens: int | None = None) -> None:
        if not calibration and batch_size > 1 and real_tokens is not None and self.cost_model.fitted:
            fixed, per_item, per_token = self.cost_model.coefficients
            alone = batch_size * (fixed + per_item) + per_token * real_tokens  # its items, one by one
            if seconds * (1 + self.min_gain) > alone:
                self.solo_left = SOLO_AFTER_MISS
        self.cost_model.add(*self._per_copy(batch_size, padded), seconds, calibration)

    def calibrate(self, rows: Sequence[tuple[int, int, float]]) -> None:
        self.cost_model.reseed([(*self._per_copy(size, padded), seconds) for size, padded, seconds in rows])

    def _per_copy(self, batch_size: int, padded: int) -> tuple[int, int]:
        """A batch's size and padded tokens as one copy of the model runs them: with copies (the engine's
        instances), its largest part, the parts running at once (tts_core.engines.instances). The cost model is
        one copy's."""
        part = -(-batch_size // self.copies)
        return part, part * (padded // batch_size)

    def describe(self) -> dict:
        fixed, per_item, per_token = self.cost_model.coefficients
        return {**super().describe(), "cost_model": {
            "fixed_s": round(fixed, 6), "per_item_s": round(per_item, 6), "per_padded_token_s": round(per_token, 8)}}

    def plan(self, queued: Sequence[Schedulable], now: float, memory_tokens: int | None = None) -> BatchPlan:
        if self.solo_left:
            self.solo_left -= 1
            return BatchPlan(take=(0,))
        if len(queued) == 1 or not self.cost_model.fitted:
            return BatchPlan(take=(0,))
        head_length = queued[0].length
        order = [0] + sorted(range(1, len(queued)),
                             key=lambda i: (abs(queued[i].length - head_length), i))
        order = order[: self.max_batch_size]
        best_size, best_rate, budget = 1, 0.0, self.token_budget(memory_tokens)
        longest, real, one_by_one, earliest_deadline = 0, 0, 0.0, float("inf")
        for size, index in enumerate(order, start=1):
            item = queued[index]
            longest = max(longest, item.length)
            real += item.length
            one_by_one += self.cost_model.predict(1, item.length)
            earliest_deadline = min(earliest_deadline, item.deadline)
            padded = size * longest
            if size > 1 and padded > budget:
                break
            seconds = max(self.cost_model.predict(*self._per_copy(size, padded)), 1e-6)
            if size > 1 and now + seconds > earliest_deadline:
                break
            pays = size == 1 or one_by_one >= seconds * (1 + self.min_gain)
            if pays and real / seconds > best_rate:
                best_size, best_rate = size, real / seconds
        return BatchPlan(take=tuple(order[:best_size]))


# TTS_BATCH_POLICY: ours (adaptive) and the peers it is measured against; (max_batch_size, max_batch_tokens) -> policy
POLICIES: dict[str, Callable[[int, int], BatchPolicy]] = {
    "adaptive": AdaptivePolicy,
    "sequential": lambda size, tokens: BatchPolicy(1, tokens),
    "static": lambda size, tokens: TimeoutPolicy("static", min(8, size), 0.5, tokens),
    "window": lambda size, tokens: TimeoutPolicy("window", min(16, size), 0.010, tokens),
}


def make_policy(name: str, max_batch_size: int, max_batch_tokens: int) -> BatchPolicy:
    if name not in POLICIES:
        raise ValueError(f"unknown batch policy {name!r}; one of {', '.join(POLICIES)}")
    return POLICIES[name](max_batch_size, max_batch_tokens)
