"""Kokoro-82M (hexgrad/Kokoro-82M): a folder or hub id with its voice packs; a star name is one voice a pack."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, ClassVar, Literal

from ..kind import Described, EngineKind, PromptedVoiceOptions, torch_loader, voice_specs

if TYPE_CHECKING:
    from ...config import Settings

HINT = "pip install -r requirements-kokoro.txt, after torch (README)"


class KokoroVoice(PromptedVoiceOptions):
    engine: Literal["kokoro"]

    listed_as: ClassVar[tuple[str, str] | None] = ("prompt", "voices/{}.pt")  # a pack's file


def describe(model: str, entries: dict[str, KokoroVoice], name: str, settings: Settings) -> Described:
    from ..kokoro import KokoroEngine, describe_kokoro

    for package in ("kokoro", "misaki"):  # (imported when the model loads: kokoro's import reads spaCy, seconds)
        if importlib.util.find_spec(package) is None:
            raise ModuleNotFoundError(name=package)
    voices = voice_specs(entries)
    return describe_kokoro(model, voices), KokoroEngine.capabilities, torch_loader(
        settings, lambda: KokoroEngine(model, voices, settings.device, name=name))  # (fp32 whatever TTS_DTYPE says)


def packs(model: str, entries: dict[str, KokoroVoice]) -> list[str]:
    from ..kokoro import pack_names

    return pack_names(model)


KIND = EngineKind(KokoroVoice, describe, lists=packs, install_hints={"kokoro": HINT, "misaki": HINT})
