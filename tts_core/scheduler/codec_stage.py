"""The codec as a stage of its own: what a stepped engine's frames become (audio decoded, pieces handed out,
requests delivered) runs on a codec thread beside the engine's steps, in the order the engine's thread
handed it over.

Why: Pocket TTS's codec costs about as much per frame as a step and does not batch on a CPU, and a step
leaves the cores idle between its bursts; decoding on the engine's thread adds the two, a stage of its own
overlaps them (vLLM-Omni runs the language model and the codec as separate stages). Measured in
docs/batching.md#the-codec-as-a-stage.

The rules:
- a request's pieces and its end run in the order they were handed over, so its audio joins seamlessly and
  its caller hears the end after the last piece; a stream's first piece goes ahead of everyone else's
  waiting pieces (nothing of its own is before it), so a stream that starts while others run is heard soon;
- the engine's thread waits while `max_waiting` jobs are waiting: the steps never run further ahead of the
  codec than that, and admission's predicted wait (the slower stage's, tts_core.scheduler.step_policy)
  stays true;
- `close` runs what is waiting, then ends the thread: no accepted request is lost.

Inline (`threaded=False`), each job runs at once on the caller's thread: an engine whose `decode` only hands
out audio its steps made, a whole batch run on one thread (`synthesize_whole`: warm-up, the benchmark's
ceiling and peers), and tests on a fake clock.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Callable

from .clock import Clock
from .faults import Faults

BUSY_WINDOW_S = 10.0  # the busy share is over this much of the recent past


class BusyMeter:
    """The share of the last BUSY_WINDOW_S seconds a stage spent working (written by one thread, read by any)."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self._spans: deque[tuple[float, float]] = deque()  # (ended at, seconds)
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        now = self.clock.timer()
        with self._lock:
            self._spans.append((now, seconds))
            while self._spans and self._spans[0][0] < now - BUSY_WINDOW_S:
                self._spans.popleft()

    def share(self) -> float:
        since = self.clock.timer() - BUSY_WINDOW_S
        with self._lock:
            busy = sum(seconds for ended, seconds in self._spans if ended >= since)
        return round(min(1.0, busy / BUSY_WINDOW_S), 3)


class CodecStage:
    def __init__(self, name: str, clock: Clock, threaded: bool, max_waiting: int):
        self.threaded, self.max_waiting = threaded, max_waiting
        self.busy = BusyMeter(clock)
        self.faults = Faults(name, "a codec job")  # jobs that raised (a bug: each job ends its request itself)
        self.clock = clock
        self._jobs: list[tuple[int, int, Callable[[], None]]] = []  # a heap: (0 for a first piece else 1, order, job)
        self._order = itertools.count()
        self._working = False
        self._closed = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"codec-{name}", daemon=True) if threaded else None
        if self._thread:
            self._thread.start()

    def submit(self, job: Callable[[], None], first: bool = False) -> None:
        """Run job after those handed over before it (a first piece: before every waiting one that is not).
        Blocks while max_waiting jobs wait."""
        if not self.threaded:
            self._timed(job)
            return
        with self._changed:
            while len(self._jobs) >= self.max_waiting and not self._closed:
                self._changed.wait()
            heapq.heappush(self._jobs, (0 if first else 1, next(self._order), job))
            self._changed.notify_all()

    def waiting(self) -> int:
        return len(self._jobs)

    def idle(self) -> bool:
        """Nothing waiting or running."""
        with self._changed:
            return not self._jobs and not self._working

    def close(self) -> None:
        """Run what is waiting, then end the thread (from the engine's thread, as its loop ends)."""
        if not self._thread:
            return
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._working = False
                self._changed.notify_all()
                while not self._jobs and not self._closed:
                    self._changed.wait()
                if not self._jobs:
                    return
                job = heapq.heappop(self._jobs)[2]
                self._working = True
                self._changed.notify_all()
            try:
                self._timed(job)
            except Exception as error:  # the stage must outlive any bug in one job
                self.faults.failed(error)

    def _timed(self, job: Callable[[], None]) -> None:
        started = self.clock.timer()
        try:
            job()
        finally:
            self.busy.add(self.clock.timer() - started)
