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
      voxtral:
        engine: upstream             # another server's model, through its OpenAI-compatible speech API
        model: mistralai/Voxtral-4B-TTS-2603  # the name the upstream serves it by (sent as "model")
        url: http://vllm:8091        # model-level: the server (requests go to {url}/v1/audio/speech)
        upstream_voice: neutral_female  # the voice's name there (default: this entry's name)
        api_key_env: VLLM_API_KEY    # model-level: the variable holding its key (never the key itself)
        sample_rate: 24000           # model-level: its raw PCM's rate (44100 for Fish S2 Pro)
        extra_body: {max_new_tokens: 2048}  # model-level: fields sent with every request
        clones: true                 # model-level: it clones per request (the clip and transcript go along)
        instructions: true           # model-level: a request's instructions (how to speak) are passed on
        normalize: true              # model-level: false: the text goes as written (also lexicon, ssml: false)
        max_in_flight: 32            # model-level: the most requests in flight (the number used is learned)
      kokoro-*:                      # a star: one voice for each the upstream lists (kokoro-af_heart, ...),
        engine: upstream             #   read from its GET /v1/audio/voices at start-up
        model: kokoro
        url: http://kokoro:8880

Voices that name the same model (and url) share one loaded engine (and one batcher). Models that are not
pinned load when first asked for and are unloaded, least recently used first, to keep within
TTS_MAX_LOADED_MODELS and TTS_MODEL_MEMORY_MB.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..engines import ENGINE_KINDS
from ..engines.base import VOICE_NAME, EngineUnavailable, FrontEnd, UpstreamOptions

# an upstream model's options (any of its voices may set each); with its url and each voice's upstream_voice, the
# fields only an upstream entry may have
UPSTREAM_OPTIONS = ("api_key_env", "sample_rate", "timeout_s", "extra_body", "max_in_flight", "clones",
                    "instructions", "normalize", "lexicon", "ssml")
UPSTREAM_FIELDS = ("url", "upstream_voice", *UPSTREAM_OPTIONS)


LISTED = "*"  # in a name: one voice for each the upstream lists (or the Kokoro model ships), its name for the star
# what a listed voice's name sets, per engine: an upstream's voice name there; a Kokoro pack's file
LISTED_FIELDS = {"upstream": ("upstream_voice", "{}"), "kokoro": ("prompt", "voices/{}.pt")}
log = logging.getLogger(__name__)


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
                               "clip (pocket_tts, vibevoice), a voice pack .pt (kokoro); relative to the model "
                               "folder")
    fixed_length: bool = Field(False, description="pocket_tts, vibevoice: every request makes its whole frame "
                               "budget (random-weight benchmark models)")
    max_running: int | None = Field(None, ge=1, le=1024, description="pocket_tts, vibevoice: the most requests "
                                    "running at once")
    url: str | None = Field(None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$", description="upstream: the server's "
                            "base URL (requests go to {url}/v1/audio/speech)")
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="upstream: the "
                                    "environment variable holding its API key")
    upstream_voice: str | None = Field(None, min_length=1, description="upstream: the voice's name there")
    sample_rate: int | None = Field(None, ge=8000, le=192000, description="upstream: its raw PCM's rate "
                                    "(default 24000)")
    timeout_s: float | None = Field(None, gt=0, le=3600, description="upstream: the longest wait for its next "
                                    "bytes (default 60)")
    extra_body: dict[str, Any] | None = Field(None, description="upstream: fields sent with every request")
    max_in_flight: int | None = Field(None, ge=1, le=1024, description="upstream: the most requests in flight "
                                      "(default 16; the number used is learned)")
    clones: bool | None = Field(None, description="upstream: it clones per request (vLLM-Omni's ref_audio and "
                                "ref_text): voices cloned here for it send their clip and transcript")
    instructions: bool | None = Field(None, description="upstream: it takes a request's instructions (how to "
                                      "speak): they are passed on")
    normalize: bool | None = Field(None, description="upstream: false: Chorus sends the text as written (no "
                                   "markdown, number or symbol reading)")
    lexicon: bool | None = Field(None, description="upstream: false: the operator's pronunciations are not applied")
    ssml: bool | None = Field(None, description="upstream: false: SSML is sent as it is, for the upstream to read")

    @model_validator(mode="after")
    def _upstream_fields(self):
        given = [name for name in UPSTREAM_FIELDS if getattr(self, name) is not None]
        if self.engine == "upstream" and self.url is None:
            raise ValueError("an upstream voice needs the url of its server")
        if self.engine != "upstream" and given:
            raise ValueError(f"{', '.join(given)}: only for engine: upstream")
        return self


class Registry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    voices: dict[str, VoiceEntry] = {}

    @model_validator(mode="after")
    def _listed_names(self):
        for name, entry in self.voices.items():
            if LISTED not in name:
                continue
            field = LISTED_FIELDS.get(entry.engine, ("",))[0]
            if not field or getattr(entry, field) is not None or name.count(LISTED) > 1:
                raise ValueError(f"{name}: a name with {LISTED} stands for every voice an upstream lists or a Kokoro "
                                 f"model ships (one {LISTED}; engine: upstream with no upstream_voice, or kokoro "
                                 "with no prompt)")
        return self

    def by_model(self) -> dict[tuple[str, str, str | None], dict[str, VoiceEntry]]:
        """(engine, model, upstream url) -> its voices: one loaded engine each."""
        grouped: dict[tuple[str, str, str | None], dict[str, VoiceEntry]] = {}
        for name, entry in self.voices.items():
            grouped.setdefault((entry.engine, entry.model, entry.url), {})[name] = entry
        return grouped


def with_listed(entries: dict[str, VoiceEntry], listed: Callable[[], list[str]]) -> dict[str, VoiceEntry]:
    """One model's entries, each name with a star in it replaced by one voice for each name the upstream lists or
    the Kokoro model ships (`listed`, asked only when a name has a star), the star replaced by that name; a voice
    the file names itself keeps its own entry. Names that would not be plain voice names are left out, with a
    warning."""
    patterns = [name for name in entries if LISTED in name]
    if not patterns:
        return entries
    upstream_names = listed()
    expanded = {name: entry for name, entry in entries.items() if LISTED not in name}
    for pattern in patterns:
        for upstream_name in upstream_names:
            name = pattern.replace(LISTED, upstream_name)
            if not VOICE_NAME.fullmatch(name):
                log.warning("the listed voice %r is left out: %r is not a plain voice name", upstream_name, name)
            elif name not in expanded:
                field, value = LISTED_FIELDS[entries[pattern].engine]
                expanded[name] = entries[pattern].model_copy(update={field: value.format(upstream_name)})
    if not expanded:
        raise RegistryError(f"{', '.join(patterns)}: the model lists no voices")
    return expanded


def upstream_options(entries: list[VoiceEntry]) -> UpstreamOptions | None:
    """One upstream model's options: each set on any of its voices (the first voice that sets it wins)."""
    if not entries or entries[0].url is None:
        return None
    given = {name: next(value for entry in entries if (value := getattr(entry, name)) is not None)
             for name in UPSTREAM_OPTIONS if any(getattr(entry, name) is not None for entry in entries)}
    given["extra_body"] = json.dumps(given.get("extra_body", {}), sort_keys=True)
    front_end = FrontEnd(**{name: given.pop(name) for name in ("normalize", "lexicon", "ssml") if name in given})
    return UpstreamOptions(entries[0].url.rstrip("/"), language=entries[0].language or "en", front_end=front_end,
                           **given)


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
