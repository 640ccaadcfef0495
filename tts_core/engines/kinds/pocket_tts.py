"""Kyutai's Pocket TTS (autoregressive: requests join and leave each step)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Literal

from ..kind import Described, EngineKind, VoiceOptions, stepped_options, torch_loader, voice_specs

if TYPE_CHECKING:
    from ...config import Settings


class PocketTTSVoice(VoiceOptions):
    engine: Literal["pocket_tts"]


def describe(model: str, entries: dict[str, PocketTTSVoice], name: str, settings: Settings) -> Described:
    from ..pocket_tts import PocketTTSEngine, describe_pocket_tts

    voices = voice_specs(entries)
    options = stepped_options(voices)
    capabilities = replace(PocketTTSEngine.kind_capabilities, max_running=options["max_running"])
    return describe_pocket_tts(model, voices), capabilities, torch_loader(
        settings, lambda: PocketTTSEngine(model, voices, settings.device, settings.dtype, name=name, **options))


KIND = EngineKind(PocketTTSVoice, describe)
