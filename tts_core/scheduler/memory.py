"""How many padded tokens one batch may hold, by device memory.

On a device with memory to manage (CUDA), the engine measures its peak bytes per padded token at
warm-up; the budget is the free memory, less a reserve, divided by that. An out-of-memory error
lowers a cap to half the batch that failed; the cap creeps back up as batches succeed. Where the
engine has no device memory (CPU), there is no memory budget: TTS_MAX_BATCH_TOKENS is the only one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

from ..engines.base import Engine

RECOVER_EVERY = 50  # successful batches between steps of the cap back up
RECOVER_FACTOR = 1.25


class MemoryBudget:
    def __init__(self, engine: Engine, reserve_bytes: int):
        self.engine = engine
        self.reserve_bytes = reserve_bytes
        self.cap: int | None = None  # set by an out-of-memory error
        self.out_of_memory_count = 0
        self._successes = 0
        self._lock = threading.Lock()

    def tokens(self) -> int | None:
        """The padded-token budget now, or None when memory sets no limit."""
        limits = [self.cap] if self.cap is not None else []
        free, per_token = self.engine.free_memory_bytes(), self.engine.bytes_per_padded_token
        if free is not None and per_token:
            limits.append(max(1, int((free - self.reserve_bytes) / per_token)))
        return min(limits) if limits else None

    def out_of_memory(self, padded_tokens: int) -> None:
        with self._lock:
            self.out_of_memory_count += 1
            self._successes = 0
            self.cap = max(1, min(self.cap or padded_tokens, padded_tokens) // 2)

    def succeeded(self) -> None:
        with self._lock:
            if self.cap is None:
                return
            self._successes += 1
            if self._successes >= RECOVER_EVERY:
                self._successes = 0
                self.cap = int(self.cap * RECOVER_FACTOR) + 1


HEAP_ARENAS = 2  # glibc's malloc arenas, unless MALLOC_ARENA_MAX says otherwise
_M_ARENA_MAX = -8  # mallopt's parameter (malloc.h)


def _libc_function(name: str):
    library = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(library), name, None) if library else None
    except OSError:
        return None


_malloc_trim = _libc_function("malloc_trim")
_mallopt = _libc_function("mallopt")


def limit_heap_arenas(count: int = HEAP_ARENAS) -> bool:
    """Cap glibc's malloc arenas at `count` (call before the threads start; MALLOC_ARENA_MAX, where set,
    wins). By default glibc gives each thread that allocates an arena of its own, up to 8 per core, and
    each keeps the pages that a few live objects pin, which no trim gives back: a server's threads
    (requests, encoders, engines) spread its memory over all of them. With 2 arenas the soak's idle memory
    grows less from the warm-up to the end than with glibc's default (docs/batching.md#memory-follows-the-work).
    False without glibc."""
    if _mallopt is None or "MALLOC_ARENA_MAX" in os.environ:
        return False
    return bool(_mallopt(_M_ARENA_MAX, count))


def release_heap() -> bool:
    """Hand the process's freed heap pages back to the system (glibc's malloc_trim). After a burst of
    long texts the allocator otherwise keeps its high-water mark for good. False without glibc."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True
