"""The one-shot strategy: a whole batch per engine call (Piper, VITS; and the request-level peers of a
stepped engine, whose `synthesize` runs a batch through to its last member, as one `generate` call does).

Each turn plans a batch from the queue with the batch policy (same batch key, similar length, the size that
pays), synthesizes it and resolves each item's future with its own audio. A failing batch is retried item by
item, so one bad item fails alone; one that runs out of device memory lowers the memory budget and is run
again in halves; one that fails at degrade mode's lower precision is run again at full precision, and lower
precision stays off for that model (tts_core.scheduler.precision).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engines.contract import EngineInput, EngineOutput, OneShot, Stepped, UnsoundAudio, audio_fault
from ..errors import ChorusError, SynthesisError
from ..ops.metrics import BatchRecord
from .engine_loop import CALIBRATION_TEXT, Serving
from .faults import turn_failed
from .policy import BatchPolicy, padded_tokens
from .records import QueuedItem

log = logging.getLogger(__name__)

CALIBRATION_LENGTHS = (24, 96)  # tokens
INSTANCES_MARGIN = 1.1  # more copies of a model are chosen only where they make an item this much faster


@dataclass(frozen=True)
class OneShotStatus:
    """A one-shot model's batch policy (its own description: name, sizes, cost model) and the copies it runs."""

    policy: dict
    instances: int
    instance_item_s: dict[int, float] | None = None  # an item's seconds with each count of copies, where measured

    def to_json(self) -> dict:
        return {"policy": self.policy, "instances": self.instances,
                **({"instance_item_s": self.instance_item_s} if self.instance_item_s else {})}


