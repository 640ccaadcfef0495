"""A tiny random Pocket TTS for tests, and loading it the way the server does (a registry file)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from bench.random_model import save_random_pocket
from tts_core.config import Settings
from tts_core.engines import ModelSpec
from tts_core.engines.contract import EngineInput
from tts_core.voices.registry import registry_specs


def registry_spec(model: Path, voices: dict[str, dict], folder: Path, engine: str = "pocket_tts") -> ModelSpec:
    """The model's spec, read from a registry file naming these voices (name -> entry options)."""
    entries = {name: {"engine": engine, "model": str(model), **options} for name, options in voices.items()}
    path = folder / "voices.yaml"
    path.write_text(yaml.safe_dump({"voices": entries}, sort_keys=False))
    [spec] = registry_specs(Settings(voices_file=path, data_dir=folder, device="cpu"), set())
    return spec


def build_tiny_pocket(folder: Path) -> Path:
    return save_random_pocket(folder, tiny=True, seed=0)


def request(engine, text: str, voice: str) -> EngineInput:
    [tokens] = engine.tokenize(text, voice)
    return EngineInput(tokens, voice)


def random_voice(frames: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((frames, 32)).astype(np.float32)
