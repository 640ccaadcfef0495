"""The time the queue and the engine loop run on: the system's, or a simulated one that moves only when told.

Everything that plans, times work or waits for a deadline in the scheduler reads one `Clock`: `now()` for
moments (arrivals, deadlines, plans), `timer()` for measured durations (batch and step times, which the cost
models learn from), `sleep` to let time pass, and `wait_until` for a thread that waits on a condition for
news or for a moment, whichever comes first.

`SystemClock` is the real one, the default everywhere. `FakeClock` is simulated time: it moves only when a
thread sleeps on it (a fake engine spending its cost, a test letting a policy's wait pass, a replay stepping
to its next arrival), and a waiter whose moment that passes is woken at once. So a queue and its loop run
on it as they would on the system's, with no real time spent waiting.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds: arrivals, deadlines and plans are moments on it."""

    def timer(self) -> float:
        """Seconds for measuring a duration (the difference of two readings)."""

    def sleep(self, seconds: float) -> None:
        """Let `seconds` pass."""

    def wait_until(self, condition: threading.Condition, moment: float) -> None:
        """Wait on `condition` (held by the caller) until it is notified or `moment` (math.inf: none) comes."""


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def timer(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait_until(self, condition: threading.Condition, moment: float) -> None:
        condition.wait(None if moment == math.inf else max(0.0, moment - self.now()))


SYSTEM_CLOCK = SystemClock()


class FakeClock:
    """Simulated time: it starts at `start` and moves only by `sleep` (from any thread) or `advance_to`."""

    def __init__(self, start: float = 1000.0):
        self._now = start
        self._lock = threading.Lock()
        self._waiters: list[tuple[threading.Condition, float]] = []

    def now(self) -> float:
        with self._lock:
            return self._now

    timer = now  # a duration is the simulated time that passed

    def sleep(self, seconds: float) -> None:
        """Sleeps add up (simulated work runs one piece at a time, whichever thread spends it)."""
        self._move(lambda now: now + max(0.0, seconds))

    def advance_to(self, moment: float) -> None:
        """Move to `moment` (never back)."""
        self._move(lambda now: max(now, moment))

    def _move(self, to: Callable[[float], float]) -> None:
        """Set the time, then wake every waiter whose moment has come."""
        with self._lock:
            self._now = to(self._now)
            due = [condition for condition, until in self._waiters if until <= self._now]
        for condition in due:  # outside our lock: a waiter takes its condition's lock before ours
            with condition:
                condition.notify_all()

    def wait_until(self, condition: threading.Condition, moment: float) -> None:
        waiter = (condition, moment)
        with self._lock:
            if self._now >= moment:
                return
            self._waiters.append(waiter)
        try:
            condition.wait()  # the caller holds condition, so an advance cannot notify before this waits
        finally:
            with self._lock:
                self._waiters.remove(waiter)
