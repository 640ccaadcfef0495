"""The one small interface every model family implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from ..request import SynthesisRequest


class EngineUnavailable(RuntimeError):
    """A configured model cannot be loaded; the message names it and says why."""


@dataclass(frozen=True)
class Voice:
    name: str  # what callers pass as `voice`
    model: str  # the model family serving it, what callers pass as `model` (e.g. "piper")
    language: str
    sample_rate: int
    speaker: str | None = None
    speed: float = 1.0  # this voice's default speed; a request's speed multiplies it


@dataclass(frozen=True)
class VoiceSpec:
    """A voice the registry names on a model: language, speaker id and default speed."""

    name: str
    language: str | None = None  # None: the model's own
    speaker: int | None = None  # None: the model's default speaker
    speed: float = 1.0


class Engine(ABC):
    """One loaded model. Only its batcher's thread calls `synthesize`."""

    name: str  # unique per loaded model, used in metrics and batch keys
    sample_rate: int
    out_of_memory_errors: tuple[type[BaseException], ...] = (MemoryError,)  # what `synthesize` raises when full
    bytes_per_padded_token: float | None = None  # device memory a batch needs per padded token, if measured

    @abstractmethod
    def voices(self) -> list[Voice]: ...

    @abstractmethod
    def tokenize(self, text: str, voice: str) -> list[np.ndarray]:
        """Model input ids for text: one array per sentence the model's front end finds."""

    def batch_key(self, voice: str, speed: float) -> Hashable:
        """Items with equal keys can share one model call."""
        return (self.name, speed)

    def set_low_precision(self, enabled: bool) -> bool:
        """Switch to (or back from) a lower precision; False where the engine has none to offer."""
        return False

    @abstractmethod
    def synthesize(self, batch: Sequence[SynthesisRequest]) -> list[np.ndarray]:
        """One float32 mono array in [-1, 1] per item, trimmed to that item's own length."""

    # Device memory: engines on a device with memory to manage override these.

    def measure_memory(self, tokens: np.ndarray) -> None:
        """At warm-up: measure bytes_per_padded_token with these input ids."""

    def free_memory_bytes(self) -> int | None:
        """Device memory this engine could still use; None where it has none to manage."""
        return None

    def release_memory(self) -> None:
        """Hand cached, unused memory back (device caches, allocator arenas). Called on the engine's
        thread, between batches."""

    def memory_bytes(self) -> int:
        """What the loaded model holds (weights), for the budget of loaded models."""
        return 0


def peak_normalize(audio: np.ndarray) -> np.ndarray:
    """Scale to peak 1.0, as Piper does for each sentence it synthesizes (every engine does, so
    sentences of one text are equally loud)."""
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak < 1e-8:
        return np.zeros_like(audio, dtype=np.float32)
    return np.clip(audio / peak, -1.0, 1.0).astype(np.float32)
