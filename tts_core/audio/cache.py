"""Encoded-audio cache: least recently used first out, bounded by bytes."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from enum import StrEnum


class CacheUse(StrEnum):
    """What the audio cache did for an answer (its X-Cache header)."""

    HIT = "hit"  # served from the cache
    MISS = "miss"  # looked up, not there: synthesized and stored
    OFF = "off"  # not looked up (the cache off, or an answer it cannot hold: word timings)


@dataclass(frozen=True)
class CachedAudio:
    data: bytes
    content_type: str
    voice: str
    duration_s: float


class AudioCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[Hashable, CachedAudio] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> CachedAudio | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key: Hashable, entry: CachedAudio) -> None:
        with self._lock:
            if len(entry.data) > self.max_bytes:
                return
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= len(old.data)
            self._entries[key] = entry
            self.bytes += len(entry.data)
            self._evict()

    def drop_voice(self, voice: str) -> None:
        """Forget a voice's audio: it was deleted, and a new voice may take its name."""
        with self._lock:
            for key in [key for key, entry in self._entries.items() if entry.voice == voice]:
                self.bytes -= len(self._entries.pop(key).data)

    def resize(self, max_bytes: int) -> None:
        with self._lock:
            self.max_bytes = max_bytes
            self._evict()

    def _evict(self) -> None:
        while self.bytes > self.max_bytes and self._entries:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= len(evicted.data)

    def stats(self) -> dict:
        with self._lock:
            lookups = self.hits + self.misses
            return {"entries": len(self._entries), "bytes": self.bytes, "max_bytes": self.max_bytes,
                    "hits": self.hits, "misses": self.misses,
                    "hit_rate": round(self.hits / lookups, 4) if lookups else 0.0}
