"""Microsoft's VibeVoice (autoregressive, with a diffusion head and its own acoustic codec)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Literal

from ..kind import Described, EngineKind, VoiceOptions, stepped_options, torch_loader, voice_specs

if TYPE_CHECKING:
    from ...config import Settings


class VibeVoiceVoice(VoiceOptions):
    engine: Literal["vibevoice"]


def describe(model: str, entries: dict[str, VibeVoiceVoice], name: str, settings: Settings) -> Described:
    from ..vibevoice import VibeVoiceEngine, describe_vibevoice

    voices = voice_specs(entries)
    options = stepped_options(voices)
    capabilities = replace(VibeVoiceEngine.kind_capabilities, max_running=options["max_running"])
    return describe_vibevoice(model, voices), capabilities, torch_loader(
        settings, lambda: VibeVoiceEngine(model, voices, settings.device, settings.dtype, name=name, **options))


KIND = EngineKind(VibeVoiceVoice, describe)
