"""The engine loop: one thread owns each loaded model's engine and runs, turn by turn, what its strategy says.

An `EngineLoop` owns the engine's thread; its errands (`run_on_engine`: voice prompts, clones, precision
changes), which run at the top of a turn, never beside a batch or a step; the warm-up and the calibration
sweep, whose points run one at a time while the engine is idle, so that the server serves at once; start
and stop; and what callers ask of a model (submit, busy, running work, status, the memory budget).

What a turn does belongs to the strategy it holds, one per engine shape: `tts_core.scheduler.one_shot` (plan a batch,
synthesize it, deliver) and `tts_core.scheduler.stepped` (admit, step, release). The loop never changes by
inheritance: another shape of engine (a server that batches on its own) is another strategy.

No timer runs while the engine is idle: a strategy with nothing to do waits on the queue, which wakes it
for an arrival or an errand.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ..engines.base import Engine
from ..engines.contract import EngineInput, EngineOutput
from ..errors import ErrorCode, Overloaded, voice_deleted
from ..ops.metrics import Metrics
from .calibration import CalibrationStore, Row, calibration_key
from .faults import FaultCounts, Faults
from .memory import MemoryBudget, release_heap
from .policy import ItemCost
from .precision import Precision, PrecisionState
from .queue import QueueClosed, RequestQueue, WaitTarget, tier_share
from .records import QueuedItem

T = TypeVar("T")
log = logging.getLogger(__name__)


RELEASE_AFTER_IDLE_S = 2.0  # idle this long after work before its memory is handed back
RECHECK_QUIET_S = 5.0  # a kept calibration's background recheck runs only once the engine was idle this long

CALIBRATION_TEXT = (
    "The calibration sweep measures how long this engine takes for batches of several sizes, "
    "at a short and at a long length, so that the batch policy starts from real timings. "
    "Every executed batch after it refines the same cost model while the server runs."
)


def stopped_error(model: str) -> Overloaded:
    """What a request hears when its model stops before it is synthesized."""
    return Overloaded(f"model {model} was stopped before this was synthesized; retry", 1, ErrorCode.MODEL_STOPPED)


class Serving:
    """What a loop and its strategy share: the engine, its queue and metrics, the device-memory budget, and
    what the queue's wait predictions learn from the work done. Only the engine's thread writes to it, and a
    stepped engine's codec stage, which delivers its requests (the item cost and the audio rate)."""

    def __init__(self, engine: Engine, queue: RequestQueue, metrics: Metrics, min_free_memory_mb: int = 2048,
                 precision_off: dict[str, str] | None = None):
        self.engine, self.queue, self.metrics = engine, queue, metrics
        self.clock = queue.clock  # plans, batch and step times, on the clock the queue's items were timed by
        self.memory = MemoryBudget(engine, min_free_memory_mb * 2**20)
        self.item_cost = ItemCost()  # engine time per item as the work runs now, for the queue's predictions
        self.audio_s_per_token = 0.0  # moving estimate of audio produced per input token (at speed 1)
        self.worked = False  # work ran since memory was last released
        self.precision = PrecisionState(engine, precision_off)  # degrade mode's lower precision, and its fuse

    def learn_audio_rate(self, batch: Sequence[EngineInput], outputs: Sequence[EngineOutput]) -> None:
        audio_s = sum(output.audio.size * item.speed for item, output in zip(batch, outputs)) / self.engine.sample_rate
        rate = audio_s / max(1, sum(item.length for item in batch))
        self.audio_s_per_token = rate if not self.audio_s_per_token else 0.8 * self.audio_s_per_token + 0.2 * rate

    def wait_for_work(self) -> None:
        """Nothing to do (on the engine's thread): wait for work. A busy spell that ended RELEASE_AFTER_IDLE_S ago
        hands back what it used (the engine's caches and arenas, the heap's free pages), or a burst of long texts
        keeps its memory for good; not at once, or a caller that sends its sentences one after another pays the
        release (about 25 ms for Piper) and the arena's regrowth at each."""
        if self.worked:
            until = self.clock.now() + RELEASE_AFTER_IDLE_S
            self.queue.wait_until(until)
            if self.clock.now() < until or len(self.queue):
                return  # work came, or the loop was woken: the spell goes on
            self.worked = False
            try:
                self.engine.release_memory()
            except Exception:
                log.exception("%s: releasing memory failed", self.engine.name)
            release_heap()
        self.queue.wait_for_items()


