"""Kyutai's Pocket TTS (autoregressive: requests join and leave each step)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from ..kind import EngineKind, SteppedVoiceOptions, stepped_torch_kind


class PocketTTSVoice(SteppedVoiceOptions):
    engine: Literal["pocket_tts"]


def _engine_module() -> tuple[type, Callable]:
    from ..pocket_tts import PocketTTSEngine, describe_pocket_tts

    return PocketTTSEngine, describe_pocket_tts


KIND = EngineKind(PocketTTSVoice, stepped_torch_kind(_engine_module))
