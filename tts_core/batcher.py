"""The engine loop: one thread owns each engine, takes batches from its queue, resolves futures.

No timer runs while the engine is idle: the first item is dispatched at once, and what arrives
while a batch runs is there to batch at the next dispatch (the busy time is the window).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence

import numpy as np

from .engines.base import Engine
from .errors import SynthesisError
from .memory import MemoryBudget
from .metrics import BatchRecord, Metrics
from .policy import BatchPolicy, padded_tokens
from .queue import RequestQueue
from .request import SynthesisRequest

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
        self._in_flight = False
        self.policy = policy
        self.queue = queue
        self.metrics = metrics
        self.calibration_sizes = [s for s in calibration_sizes if 1 <= s <= policy.max_batch_size]
        self.ready = threading.Event()
        self._candidate_limit = 2 * policy.max_batch_size
        self._item_seconds = 0.1  # moving estimate of engine time per item, for Retry-After
        self.audio_s_per_token = 0.0  # moving estimate of audio produced per input token (at speed 1)
        self._thread = threading.Thread(target=self._run, name=f"batcher-{engine.name}", daemon=True)

    # --- the caller's side -------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.queue.close()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, items: Sequence[SynthesisRequest], tier_limit: int | None = None) -> None:
        """Queue items (all or none); raises QueueFull with a Retry-After estimate."""
        self.queue.put_many(items, retry_after_s=self.retry_after_s(), tier_limit=tier_limit)

    @property
    def busy(self) -> bool:
        """Work is queued or running."""
        return self._in_flight or len(self.queue) > 0

    def retry_after_s(self) -> int:
        return max(1, math.ceil(len(self.queue) * self._item_seconds))

    # --- the engine thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.warm_up()
        except Exception:
            log.exception("warm-up of %s failed; serving without calibration", self.engine.name)
        finally:
            self.ready.set()
        while not self.queue.closed:
            try:
                self.step()
            except Exception:  # the loop must outlive any bug in one dispatch
                log.exception("batcher %s: dispatch failed", self.engine.name)

    def warm_up(self) -> None:
        """One untimed run, then (for a learning policy) the calibration sweep."""
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

        timed(1, CALIBRATION_LENGTHS[0])
        self.engine.measure_memory(tokens[: CALIBRATION_LENGTHS[-1]])
        if not self.policy.learns:
            return
        for length in CALIBRATION_LENGTHS:
            for size in self.calibration_sizes:
                seconds = timed(size, length)
                self.policy.observe(size, size * length, seconds, calibration=True)
        log.info("%s calibrated: %s", self.engine.name, self.policy.describe())

    def step(self) -> None:
        """One dispatch: plan a batch from the queue and run it (or wait, as the policy says)."""
        candidates = self.queue.next_candidates(self._candidate_limit)
        self.metrics.queue_length.labels(self.engine.name).set(len(self.queue))
        if not candidates:
            self.queue.wait_for_items()
            return
        plan = self.policy.plan(candidates, time.monotonic(), self.memory.tokens())
        if not plan.take:
            self.queue.wait(plan.wait_s)
            return
        batch = [candidates[index] for index in plan.take]
        self.queue.remove(batch)
        live = [item for item in batch if item.future.set_running_or_notify_cancel()]
        self.metrics.dropped.labels("cancelled").inc(len(batch) - len(live))
        if live:
            self._in_flight = True
            try:
                self._execute(live)
            finally:
                self._in_flight = False

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
            self.policy.observe(len(batch), padded, seconds)
            self._item_seconds = 0.8 * self._item_seconds + 0.2 * seconds / len(batch)
            record = BatchRecord(time.monotonic(), name, len(batch), padded,
                                 sum(item.length for item in batch), seconds, self.policy.max_batch_size)
            for item, wait in zip(batch, waits):
                item.queue_s, item.batch_s, item.batch_size = wait, seconds, len(batch)
            return outputs
        finally:
            self.metrics.batch_finished(name, record, waits)
