"""Microsoft's VibeVoice (autoregressive, with a diffusion head and its own acoustic codec)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from ..kind import EngineKind, SteppedVoiceOptions, stepped_torch_kind


class VibeVoiceVoice(SteppedVoiceOptions):
    engine: Literal["vibevoice"]


def _engine_module() -> tuple[type, Callable]:
    from ..vibevoice import VibeVoiceEngine, describe_vibevoice

    return VibeVoiceEngine, describe_vibevoice


KIND = EngineKind(VibeVoiceVoice, stepped_torch_kind(_engine_module))
