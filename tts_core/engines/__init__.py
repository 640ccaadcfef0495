"""Model families behind the one `Engine` interface."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Engine, Voice

if TYPE_CHECKING:  # engines load without the settings package (bench/gpu_check runs on bare machines)
    from ..config import Settings


def load_engines(settings: Settings) -> list[Engine]:
    from .piper import load_piper_engines

    return list(load_piper_engines(settings.voices_path, settings.onnx_intra_op_threads,
                                   settings.onnx_inter_op_threads, settings.onnx_spinning,
                                   settings.piper_noise_scale, settings.piper_noise_w))


__all__ = ["Engine", "Voice", "load_engines"]
