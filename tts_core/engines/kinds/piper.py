"""Piper voice files (.onnx, with their .onnx.json beside them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from ..kind import Described, EngineKind, VoiceOptions, voice_specs

if TYPE_CHECKING:
    from ...config import Settings


class PiperVoice(VoiceOptions):
    engine: Literal["piper"]


def piper_options(settings: Settings) -> dict:
    """The settings every Piper engine is made with (the voices folder's too)."""
    return dict(intra_op_threads=settings.onnx_intra_op_threads, inter_op_threads=settings.onnx_inter_op_threads,
                spinning=settings.onnx_spinning, noise_scale=settings.piper_noise_scale,
                noise_w=settings.piper_noise_w)


def describe(model: str, entries: dict[str, PiperVoice], name: str, settings: Settings) -> Described:
    from ..piper import PiperEngine, describe_piper

    voices = voice_specs(entries)
    described, capabilities = describe_piper(model, voices, name)
    return described, capabilities, lambda: PiperEngine(model, named_voices=voices, name=name,
                                                        **piper_options(settings))


KIND = EngineKind(PiperVoice, describe)