class OneShotStrategy:
    hands_out_pieces = False
    engine: OneShot | Stepped  # a stepped one with its whole-batch run given (the peers that run by request)

    def __init__(self, serving: Serving, policy: BatchPolicy, calibration_sizes: Sequence[int] = (1, 2, 4, 8, 16),
                 empty_cache_every: int = 100, calibration_lengths: Sequence[int] = CALIBRATION_LENGTHS,
                 instances: int = 1, synthesize: Callable[[list[EngineInput]], list[EngineOutput]] | None = None):
        """synthesize: how a batch runs (the engine's own `synthesize` unless given: a stepped engine's whole batch
        that ends when the loop stops, tts_core.scheduler.strategies)."""
        self.serving, self.policy = serving, policy
        self.engine, self.queue, self.metrics = serving.engine, serving.queue, serving.metrics
        self.whole_batch = synthesize  # a stepped engine's: runs its batches, which neither pipeline nor measure alone
        self.synthesize = synthesize or (lambda batch: self.engine.synthesize(batch))  # (read at each call)
        self.clock = serving.clock
        self.calibration_sizes = [s for s in calibration_sizes if 1 <= s <= policy.max_batch_size]
        self.calibration_lengths = calibration_lengths
        self.empty_cache_every = empty_cache_every  # batches between handing cached device memory back
        self._batches_run = 0
        self._candidate_limit = 2 * policy.max_batch_size
        self.instances = instances  # copies of the engine's model (TTS_ENGINE_INSTANCES); 0: chosen by measurement
        self.measured: list[tuple[int, int, float]] = []  # the sweep's batches: size, padded tokens, seconds
        self.instance_times: dict[int, float] = {}  # copies -> seconds an item took at warm-up, where measured
        self._in_flight: _InFlight | None = None  # a pipelining engine's batch on the device, not yet landed
        self._landed = 0.0  # when the last batch landed (the loop's clock's timer)

    # --- what the loop asks --------------------------------------------------------------------

    def idle(self) -> bool:
        return not len(self.queue) and self._in_flight is None

    def stopped(self) -> None:
        """What was queued the loop has failed already; a batch still in flight lands (its callers get their audio)."""
        if self._in_flight is not None:
            self._land()

    def running_count(self) -> int | None:
        return None

    def status(self) -> OneShotStatus:
        return OneShotStatus(self.policy.describe(), self.engine.instances, dict(self.instance_times) or None)

    def cost_model(self) -> dict:
        model = self.policy.cost_model if self.policy.learns else None
        return {"policy": self.policy.name, "unit": "batch", "max_size": self.policy.max_batch_size, "model": model}

    def warm_up(self) -> list[Callable[[], None]]:
        """One untimed run and the wait predictions' seed; returns the calibration sweep (for a learning
        policy), whose points run one at a time while nothing is queued, so the server serves at once."""
        voice = self.engine.voices()[0].name
        tokens = np.concatenate(self.engine.tokenize(CALIBRATION_TEXT, voice))

        def timed(size: int, length: int) -> float:
            inputs = [EngineInput(tokens[:length], voice) for _ in range(size)]
            started = self.clock.timer()
            outputs = self.synthesize(inputs)
            seconds = self.clock.timer() - started
            self.serving.learn_audio_rate(inputs, outputs)
            return seconds

        timed(1, self.calibration_lengths[0])  # cold: first runs set up kernels and caches
        self._choose_instances(timed)
        for length in self.calibration_lengths:  # seed the wait predictions
            self.serving.item_cost.add(1, length, timed(1, length))
        if self.whole_batch is None:
            self.engine.measure_memory(tokens[: self.calibration_lengths[-1]])
        else:
            self.engine.measure_memory(tokens[: self.calibration_lengths[-1]], self.whole_batch)

        def point(size: int, length: int) -> list[Callable[[], None]]:
            first: list[float] = []

            def run() -> None:  # the faster of two runs: others' work on the cores only ever adds time
                seconds = timed(size, length)
                if first:
                    self.measured.append((size, size * length, min(first[0], seconds)))
                first.append(seconds)
            return [run, run]  # each its own run of the sweep: work that arrives between the two goes first

        self.measured.clear()
        return [run for length in self.calibration_lengths for size in self.calibration_sizes
                for run in point(size, length)] if self.policy.learns else []

    def calibrate(self, rows: Sequence[tuple[int, int, float]]) -> None:
        """The sweep's rows (size, padded tokens, seconds), this start's or kept from an earlier one: the policy's
        cost model is seeded by them."""
        self.policy.calibrate(rows)

    def calibration_settings(self) -> dict:
        """What the sweep's timings depend on besides the machine (tts_core.scheduler.calibration)."""
        policy = {name: value for name, value in self.policy.describe().items() if name != "cost_model"}
        return {"engine": f"{type(self.engine).__module__}.{type(self.engine).__qualname__}",
                "device": str(getattr(self.engine, "device", "cpu")), "precision": self.serving.precision.describe(),
                "policy": policy, "sizes": list(self.calibration_sizes), "lengths": list(self.calibration_lengths),
                "instances": self.engine.instances, "whole_batch": self.whole_batch is not None}

    def _choose_instances(self, timed: Callable[[int, int], float]) -> None:
        """TTS_ENGINE_INSTANCES copies of the model (the most the engine runs, at most), or (0) the count whose
        batch of as many items of the long calibration length takes least time an item (the faster of two runs
        each, after an untimed one), where that beats one copy by INSTANCES_MARGIN."""
        counts = self.engine.instance_counts()
        if self.instances:
            self.engine.use_instances(max(count for count in counts if count <= self.instances))
        elif len(counts) > 1:
            length = self.calibration_lengths[-1]
            for count in counts:
                self.engine.use_instances(count)
                timed(count, length)
                self.instance_times[count] = round(min(timed(count, length), timed(count, length)) / count, 4)
            best = min(self.instance_times, key=self.instance_times.get)
            pays = self.instance_times[best] * INSTANCES_MARGIN < self.instance_times[1]
            self.engine.use_instances(best if pays else 1)
            log.info("%s runs %d copies of its model (seconds an item, by copies: %s)", self.engine.name,
                     self.engine.instances, self.instance_times)
        self.policy.copies = self.engine.instances  # (its cost model is one copy's)

    # --- one turn ----------------------------------------------------------------------------

    def step(self) -> None:
        """One dispatch: plan a batch from the queue and run it (or wait, as the policy says). With nothing to run
        next, the batch still on the device (a pipelining engine's) is delivered first: nothing waits behind a wait."""
        candidates = self.queue.next_candidates(self._candidate_limit)
        self.metrics.queue_length.labels(self.engine.name).set(len(self.queue))
        now = self.clock.now()
        plan = self.policy.plan(candidates, now, self.serving.memory.tokens()) if candidates else None
        if (plan is None or not plan.take) and self._in_flight is not None:
            self._land()
        elif plan is None:
            self.serving.wait_for_work()
        elif not plan.take:
            self.queue.wait_until(now + plan.wait_s)
        else:
            self._dispatch([candidates[index] for index in plan.take])

    def _dispatch(self, batch: list[QueuedItem]) -> None:
        self.queue.take(batch, sum(item.cost_s for item in batch))
        in_flight = 0  # items left on the device: done once landed
        try:
            # (not one that expired in the queue since it was planned: its future is done)
            live = [item for item in batch if item.claim()]
            self.metrics.dropped.labels("cancelled").inc(len(batch) - len(live))
            if live:
                self.serving.worked = True
                if self.whole_batch is not None or not self.engine.pipelines:
                    self._execute(live)
                elif self._launch(live):
                    in_flight = len(live)
        except Exception as error:  # a bug: the batch's callers are told, then the loop counts it
            for item in batch:
                item.resolve(turn_failed(self.engine.name, error))
            raise
        finally:
            self.queue.done(len(batch) - in_flight)

    def _execute(self, batch: list[QueuedItem], retried_alone: bool = False) -> None:
        """Run a batch through and deliver it (the engine's one call), or end its items as _failed says."""
        lowered = self.serving.precision.lowered
        try:
            outputs = self._run_batch(batch)
        except self.engine.out_of_memory_errors:
            self._out_of_memory(batch, retried_alone)
            return
        except Exception as error:
            self._failed(batch, error, lowered, retried_alone)
            return
        self._deliver(batch, outputs, lowered)

    def _failed(self, batch: list[QueuedItem], error: Exception, lowered: bool, retried_alone: bool = False) -> None:
        """A batch that raised: run again at full precision if it ran lower (where the model then stays:
        scheduler/precision.py), else item by item, so that one bad item fails alone."""
        if lowered:
            if self.serving.precision.failure is None:  # (not turned off already, by the batch before it)
                self.serving.precision.failed(error)
            self._execute(batch, retried_alone)
            return
        if len(batch) == 1:  # (a refusal of the engine's own, such as a voice deleted, says why itself)
            answer = error if isinstance(error, ChorusError) else SynthesisError.in_engine(self.engine.name, error)
            self._fail(batch[0], answer, error)
            return
        log.warning("%s failed on a batch of %d (%s); each item runs again alone", self.engine.name, len(batch),
                    type(error).__name__)  # (each item's failure is logged in full, alone)
        self.metrics.batch_retries.labels(self.engine.name).inc()
        for item in batch:
            self._execute([item])

    def _deliver(self, batch: list[QueuedItem], outputs: list[EngineOutput], lowered: bool = False) -> None:
        unsound = lowered and next((fault for output in outputs if (fault := audio_fault(output.audio))), None)
        if unsound:  # not audio at the lower precision: a failure of it (precision.py); at full, resolve refuses it
            self._failed(batch, UnsoundAudio(unsound, self.engine.name), lowered)
            return
        self.serving.memory.succeeded()
        self._batches_run += 1
        if self.empty_cache_every and self._batches_run % self.empty_cache_every == 0:
            self.engine.release_memory()
        self.serving.learn_audio_rate([item.input for item in batch], outputs)
        for item, output in zip(batch, outputs):
            item.resolve(output)  # (audio that is not audio is refused there, for every shape)

    def _out_of_memory(self, batch: list[QueuedItem], retried_alone: bool) -> None:
        """Lower the memory budget and run the batch again in halves; an item fails only when it
        does not fit even alone, with the cache released."""
        log.warning("%s ran out of memory on %d items (%d padded tokens)", self.engine.name, len(batch),
                    padded_tokens(batch))
        self.metrics.out_of_memory.labels(self.engine.name).inc()
        self.serving.memory.out_of_memory(padded_tokens(batch))
        self.engine.release_memory()
        if len(batch) > 1:
            half = len(batch) // 2
            self._execute(batch[:half])
            self._execute(batch[half:])
        elif not retried_alone:
            self._execute(batch, retried_alone=True)
        else:
            self._fail(batch[0], SynthesisError("synthesis failed: the item does not fit in device memory even alone"))

    def _fail(self, item: QueuedItem, answer: ChorusError, cause: BaseException | None = None) -> None:
        """The item's caller gets our message; the log gets the whole exception, traceback and text, once."""
        log.warning("%s failed on one item: %s", self.engine.name, answer.message, exc_info=cause)
        self.metrics.item_errors.labels(self.engine.name).inc()
        item.future.set_exception(answer)

    def _run_batch(self, batch: list[QueuedItem]) -> list[EngineOutput]:
        waits = self._batch_started(batch)
        record = None
        try:
            started = self.clock.timer()
            outputs = self.synthesize([item.input for item in batch])
            record = self._batch_ran(batch, waits, outputs, self.clock.timer() - started)
            return outputs
        finally:
            self.metrics.batch_finished(self.engine.name, record, waits)

    def _batch_started(self, batch: list[QueuedItem]) -> list[float]:
        """Each item's wait in the queue, as the batch starts."""
        self.metrics.batch_started(self.engine.name, len(batch))
        dispatched = self.clock.now()
        return [dispatched - item.enqueued_at for item in batch]

    def _batch_ran(self, batch: list[QueuedItem], waits: list[float], outputs: list[EngineOutput],
                   seconds: float) -> BatchRecord:
        """What the policy, the wait predictions and the items learn from a batch that ran in `seconds`."""
        if len(outputs) != len(batch):
            raise RuntimeError(f"engine returned {len(outputs)} outputs for {len(batch)} items")
        padded, real = padded_tokens(batch), sum(item.length for item in batch)
        self.policy.observe(len(batch), padded, seconds, real_tokens=real)
        self.serving.item_cost.add(len(batch), real, seconds)
        for item, wait in zip(batch, waits):
            item.queue_s, item.batch_s, item.batch_size = wait, seconds, len(batch)
        # stamped on the system's clock, as the metrics' windows are
        return BatchRecord(time.monotonic(), self.engine.name, len(batch), padded, real, seconds,
                           self.policy.max_batch_size)

    # --- batches back to back (an engine that pipelines: on CUDA) ----------------------------------

    def _launch(self, batch: list[QueuedItem]) -> bool:
        """Prepare the batch while the device still runs the one in flight, start it behind that one, then land
        that one (wait for it, trim and deliver its audio) while the device runs this one. What fails to start
        runs the one-call way, once the one in flight has landed (False: it is not left in flight)."""
        lowered = self.serving.precision.lowered
        waits = self._batch_started(batch)
        try:
            prepared = self.engine.prepare([item.input for item in batch])
            started = self.clock.timer()
            running = self.engine.run(prepared)
        except Exception as error:
            self.metrics.batch_finished(self.engine.name, None, waits)
            if self._in_flight is not None:
                self._land()
            self._after_failure(batch, error, lowered)
            return False
        landing, self._in_flight = self._in_flight, _InFlight(batch, waits, running, started, lowered)
        if landing is not None:
            self._land(landing)
        return True

    def _land(self, flight: _InFlight | None = None) -> None:
        """Wait for a batch launched before (the one in flight unless named), and deliver it; its time on the
        device runs from its start, or from the end of the batch before it if that was later."""
        if flight is None:
            flight, self._in_flight = self._in_flight, None
        record = None
        try:
            outputs = self.engine.finish(flight.running)
            landed = self.clock.timer()
            record = self._batch_ran(flight.batch, flight.waits, outputs, landed - max(flight.started, self._landed))
            self._landed = landed
        except Exception as error:
            self.metrics.batch_finished(self.engine.name, None, flight.waits)
            self._after_failure(flight.batch, error, flight.lowered)
        else:
            self.metrics.batch_finished(self.engine.name, record, flight.waits)
            self._deliver(flight.batch, outputs, flight.lowered)
        finally:
            self.queue.done(len(flight.batch))

    def _after_failure(self, batch: list[QueuedItem], error: Exception, lowered: bool) -> None:
        if isinstance(error, self.engine.out_of_memory_errors):
            self._out_of_memory(batch, retried_alone=False)
        else:
            self._failed(batch, error, lowered)


@dataclass
class _InFlight:
    """A batch started on the device and not yet landed."""

    batch: list[QueuedItem]
    waits: list[float]  # each item's wait in the queue
    running: Any  # what the engine's `run` returned, for its `finish`
    started: float  # on the loop's clock's timer
    lowered: bool  # it runs at degrade mode's lower precision
