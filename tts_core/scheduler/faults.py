"""What an engine loop (or its codec stage) does with a failure it did not expect: the requests it concerns end
with a clear error, and the failure is told once, then counted.

A turn that raises is a bug somewhere (the engine, a strategy), and it may repeat at every turn: logged in full
each time, one repeating failure filled a log with 16 MB in minutes (issue 43). So each kind of failure (its
exception type and the line that raised it) is logged with its traceback the first time, then as one line at
its 10th, 100th, 1000th... time; the status page shows the count and the last one. A loop whose turns keep
failing waits a little longer before each next try (BACKOFF_S, doubling), so that it never spins hot.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections import OrderedDict
from dataclasses import dataclass

from ..errors import SynthesisError

log = logging.getLogger(__name__)

KINDS_KEPT = 32  # kinds of failure remembered (each logged in full once)
BACKOFF_S = 0.01  # the wait before a turn that follows two failed turns; doubles with each further one
MOST_BACKOFF_S = 1.0


def turn_failed(model: str, error: BaseException) -> SynthesisError:
    """What a request hears when the turn it ran in failed on something not its own: retryable, and without the
    engine's own text (which can hold tensors)."""
    return SynthesisError(f"synthesis failed: model {model} hit an internal error ({type(error).__name__}) "
                          "while this was running; retry")


@dataclass(frozen=True)
class FaultCounts:
    """A thread's failures as they stand: how many, how many since the last success, the last one."""

    count: int = 0
    in_a_row: int = 0
    last: str | None = None  # as "KeyError: 5"

    def to_json(self, prefix: str) -> dict:
        return {f"{prefix}_failures": self.count, f"{prefix}_failures_in_a_row": self.in_a_row,
                f"last_{prefix}_failure": self.last}


class Faults:
    """The failures of one thread's work (an engine loop's turns, a codec stage's jobs): written by that thread,
    read by any."""

    def __init__(self, name: str, what: str):
        self.name, self.what = name, what  # "tiny-pocket", "a turn"
        self.count = 0  # failures so far
        self.in_a_row = 0  # failures since the last success
        self.last: str | None = None  # the last failure, as "KeyError: 5"
        self._kinds: OrderedDict[tuple, int] = OrderedDict()  # (type, file, line) -> times seen
        self._lock = threading.Lock()

    def failed(self, error: BaseException) -> None:
        """Count a failure; log it in full if its kind is new, else as a line at its 10th, 100th, ... time."""
        where = traceback.extract_tb(error.__traceback__)[-1:] or [None]
        kind = (type(error).__name__, *((where[0].filename, where[0].lineno) if where[0] else ()))
        with self._lock:
            self.count += 1
            self.in_a_row += 1
            self.last = f"{type(error).__name__}: {error}"[:300]
            seen = self._kinds.pop(kind, 0) + 1
            self._kinds[kind] = seen
            while len(self._kinds) > KINDS_KEPT:
                self._kinds.popitem(last=False)
        if seen == 1:
            log.error("%s: %s failed (told once; repeats are counted on the status page)", self.name, self.what,
                      exc_info=error)
        elif _power_of_ten(seen):
            log.error("%s: %s failed again, %d times so far: %s", self.name, self.what, seen, self.last)

    def succeeded(self) -> None:
        if self.in_a_row > 1:
            log.warning("%s: %s succeeds again, after %d failures in a row", self.name, self.what, self.in_a_row)
        self.in_a_row = 0

    def backoff_s(self) -> float:
        """How long to wait before the next try: nothing after one failure, then BACKOFF_S doubling."""
        if self.in_a_row < 2:
            return 0.0
        return min(MOST_BACKOFF_S, BACKOFF_S * 2 ** min(16, self.in_a_row - 2))

    def counts(self) -> FaultCounts:
        with self._lock:
            return FaultCounts(self.count, self.in_a_row, self.last)


def _power_of_ten(count: int) -> bool:
    while count % 10 == 0:
        count //= 10
    return count == 1
