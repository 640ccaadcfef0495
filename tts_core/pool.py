"""The loaded models: pinned ones always, the others loaded when first asked for and unloaded,
least recently used first, to keep within a count and a memory budget.

Loading runs on the pool's own threads, never a batcher's, so loading one model never holds up
synthesis on the others; callers asking for a model that is loading wait for that one load.
A model is only unloaded when idle (nothing queued, nothing running).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from .batcher import Batcher
from .engines import Engine, ModelSpec
from .metrics import Metrics

log = logging.getLogger(__name__)


class PoolFull(Exception):
    """Every loaded model is pinned or busy, and the limits allow no more."""


@dataclass(eq=False)
class Slot:
    spec: ModelSpec
    batcher: Batcher | None = None
    last_used: float = 0.0
    loading: Future | None = None
    retired: bool = False  # no longer configured: unloaded once idle


class ModelPool:
    def __init__(self, specs: Sequence[ModelSpec], make_batcher: Callable[[Engine], Batcher], metrics: Metrics,
                 max_loaded: int = 0, memory_budget_bytes: int = 0):
        self.make_batcher = make_batcher
        self.metrics = metrics
        self.max_loaded = max_loaded  # 0: no limit
        self.memory_budget_bytes = memory_budget_bytes  # 0: no limit
        self.slots: dict[str, Slot] = {}
        self._lock = threading.Lock()
        self._loader = ThreadPoolExecutor(max_workers=2, thread_name_prefix="model-loader")
        self._started = False
        self.add(specs)

    # --- configuration ---------------------------------------------------------------------------

    def add(self, specs: Sequence[ModelSpec]) -> None:
        """New models; pinned ones load now (the caller's thread: at start-up, before serving)."""
        for spec in specs:
            slot = Slot(spec)
            self.slots[spec.name] = slot
            if spec.pinned:
                self._load(slot)

    def retire(self, name: str) -> None:
        """Stop offering a model: unloaded now if idle, else once it is."""
        slot = self.slots[name]
        slot.retired = True
        self._sweep()

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._started = True
        for slot in self.slots.values():
            if slot.batcher is not None:
                slot.batcher.start()

    def stop(self) -> None:
        self._loader.shutdown(wait=False, cancel_futures=True)
        for slot in self.slots.values():
            if slot.batcher is not None:
                slot.batcher.stop()

    # --- use -------------------------------------------------------------------------------------

    def loaded(self) -> dict[str, Batcher]:
        return {name: slot.batcher for name, slot in self.slots.items() if slot.batcher is not None}

    async def batcher(self, name: str) -> Batcher:
        """The model's batcher, loading the model first if it is not loaded."""
        self._sweep()
        slot = self.slots[name]
        slot.last_used = time.monotonic()
        if slot.batcher is not None:
            return slot.batcher
        with self._lock:
            if slot.loading is None:
                slot.loading = self._loader.submit(self._load, slot)
            loading = slot.loading
        # shielded: a caller that gives up must not cancel the load others are waiting for
        return await asyncio.shield(asyncio.wrap_future(loading))

    def _load(self, slot: Slot) -> Batcher:
        name = slot.spec.name
        try:
            self._make_room(slot)
            started = time.perf_counter()
            engine = slot.spec.load()
            batcher = self.make_batcher(engine)
            if self._started:
                batcher.start()
            slot.batcher = batcher
            self.metrics.model_loads.labels(name, "ok").inc()
            log.info("loaded model %s in %.1f s", name, time.perf_counter() - started)
        except Exception:
            self.metrics.model_loads.labels(name, "failed").inc()
            raise
        finally:
            with self._lock:
                slot.loading = None
            self.metrics.models_loaded.set(len(self.loaded()))
        self._fit_memory(keep=slot)
        return batcher

    # --- unloading -------------------------------------------------------------------------------

    def _idle_unpinned(self, keep: Slot) -> list[Slot]:
        """Loaded models that may be unloaded now, least recently used first."""
        return sorted((slot for slot in self.slots.values()
                       if slot is not keep and slot.batcher is not None and not slot.spec.pinned
                       and not slot.batcher.busy), key=lambda slot: slot.last_used)

    def _make_room(self, slot: Slot) -> None:
        while self.max_loaded and len(self.loaded()) >= self.max_loaded:
            candidates = self._idle_unpinned(keep=slot)
            if not candidates:
                raise PoolFull(f"{len(self.loaded())} models are loaded (TTS_MAX_LOADED_MODELS) and none is idle")
            self._unload(candidates[0], "count")

    def _fit_memory(self, keep: Slot) -> None:
        if not self.memory_budget_bytes:
            return
        while self.memory_bytes() > self.memory_budget_bytes:
            candidates = self._idle_unpinned(keep=keep)
            if not candidates:
                log.warning("loaded models hold %d MB, over TTS_MODEL_MEMORY_MB, and none can be unloaded",
                            self.memory_bytes() // 2**20)
                return
            self._unload(candidates[0], "memory")

    def memory_bytes(self) -> int:
        return sum(batcher.engine.memory_bytes() for batcher in self.loaded().values())

    def _sweep(self) -> None:
        for name, slot in list(self.slots.items()):
            if slot.retired and (slot.batcher is None or not slot.batcher.busy):
                if slot.batcher is not None:
                    self._unload(slot, "removed")
                del self.slots[name]

    def _unload(self, slot: Slot, reason: str) -> None:
        batcher, slot.batcher = slot.batcher, None
        batcher.stop()
        batcher.engine.release_memory()
        self.metrics.model_evictions.labels(slot.spec.name, reason).inc()
        self.metrics.models_loaded.set(len(self.loaded()))
        log.info("unloaded model %s (%s)", slot.spec.name, reason)
