"""The voice registry: a YAML file (TTS_VOICES_FILE) naming voices beside the voices folder.

    voices:
      mms-eng:
        engine: vits                 # transformers VITS (facebook/mms-tts-*) ...
        model: facebook/mms-tts-eng  # a hub id (from the local cache when offline) or a folder
        language: en
        pinned: true                 # loaded and warmed at start-up, never unloaded
        language_default: true       # a request with "language": "en" and no voice gets this one
      mms-fra:
        engine: vits
        model: /models/mms-tts-fra
        language: fr
        speed: 1.1                   # this voice's default speed (a request's speed multiplies it)
      joe:
        engine: piper                # ... or a Piper voice file, under a name of your choosing
        model: /voices/en_US-joe-medium.onnx
      anna:
        engine: pocket_tts           # Kyutai's Pocket TTS (autoregressive: requests join and leave each step)
        model: /models/pocket-tts
        prompt: voices/anna.wav      # the voice: a clip (wav/flac/ogg/mp3) or .safetensors latents;
                                     # none: the model's shipped voice of this name, or its default
        max_running: 8               # model-level: the most requests running at once (default 16)
        fixed_length: false          # model-level: true for random-weight benchmark models

Voices that name the same model share one loaded engine (and one batcher). Models that are not
pinned load when first asked for and are unloaded, least recently used first, to keep within
TTS_MAX_LOADED_MODELS and TTS_MODEL_MEMORY_MB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..engines import ENGINE_KINDS
from ..engines.base import EngineUnavailable


class RegistryError(EngineUnavailable):
    """The registry file cannot be used; the message names the file and the fault."""


class VoiceEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: Literal[tuple(ENGINE_KINDS)]  # type: ignore[valid-type]
    model: str = Field(min_length=1, description="hub id or local path")
    language: str | None = Field(None, description="language code; default: the model's own")
    speaker: int | None = Field(None, ge=0, description="speaker id of a multi-speaker model")
    speed: float = Field(1.0, ge=0.25, le=4.0, description="default speed")
    pinned: bool = Field(False, description="load and warm at start-up and never unload")
    language_default: bool = Field(False, description="the voice of its language: what a request naming that "
                                   "language and no voice gets (TTS_LANGUAGE_VOICES overrides it)")
    prompt: str | None = Field(None, min_length=1, description="voice prompt: .safetensors latents or an audio "
                               "clip (pocket_tts, vibevoice); relative to the model folder")
    fixed_length: bool = Field(False, description="pocket_tts, vibevoice: every request makes its whole frame "
                               "budget (random-weight benchmark models)")
    max_running: int | None = Field(None, ge=1, le=1024, description="pocket_tts, vibevoice: the most requests "
                                    "running at once")


class Registry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    voices: dict[str, VoiceEntry] = {}

    def by_model(self) -> dict[tuple[str, str], dict[str, VoiceEntry]]:
        """(engine, model) -> its voices: one loaded engine each."""
        grouped: dict[tuple[str, str], dict[str, VoiceEntry]] = {}
        for name, entry in self.voices.items():
            grouped.setdefault((entry.engine, entry.model), {})[name] = entry
        return grouped


def read_registry(path: Path | None) -> Registry:
    if path is None:
        return Registry()
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        return Registry.model_validate(data)
    except OSError as error:
        raise RegistryError(f"voices file {path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise RegistryError(f"voices file {path} is not valid YAML: {error}") from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise RegistryError(f"voices file {path}: {where}: {first['msg']}") from None