class StrategyStatus(Protocol):
    """A strategy's figures (tts_core.scheduler.one_shot.OneShotStatus, stepped.SteppedStatus,
    upstream.UpstreamStatus): read as attributes, written out by to_json for the status page."""

    def to_json(self) -> dict: ...


@dataclass(frozen=True)
class LoopStatus:
    """A model's loop as it stands: its queue, readiness, its strategy's figures, its turns' failures, precision and
    memory. to_json is its part of GET /api/v1/batch/status."""

    queue_length: int
    queue_wait_s: float
    ready: bool
    calibrated: bool
    strategy: StrategyStatus
    turns: FaultCounts  # the loop's turns that raised
    precision: str
    memory_token_budget: int | None
    out_of_memory: int

    def to_json(self) -> dict:
        return {"queue_length": self.queue_length, "queue_wait_s": self.queue_wait_s, "ready": self.ready,
                "calibrated": self.calibrated, **self.strategy.to_json(), **self.turns.to_json("turn"),
                "precision": self.precision, "memory_token_budget": self.memory_token_budget,
                "out_of_memory": self.out_of_memory}


class Strategy(Protocol):
    """How one shape of engine is driven. Every method runs on the engine's thread, except `status`,
    `running_count` and `cost_model`, which read what it keeps."""

    hands_out_pieces: bool  # a stream's audio is handed out as it is made (its items carry AudioPieces)

    def warm_up(self) -> list[Callable[[], None]]:
        """One untimed run and the wait predictions' seed; returns the calibration sweep's points."""

    def idle(self) -> bool:
        """Nothing queued or running: a calibration point may use the engine."""

    def step(self) -> None:
        """One turn: plan from the queue, run on the engine, deliver (or wait on the queue). A turn that raises
        has ended the requests it concerned first (their callers told) and left the engine running nothing of
        theirs: the loop counts it and goes on."""

    def stopped(self) -> None:
        """The queue has closed: whatever still runs ends, its callers told, and any thread of its own ends
        (even where ending a request fails)."""

    def running_count(self) -> int | None:
        """Requests running now; None where the engine runs whole batches."""

    def status(self) -> StrategyStatus:
        """The policy's state and the strategy's own figures, for the status page."""

    def cost_model(self) -> dict:
        """The cost model the policy sizes its work by, for the dashboard's chart."""


