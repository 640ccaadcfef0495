"""The loaded models: pinned ones always, the others loaded when first asked for and unloaded,
least recently used first, to keep within a count and a memory budget.

Loading runs on the pool's own threads, never an engine loop's, so loading one model never holds up
synthesis on the others; callers asking for a model that is loading wait for that one load.

The pool's state (the slots, and which loop each holds) has one owner: every decision that
reads or changes it (look up, load, unload, retire, add) is made under one lock, and is short;
loading a model and joining a stopped loop's thread happen outside it. A model is unloaded
only when its queue closes while idle (RequestQueue.close_if_idle, atomic with submission), so
nothing can be queued on a model that is going away: a submission that finds its queue closed
asks the pool again and gets the model loaded anew.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from ..engines import Engine, EngineUnavailable, ModelSpec
from ..errors import ErrorCode, InvalidRequest, Overloaded
from ..ops.metrics import Metrics
from .engine_loop import EngineLoop

log = logging.getLogger(__name__)


LOAD_RETRY_S = 30.0  # a model that failed to load is tried again after this, then twice as long each time
LOAD_RETRY_MAX_S = 600.0


def _broken(slot: Slot, now: float) -> Overloaded:
    wait = max(1, round(slot.retry_at - now))
    return Overloaded(f"model {slot.spec.name!r} is broken: {slot.failure}; the next try to load it is in "
                      f"{wait} s", wait, ErrorCode.MODEL_UNAVAILABLE)


class PoolFull(Overloaded):
    """Every loaded model is pinned or busy, and the limits allow no more."""

    def __init__(self, loaded: int):
        super().__init__(f"{loaded} models are loaded (TTS_MAX_LOADED_MODELS) and none is idle; retry after 5 s",
                         5, ErrorCode.MODELS_BUSY)


@dataclass(eq=False)
class Slot:
    spec: ModelSpec
    loop: EngineLoop | None = None
    last_used: float = 0.0
    loading: Future | None = None
    retired: bool = False  # no longer configured: unloaded once idle
    failure: str | None = None  # why the last load failed; no new load is tried before retry_at
    failures: int = 0
    retry_at: float = 0.0


class ModelPool:
    def __init__(self, specs: Sequence[ModelSpec], make_loop: Callable[[Engine], EngineLoop], metrics: Metrics,
                 max_loaded: int = 0, memory_budget_bytes: int = 0):
        self.make_loop = make_loop
        self.metrics = metrics
        self.max_loaded = max_loaded  # 0: no limit
        self.memory_budget_bytes = memory_budget_bytes  # 0: no limit
        self._slots: dict[str, Slot] = {}
        self._lock = threading.RLock()
        self._load_turns = threading.BoundedSemaphore(2)  # models loading at once
        self._started = False
        self.add(specs)

    # --- configuration ---------------------------------------------------------------------------

    def add(self, specs: Sequence[ModelSpec]) -> None:
        """New models; pinned ones load now (the caller waits: at start-up, before serving)."""
        with self._lock:
            slots = [Slot(spec) for spec in specs]
            for slot in slots:
                self._slots[slot.spec.name] = slot
        for slot in slots:
            if slot.spec.pinned:
                self._start_load(slot).result()

    def retire(self, name: str) -> None:
        """Stop offering a model: unloaded now if idle, else once it is."""
        with self._lock:
            self._slots[name].retired = True
        self.maintain()

    def slots(self) -> dict[str, Slot]:
        """A snapshot of the slots (safe to iterate while the pool changes)."""
        with self._lock:
            return dict(self._slots)

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            self._started = True
            loops = [slot.loop for slot in self._slots.values() if slot.loop is not None]
        for loop in loops:
            loop.start()

    def stop(self) -> None:
        with self._lock:
            for slot in self._slots.values():
                if slot.loading is not None:
                    slot.loading.cancel()  # a load not begun yet never begins; one under way ends as it does
            loops = [slot.loop for slot in self._slots.values() if slot.loop is not None]
        for loop in loops:
            loop.stop()

    # --- use -------------------------------------------------------------------------------------

    def loaded(self) -> dict[str, EngineLoop]:
        with self._lock:
            return {name: slot.loop for name, slot in self._slots.items() if slot.loop is not None}

    async def loop(self, name: str) -> EngineLoop:
        """The model's loop, loading the model first if it is not loaded."""
        with self._lock:
            slot = self._slots.get(name)
            if slot is None or slot.retired:
                raise InvalidRequest(f"model {name!r} has just been removed", "model", ErrorCode.MODEL_NOT_FOUND)
            now = slot.last_used = time.monotonic()
            if slot.loop is not None:
                return slot.loop
            if slot.loading is None and now < slot.retry_at:
                raise _broken(slot, now)
            if slot.loading is None:
                slot.loading = self._start_load(slot)
            loading = slot.loading
        try:
            # shielded: a caller that gives up must not cancel the load others are waiting for
            return await asyncio.shield(asyncio.wrap_future(loading))
        except EngineUnavailable:
            raise _broken(slot, time.monotonic()) from None

    def _start_load(self, slot: Slot) -> Future[EngineLoop]:
        """Load the slot's model on a thread of its own that ends with the load. A torch model loaded on
        a thread that lives on (the caller's, a pool's) leaves an OpenMP team of worker threads there;
        with two teams on the cores libgomp stops its workers from spinning between parallel regions,
        and every step of the engine, on its loop's thread, pays to wake them (measured in
        docs/voices.md#autoregressive-voices)."""
        loading: Future[EngineLoop] = Future()

        def load() -> None:
            with self._load_turns:
                if not loading.set_running_or_notify_cancel():
                    return  # cancelled (the pool stopped) before its turn came
                try:
                    loading.set_result(self._load(slot))
                except BaseException as error:  # the waiters get it, as from a pool's future
                    loading.set_exception(error)

        threading.Thread(target=load, name=f"model-load-{slot.spec.name}", daemon=True).start()
        return loading

    def _load(self, slot: Slot) -> EngineLoop:
        name = slot.spec.name
        try:
            self._make_room(slot)
            started = time.perf_counter()
            loop = self.make_loop(slot.spec.load())
            with self._lock:
                if self._started:
                    loop.start()
                slot.loop = loop
            slot.failure, slot.failures = None, 0
            self.metrics.model_loads.labels(name, "ok").inc()
            log.info("loaded model %s in %.1f s", name, time.perf_counter() - started)
        except EngineUnavailable as error:
            with self._lock:  # remembered, so that each new request does not start a full load again
                slot.failure, slot.failures = str(error), slot.failures + 1
                slot.retry_at = time.monotonic() + min(LOAD_RETRY_MAX_S, LOAD_RETRY_S * 2 ** (slot.failures - 1))
            self.metrics.model_loads.labels(name, "failed").inc()
            log.error("model %s failed to load (try %d): %s", name, slot.failures, error)
            raise
        except Exception:
            self.metrics.model_loads.labels(name, "failed").inc()
            raise
        finally:
            with self._lock:
                slot.loading = None
            self.metrics.models_loaded.set(len(self.loaded()))
        self._fit_memory(keep=slot)
        return loop

    # --- unloading -------------------------------------------------------------------------------

    def maintain(self) -> None:
        """Unload retired models that have gone idle, and forget them (the monitor calls this)."""
        with self._lock:
            for name, slot in list(self._slots.items()):
                if slot.retired and slot.loading is None and self._close(slot, "removed"):
                    del self._slots[name]

    def _make_room(self, keep: Slot) -> None:
        if not self.max_loaded:
            return
        with self._lock:
            while len(self.loaded()) >= self.max_loaded:
                if not self._close_one_idle(keep, "count"):
                    raise PoolFull(len(self.loaded()))

    def _fit_memory(self, keep: Slot) -> None:
        if not self.memory_budget_bytes:
            return
        with self._lock:
            while self.memory_bytes() > self.memory_budget_bytes:
                if not self._close_one_idle(keep, "memory"):
                    log.warning("loaded models hold %d MB, over TTS_MODEL_MEMORY_MB, and none can be unloaded",
                                self.memory_bytes() // 2**20)
                    return

    def _close_one_idle(self, keep: Slot, reason: str) -> bool:
        """Unload the least recently used idle, unpinned model other than keep; False if there is none."""
        candidates = sorted((slot for slot in self._slots.values()
                             if slot is not keep and slot.loop is not None and not slot.spec.pinned),
                            key=lambda slot: slot.last_used)
        return any(self._close(slot, reason) for slot in candidates)

    def memory_bytes(self) -> int:
        return sum(loop.engine.memory_bytes() for loop in self.loaded().values())

    def _close(self, slot: Slot, reason: str) -> bool:
        """Unload slot's model if it is idle (under the lock); True when the slot holds no model now."""
        loop = slot.loop
        if loop is None:
            return True
        if not loop.close_if_idle():
            return False
        slot.loop = None
        # its queue is closed and empty: the thread ends at once, and no caller can reach it any more
        threading.Thread(target=self._finish_unload, args=(loop,), name="model-unload", daemon=True).start()
        self.metrics.model_evictions.labels(slot.spec.name, reason).inc()
        self.metrics.models_loaded.set(len(self.loaded()))
        log.info("unloaded model %s (%s)", slot.spec.name, reason)
        return True

    @staticmethod
    def _finish_unload(loop: EngineLoop) -> None:
        loop.stop()
        loop.engine.release_memory()
