"""Transformers VITS models (facebook/mms-tts-*): a hub id or a folder."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from ..kind import Described, EngineKind, VoiceOptions, torch_loader, voice_specs

if TYPE_CHECKING:
    from ...config import Settings


class VitsVoice(VoiceOptions):
    engine: Literal["vits"]


def describe(model: str, entries: dict[str, VitsVoice], name: str, settings: Settings) -> Described:
    from ..vits import VitsEngine, describe_vits

    voices = voice_specs(entries)
    return describe_vits(model, voices), VitsEngine.capabilities, torch_loader(
        settings, lambda: VitsEngine(model, voices, settings.device, settings.dtype, name=name))


KIND = EngineKind(VitsVoice, describe)