class EngineLoop:
    def __init__(self, serving: Serving, strategy: Strategy, calibrations: CalibrationStore | None = None):
        """calibrations: where calibration sweeps are kept across restarts (None: swept at every start)."""
        self.serving, self.strategy, self.calibrations = serving, strategy, calibrations
        self._kept: tuple[str, dict] | None = None  # the key this model's calibration is kept under, and its meaning
        self.swept = threading.Event()  # the sweep has ended (the recheck of a kept calibration's too)
        self._worked_at = 0.0  # when the engine last ran a turn of work (a recheck waits for quiet after it)
        self.engine, self.queue, self.metrics = serving.engine, serving.queue, serving.metrics
        self.memory = serving.memory  # the device-memory budget
        self.ready = threading.Event()  # serving: warmed up, the wait predictions seeded
        self.calibrated = threading.Event()  # calibrated: the sweep has run, or a kept calibration was reused
        self._precision_asked = Precision.FULL  # what degrade mode last asked for
        self._errands: deque[tuple[Callable[[], Any], Future]] = deque()  # run_on_engine's calls, in order
        self._errands_lock = threading.Lock()
        self._errands_closed = False  # the loop has ended: nothing would run a new errand
        self.faults = Faults(self.engine.name, "a turn")  # turns that raised: shown on the status page
        self._thread = threading.Thread(target=self._run, name=f"engine-{self.engine.name}", daemon=True)

    # --- the caller's side -------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop serving; whatever is still queued fails with a clear error (nothing is left waiting), and what
        runs ends at its next step (a whole batch of a stepped engine too). Returns whether the engine's thread
        has ended within `timeout` (said in the log where not: it still uses the engine until its turn ends)."""
        left = self.queue.close()
        for item in left:
            if item.claim():
                item.resolve(stopped_error(self.engine.name))
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if not self._thread.is_alive():  # its loop has ended (its errands ran), or it never started
            self._fail_errands()
            return True
        log.warning("%s: its engine thread is still in a turn %.0f s after the stop; it ends after it",
                    self.engine.name, timeout)
        return False

    def submit(self, items: Sequence[QueuedItem], tier_limit: int | None = None,
               target: WaitTarget = WaitTarget()) -> float:
        """Queue items (all or none) with their predicted cost; returns the first one's predicted
        wait. Raises QueueFull (with a Retry-After from the prediction), or QueueClosed once the
        model has been unloaded."""
        for item in items:
            item.cost_s = self.item_cost_s(item.length)
        return self.queue.put_many(items, tier_limit, target)

    def tier_limit(self, queue_share: float) -> int | None:
        """The most pieces a tier with this share of the queue (a fraction) may hold here; None: no limit of its own."""
        return tier_share(queue_share, self.queue.max_size)

    def most_per_text(self, caller: str, tier_limit: int | None) -> int:
        """The most pieces one text of this caller's may be cut into now."""
        return self.queue.most_per_text(caller, tier_limit)

    def check(self, count: int, tier: str, caller: str, priority: int, tier_limit: int | None, target: WaitTarget,
              deadline_in_s: float) -> None:
        """Refuse (QueueFull) `count` pieces of one text that the queue would not take now: no room, or a wait past
        the target or the deadline. Made before the text is tokenized; `submit` checks again, exactly."""
        self.queue.check(count, tier, caller, priority, tier_limit, target, deadline_in_s)

    def predicted_wait(self) -> float:
        """A typical new sentence's predicted wait here, from a new default-priority caller (0 when idle)."""
        return self.queue.predicted_wait()

    def pressure(self, target: WaitTarget) -> tuple[float, float]:
        """predicted_wait(), and the wait target in force for it (the usual one, or the overload one)."""
        return self.queue.predicted_wait(), target.limit_s(self.queue.overloaded(target))

    @property
    def queue_length(self) -> int:
        return len(self.queue)

    def close_if_idle(self) -> bool:
        """Take no more work, if none is queued or running (the pool is unloading the model); False if busy."""
        return self.queue.close_if_idle()

    def item_cost_s(self, tokens: int) -> float:
        """Predicted engine time of an item of this length, as the work runs now."""
        return self.serving.item_cost.predict(tokens)

    @property
    def audio_s_per_token(self) -> float:
        """Audio an input token makes (at speed 1), as measured: a stream's pieces are due by it."""
        return self.serving.audio_s_per_token

    @property
    def hands_out_pieces(self) -> bool:
        """A stream's audio comes out as it is made, not whole (its items carry AudioPieces)."""
        return self.strategy.hands_out_pieces

    @property
    def busy(self) -> bool:
        """Work is queued or running."""
        return self.queue.busy

    def running_count(self) -> int | None:
        """Requests running now (None where the engine runs whole batches)."""
        return self.strategy.running_count()

    def status(self) -> LoopStatus:
        """The model's queue, readiness, policy, memory, and its strategy's figures."""
        return LoopStatus(len(self.queue), round(self.queue.predicted_wait(), 3), self.ready.is_set(),
                          self.calibrated.is_set(), self.strategy.status(), self.faults.counts(), self.precision,
                          self.memory.tokens(), self.memory.out_of_memory_count)

    def cost_model(self) -> dict:
        return self.strategy.cost_model()

    @property
    def precision(self) -> str:
        """The engine's precision now, as degrade mode left it (tts_core.scheduler.precision)."""
        return self.serving.precision.describe()

    def set_low_precision(self, low: bool) -> Future[bool] | None:
        """Degrade mode's lower_precision action (or its end), run as an errand: only the engine's thread
        calls the engine. The Future says whether the engine had a lower precision to offer (False while it is off
        for the model after a failed batch); None when this was already asked for. Raises QueueClosed once the loop
        has ended."""
        wanted = Precision.LOW if low else Precision.FULL
        if self._precision_asked == wanted:
            return None
        self._precision_asked = wanted
        return self.run_on_engine(lambda: self.serving.precision.switch(low))

    def reset_precision(self) -> bool:
        """The operator's reset after a batch failed at lower precision: degrade mode may lower it again (asked
        anew at its next tick). False where lower precision was not off."""
        self._precision_asked = Precision.FULL
        return self.serving.precision.reset()

    def refuse_voice(self, name: str) -> int:
        """A cloned voice deleted (and off its engine): its queued pieces are refused now (voice_deleted), not when
        each would have started; the running ones finish in it. How many."""
        return self.queue.refuse(lambda item: name in item.input.voices, lambda: voice_deleted(self.engine.name, name))

    def run_on_engine(self, call: Callable[[], T]) -> Future[T]:
        """Run call on the engine's thread between two turns (never beside a batch or a step),
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
        sweep = self._warm_up()
        while not self.queue.closed:
            try:
                self._run_errands()
                if sweep and self._calibrate_now(sweep):  # one run of the sweep, then the queue is looked at again
                    continue
                if not sweep:
                    self._sweep_ended(complete=True)
                self.strategy.step()
                self._worked_at = self.serving.clock.now()
            except Exception as error:  # the loop outlives any bug in one turn (whose requests have ended)
                self.faults.failed(error)
                if backoff_s := self.faults.backoff_s():  # (an arrival or an errand ends the wait)
                    self.queue.wait_until(self.serving.clock.now() + backoff_s)
            else:
                self.faults.succeeded()
        with self._errands_lock:
            self._errands_closed = True
        self._run_errands()  # those handed over before the end still run: the engine is still here
        try:
            self.strategy.stopped()
        except Exception:
            log.exception("%s: ending what ran at the stop failed", self.engine.name)

    def _warm_up(self) -> deque[Callable[[], None]]:
        """The strategy's warm-up; returns its calibration sweep's runs. Where a calibration is kept for this
        model, its settings and this machine, it is used at once (calibrated), and the sweep is its recheck."""
        sweep: deque[Callable[[], None]] = deque()
        try:
            sweep.extend(self.strategy.warm_up())
            if sweep:
                self._reuse_kept()
        except Exception:
            log.exception("warm-up of %s failed; serving without calibration", self.engine.name)
        finally:
            self.serving.worked = True  # the calibration sweep's memory goes back once idle
            self._worked_at = self.serving.clock.now()
            self.ready.set()
        return sweep

    def _reuse_kept(self) -> None:
        calibrate = getattr(self.strategy, "calibrate", None)  # a strategy whose calibration can be kept
        if self.calibrations is None or calibrate is None:
            return
        self._kept = calibration_key(self.engine.name, self.strategy.calibration_settings())
        try:
            rows = self.calibrations.load(self._kept[0])
        except Exception:
            log.exception("%s: reading its kept calibration failed; sweeping", self.engine.name)
            return
        if rows:
            calibrate(rows)
            self.calibrated.set()
            log.info("%s is calibrated: kept from its last start (%d batches timed on this machine and settings); "
                     "checked again in the background while idle", self.engine.name, len(rows))

    def _calibrate_now(self, sweep: deque[Callable[[], None]]) -> bool:
        """Run the sweep's next run where the engine is free for it: nothing queued or running, and for the
        recheck of a kept calibration (no one waits on it) idle for RECHECK_QUIET_S too, so that callers sending
        one text after another do not meet it. False: a turn of work comes first."""
        if not self.strategy.idle():
            return False
        if self.calibrated.is_set():
            quiet_at = self._worked_at + RECHECK_QUIET_S
            if self.serving.clock.now() < quiet_at:
                self.queue.wait_until(quiet_at)  # (an arrival or an errand ends the wait)
                return True
        self._calibrate_next(sweep)
        return True

    def _fail_errands(self) -> None:
        with self._errands_lock:
            self._errands_closed = True
            errands, self._errands = self._errands, deque()
        for _, future in errands:
            if future.set_running_or_notify_cancel():
                future.set_exception(Overloaded(f"model {self.engine.name} was stopped first; retry", 1,
                                                ErrorCode.MODEL_STOPPED))

    def _run_errands(self) -> None:
        """The calls handed over so far (not those they hand over: a turn comes between)."""
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
            self._sweep_ended(complete=False)
        if not sweep:
            self._sweep_ended(complete=True)

    def _sweep_ended(self, complete: bool) -> None:
        """The sweep has run (or failed): what it measured is the cost model's seed from now on (a recheck's
        replaces the kept one), kept for the next start where it ran whole."""
        if self.swept.is_set():
            return
        rechecked = self.calibrated.is_set()
        measured: list[Row] = list(getattr(self.strategy, "measured", ()))
        if measured and (complete or not rechecked):
            self.strategy.calibrate(measured)
            if complete and self._kept is not None:
                self._keep(measured)
        self.calibrated.set()
        self.swept.set()
        figures = json.dumps(self.strategy.status().to_json(), default=float)
        log.info("%s is calibrated%s: %s", self.engine.name, " again (the kept calibration's recheck)" if rechecked
                 else "", figures)

    def _keep(self, measured: list[Row]) -> None:
        key, described = self._kept
        try:
            self.calibrations.save(key, described, measured)
        except Exception:
            log.exception("%s: keeping its calibration failed (the next start sweeps again)", self.engine.name)
