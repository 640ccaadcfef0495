"""The engine loop: one thread owns each engine, takes batches from its queue, resolves futures.

No timer runs while the engine is idle: the first item is dispatched at once, and what arrives
while a batch runs is there to batch at the next dispatch (the busy time is the window).

Other work on the engine (encoding a voice clip, adding or removing a voice) is handed to the same
thread with `run_on_engine`, and runs at the top of a loop turn: never beside a batch or a step.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import numpy as np

from .engines.base import Engine
from .errors import Overloaded, SynthesisError
from .memory import MemoryBudget, release_heap
from .metrics import BatchRecord, Metrics
from .policy import BatchPolicy, ItemCost, padded_tokens
from .queue import QueueClosed, RequestQueue, WaitTarget
from .request import SynthesisRequest

T = TypeVar("T")
log = logging.getLogger(__name__)

CALIBRATION_TEXT = (
    "The calibration sweep measures how long this engine takes for batches of several sizes, "
    "at a short and at a long length, so that the batch policy starts from real timings. "
    "Every executed batch after it refines the same cost model while the server runs."
)
CALIBRATION_LENGTHS = (24, 96)  # tokens


class Batcher:
    def __init__(self, engine: Engine, policy: BatchPolicy, queue: RequestQueue, metrics: Metrics,
                 calibration_sizes: Sequence[int] = (1, 2, 4, 8, 16), min_free_memory_mb: int = 2048,
                 empty_cache_every: int = 100):
        self.engine = engine
        self.memory = MemoryBudget(engine, min_free_memory_mb * 2**20)
        self.empty_cache_every = empty_cache_every  # batches between handing cached device memory back
        self._batches_run = 0
        self._worked = False  # batches ran since memory was last released
        self.policy = policy
        self.queue = queue
        self.metrics = metrics
        self.calibration_sizes = [s for s in calibration_sizes if 1 <= s <= policy.max_batch_size]
        self.ready = threading.Event()  # serving: warmed up, the wait predictions seeded
        self.calibrated = threading.Event()  # the calibration sweep has run (between requests, once ready)
        self._candidate_limit = 2 * policy.max_batch_size
        self.item_cost = ItemCost()  # engine time per item as batches run now, for the queue's predictions
        self.audio_s_per_token = 0.0  # moving estimate of audio produced per input token (at speed 1)
        self.precision = "full"  # degrade mode's lower_precision action sets "low" (a new batcher starts full)
        self._errands: deque[tuple[Callable[[], Any], Future]] = deque()  # run_on_engine's calls, in order
        self._errands_lock = threading.Lock()
        self._errands_closed = False  # the loop has ended: nothing would run a new errand
        self._thread = threading.Thread(target=self._run, name=f"batcher-{engine.name}", daemon=True)

    # --- the caller's side -------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving; whatever is still queued fails with a clear error (nothing is left waiting)."""
        left = self.queue.close()
        for item in left:
            if item.future.set_running_or_notify_cancel():
                item.future.set_exception(Overloaded(f"model {self.engine.name} was stopped before this "
                                                     "was synthesized; retry", 1, "model_stopped"))
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if not self._thread.is_alive():  # its loop has ended (its errands ran), or it never started
            self._fail_errands()

    def submit(self, items: Sequence[SynthesisRequest], tier_limit: int | None = None,
               target: WaitTarget = WaitTarget()) -> float:
        """Queue items (all or none) with their predicted cost; returns the first one's predicted
        wait. Raises QueueFull (with a Retry-After from the prediction), or QueueClosed once the
        model has been unloaded."""
        for item in items:
            item.cost_s = self.item_cost_s(item.length)
        return self.queue.put_many(items, tier_limit, target)

    def item_cost_s(self, tokens: int) -> float:
        """Predicted engine time of an item of this length, as batches run now."""
        return self.item_cost.predict(tokens)

    @property
    def busy(self) -> bool:
        """Work is queued or running."""
        return self.queue.busy

    def run_on_engine(self, call: Callable[[], T]) -> Future[T]:
        """Run call on the engine's thread between two dispatches (never beside a batch or a step),
        waking the loop if it is idle; its result or exception comes back on the Future. Raises
        QueueClosed once the loop has ended (the model was unloaded: ask the pool again)."""
        future: Future[T] = Future()
        with self._errands_lock:
            if self._errands_closed:
                raise QueueClosed()
            self._errands.append((call, future))
        self.queue.wake()
        return future

    # --- the engine thread ---------------------------------------------------------------------

    def _run(self) -> None:
        sweep: deque[Callable[[], None]] = deque()
        try:
            sweep.extend(self.warm_up())
        except Exception:
            log.exception("warm-up of %s failed; serving without calibration", self.engine.name)
        finally:
            self._worked = True  # the calibration sweep's memory goes back at the first idle moment
            self.ready.set()
        while not self.queue.closed:
            try:
                self._run_errands()
                if sweep and self._idle():  # one point of the sweep, then the queue is looked at again
                    self._calibrate_next(sweep)
                    continue
                if not sweep:
                    self._calibrated()
                self.step()
            except Exception:  # the loop must outlive any bug in one dispatch
                log.exception("batcher %s: dispatch failed", self.engine.name)
        with self._errands_lock:
            self._errands_closed = True
        self._run_errands()  # those handed over before the end still run: the engine is still here
        self._stopped()

    def _fail_errands(self) -> None:
        with self._errands_lock:
            self._errands_closed = True
            errands, self._errands = self._errands, deque()
        for _, future in errands:
            if future.set_running_or_notify_cancel():
                future.set_exception(Overloaded(f"model {self.engine.name} was stopped first; retry", 1,
                                                "model_stopped"))

    def _run_errands(self) -> None:
        """The calls handed over so far (not those they hand over: a dispatch comes between)."""
        with self._errands_lock:
            errands, self._errands = self._errands, deque()
        for call, future in errands:
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except Exception as error:  # the caller's to handle, on its Future
                future.set_exception(error)

    def _calibrate_next(self, sweep: deque[Callable[[], None]]) -> None:
        try:
            sweep.popleft()()
        except Exception:
            sweep.clear()
            log.exception("calibration of %s failed; serving with what it measured", self.engine.name)
        if not sweep:
            self._calibrated()

    def _calibrated(self) -> None:
        if not self.calibrated.is_set():
            self.calibrated.set()
            log.info("%s is calibrated: %s", self.engine.name, json.dumps(self.policy.describe(), default=float))

    def _idle(self) -> bool:
        """Nothing queued (or running): a calibration point may use the engine."""
        return not len(self.queue)

    def _stopped(self) -> None:
        """The queue has closed and the loop ends: whatever is still running ends too (stepped engines)."""

    def warm_up(self) -> list[Callable[[], None]]:
        """One untimed run and the wait predictions' seed; returns the calibration sweep (for a learning
        policy), whose points run one at a time while nothing is queued, so the server serves at once."""
        voice = self.engine.voices()[0].name
        tokens = np.concatenate(self.engine.tokenize(CALIBRATION_TEXT, voice))
        key = self.engine.batch_key(voice, 1.0)

        def timed(size: int, length: int) -> float:
            items = [SynthesisRequest(tokens=tokens[:length], voice=voice, speed=1.0, key=key,
                                      deadline=math.inf) for _ in range(size)]
            started = time.perf_counter()
            outputs = self.engine.synthesize(items)
            seconds = time.perf_counter() - started
            self._learn_audio_rate(items, outputs)
            return seconds

        timed(1, CALIBRATION_LENGTHS[0])  # cold: first runs set up kernels and caches
        for length in CALIBRATION_LENGTHS:  # seed the wait predictions
            self.item_cost.add(1, length, timed(1, length))
        self.engine.measure_memory(tokens[: CALIBRATION_LENGTHS[-1]])

        def point(size: int, length: int) -> Callable[[], None]:
            def measure() -> None:  # the faster of two runs: others' work on the cores only ever adds time
                self.policy.observe(size, size * length, min(timed(size, length), timed(size, length)),
                                    calibration=True)
            return measure

        return [point(size, length) for length in CALIBRATION_LENGTHS for size in self.calibration_sizes
                ] if self.policy.learns else []

    def step(self) -> None:
        """One dispatch: plan a batch from the queue and run it (or wait, as the policy says)."""
        candidates = self.queue.next_candidates(self._candidate_limit)
        self.metrics.queue_length.labels(self.engine.name).set(len(self.queue))
        if not candidates:
            self._release_memory_once_idle()
            self.queue.wait_for_items()
            return
        plan = self.policy.plan(candidates, time.monotonic(), self.memory.tokens())
        if not plan.take:
            self.queue.wait(plan.wait_s)
            return
        batch = [candidates[index] for index in plan.take]
        self.queue.take(batch, sum(item.cost_s for item in batch))
        try:
            live = [item for item in batch if item.future.set_running_or_notify_cancel()]
            self.metrics.dropped.labels("cancelled").inc(len(batch) - len(live))
            if live:
                self._worked = True
                self._execute(live)
        finally:
            self.queue.done(len(batch))

    def _release_memory_once_idle(self) -> None:
        """Work stopped: hand back what it used (the engine's caches and arenas, the heap's free pages),
        or a burst of long texts keeps its memory for good. Once per busy spell, on the engine's thread."""
        if self._worked:
            self._worked = False
            try:
                self.engine.release_memory()
            except Exception:
                log.exception("%s: releasing memory failed", self.engine.name)
            release_heap()

    def _execute(self, batch: list[SynthesisRequest], retried_alone: bool = False) -> None:
        try:
            outputs = self._run_batch(batch)
        except self.engine.out_of_memory_errors:
            self._out_of_memory(batch, retried_alone)
            return
        except Exception as error:
            if len(batch) == 1:
                self._fail(batch[0], f"synthesis failed: {error}")
                return
            # One bad item must fail alone: retry every item by itself.
            self.metrics.batch_retries.labels(self.engine.name).inc()
            for item in batch:
                self._execute([item])
            return
        self.memory.succeeded()
        self._batches_run += 1
        if self.empty_cache_every and self._batches_run % self.empty_cache_every == 0:
            self.engine.release_memory()
        self._learn_audio_rate(batch, outputs)
        for item, audio in zip(batch, outputs):
            item.future.set_result(audio)

    def _out_of_memory(self, batch: list[SynthesisRequest], retried_alone: bool) -> None:
        """Lower the memory budget and run the batch again in halves; an item fails only when it
        does not fit even alone, with the cache released."""
        log.warning("%s ran out of memory on %d items (%d padded tokens)", self.engine.name, len(batch),
                    padded_tokens(batch))
        self.metrics.out_of_memory.labels(self.engine.name).inc()
        self.memory.out_of_memory(padded_tokens(batch))
        self.engine.release_memory()
        if len(batch) > 1:
            half = len(batch) // 2
            self._execute(batch[:half])
            self._execute(batch[half:])
        elif not retried_alone:
            self._execute(batch, retried_alone=True)
        else:
            self._fail(batch[0], "synthesis failed: the item does not fit in device memory even alone")

    def _fail(self, item: SynthesisRequest, message: str) -> None:
        log.warning("%s failed on one item: %s", self.engine.name, message)
        self.metrics.item_errors.labels(self.engine.name).inc()
        item.future.set_exception(SynthesisError(message))

    def _learn_audio_rate(self, batch: list[SynthesisRequest], outputs: list[np.ndarray]) -> None:
        audio_s = sum(audio.size * item.speed for item, audio in zip(batch, outputs)) / self.engine.sample_rate
        rate = audio_s / max(1, sum(item.length for item in batch))
        self.audio_s_per_token = rate if not self.audio_s_per_token else 0.8 * self.audio_s_per_token + 0.2 * rate

    def _run_batch(self, batch: list[SynthesisRequest]) -> list[np.ndarray]:
        name = self.engine.name
        dispatched = time.monotonic()
        waits = [dispatched - item.enqueued_at for item in batch]
        self.metrics.batch_started(name, len(batch))
        record = None
        try:
            started = time.perf_counter()
            outputs = self.engine.synthesize(batch)
            seconds = time.perf_counter() - started
            if len(outputs) != len(batch):
                raise RuntimeError(f"engine returned {len(outputs)} outputs for {len(batch)} items")
            padded = padded_tokens(batch)
            self.policy.observe(len(batch), padded, seconds, real_tokens=sum(item.length for item in batch))
            self.item_cost.add(len(batch), sum(item.length for item in batch), seconds)
            record = BatchRecord(time.monotonic(), name, len(batch), padded,
                                 sum(item.length for item in batch), seconds, self.policy.max_batch_size)
            for item, wait in zip(batch, waits):
                item.queue_s, item.batch_s, item.batch_size = wait, seconds, len(batch)
            return outputs
        finally:
            self.metrics.batch_finished(name, record, waits)
