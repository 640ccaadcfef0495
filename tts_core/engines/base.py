"""The one small interface every model family implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

from ..request import SynthesisRequest


@dataclass(frozen=True)
class Voice:
    name: str  # what callers pass as `voice`
    model: str  # the model family serving it, what callers pass as `model` (e.g. "piper")
    language: str
    sample_rate: int
    speaker: str | None = None


class Engine(ABC):
    """One loaded model. Only its batcher's thread calls `synthesize`."""

    name: str  # unique per loaded model, used in metrics and batch keys
    sample_rate: int

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


def peak_normalize(audio: np.ndarray) -> np.ndarray:
    """Scale to peak 1.0, as Piper does for each sentence it synthesizes (every engine does, so
    sentences of one text are equally loud)."""
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak < 1e-8:
        return np.zeros_like(audio, dtype=np.float32)
    return np.clip(audio / peak, -1.0, 1.0).astype(np.float32)
