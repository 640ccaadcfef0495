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

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Tag, ValidationError, model_validator

from ..engines import ModelSpec
from ..engines.base import VOICE_NAME, Engine, EngineUnavailable
from ..engines.kind import VoiceOptions
from ..engines.kinds import KINDS
from ..engines.kinds.piper import piper_options

if TYPE_CHECKING:
    from ..config import Settings

LISTED = "*"  # in a name: one voice for each the upstream lists (or the Kokoro model ships), its name for the star
log = logging.getLogger(__name__)


class RegistryError(EngineUnavailable):
    """The registry file cannot be used; the message names the file and the fault."""


class VoiceEntry(BaseModel):
    """An entry that is no kind's (its `engine` names none, or it is no mapping): validated only to say so, naming
    the kinds (as a Literal would). Every other entry is its kind's options (Entry)."""

    model_config = ConfigDict(extra="allow")

    engine: Literal[tuple(KINDS)]  # type: ignore[valid-type]


UNKNOWN = "unknown"


def _kind_of(entry: Any) -> str:
    engine = entry.get("engine") if isinstance(entry, dict) else getattr(entry, "engine", None)
    return engine if engine in KINDS else UNKNOWN


def _only_for_its_kind(entry: Any) -> Any:
    """An entry giving another kind's options is refused naming them and the kinds they are for."""
    if not isinstance(entry, dict) or entry.get("engine") not in KINDS:
        return entry
    own = KINDS[entry["engine"]].options.model_fields
    others = {name: [kind.name for kind in KINDS.values() if name in kind.options.model_fields]
              for name in entry if name not in own and entry[name] is not None}
    given = {name: owners for name, owners in others.items() if owners}
    if given:
        owners = sorted({owner for names in given.values() for owner in names})
        raise ValueError(f"{', '.join(_in_field_order(given))}: only for engine: {', '.join(owners)}")
    return entry


def _in_field_order(names) -> list[str]:
    order = [name for kind in KINDS.values() for name in kind.options.model_fields]
    return sorted(names, key=order.index)


Entry = Annotated[
    Union[tuple(Annotated[kind.options, Tag(name)] for name, kind in KINDS.items())  # noqa: UP007
          + (Annotated[VoiceEntry, Tag(UNKNOWN)],)],
    Discriminator(_kind_of), BeforeValidator(_only_for_its_kind)]


class Registry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    voices: dict[str, Entry] = {}

    @model_validator(mode="after")
    def _listed_names(self):
        for name, entry in self.voices.items():
            if LISTED not in name:
                continue
            field = (entry.listed_as or ("",))[0]
            if not field or getattr(entry, field) is not None or name.count(LISTED) > 1:
                raise ValueError(f"{name}: a name with {LISTED} stands for every voice an upstream lists or a Kokoro "
                                 f"model ships (one {LISTED}; engine: upstream with no upstream_voice, or kokoro "
                                 "with no prompt)")
        return self

    def by_model(self) -> dict[tuple[str, str, str | None], dict[str, VoiceOptions]]:
        """(engine, model, upstream url) -> its voices: one loaded engine each."""
        grouped: dict[tuple[str, str, str | None], dict[str, VoiceOptions]] = {}
        for name, entry in self.voices.items():
            grouped.setdefault((entry.engine, entry.model, entry.server), {})[name] = entry
        return grouped


def with_listed(entries: dict[str, VoiceOptions], listed: Callable[[], list[str]]) -> dict[str, VoiceOptions]:
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
                field, value = entries[pattern].listed_as
                expanded[name] = entries[pattern].model_copy(update={field: value.format(upstream_name)})
    if not expanded:
        raise RegistryError(f"{', '.join(patterns)}: the model lists no voices")
    return expanded


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
        loc = first["loc"]
        if loc[:1] == ("voices",) and len(loc) > 2:  # ("voices", name, its kind's tag, field...): the tag is no field
            loc = loc[:2] + loc[3:]
        where = ".".join(str(part) for part in loc)
        raise RegistryError(f"voices file {path}: {where}: {first['msg']}") from None


def model_specs(settings: Settings) -> list[ModelSpec]:
    """The bundled Piper voice and the voices folder (loaded now, always kept), then the registry's
    models (TTS_VOICES_FILE), read but loaded only when pinned or first asked for. A registry model
    that is not there stops the start with a message that names it."""
    from ..engines.piper import load_piper_engines

    folder = load_piper_engines(settings.voices_path, **piper_options(settings))
    return [ModelSpec.loaded(engine) for engine in folder] + registry_specs(settings, {e.name for e in folder})


def load_voice_engine(settings: Settings, voice: str) -> Engine:
    """The configured model that speaks `voice`, loaded on its own (no server: the benchmarks)."""
    specs = model_specs(settings)
    for spec in specs:
        if voice in {known.name for known in spec.voices}:
            return spec.load()
    known = sorted(known.name for spec in specs for known in spec.voices)
    raise EngineUnavailable(f"no configured model speaks the voice {voice!r}; configured: {', '.join(known)}")


def registry_specs(settings: Settings, taken: set[str]) -> list[ModelSpec]:
    """The registry's models, each described by its kind (tts_core.engines.kinds), none loaded."""
    specs, names = [], set(taken)
    for (engine, model, _), entries in read_registry(settings.voices_file).by_model().items():
        kind = KINDS[engine]
        name = _unique(model.rstrip("/").rsplit("/", 1)[-1].removesuffix(".onnx"), names)
        names.add(name)
        try:
            if kind.lists is not None:
                entries = with_listed(entries, lambda: kind.lists(model, entries))  # noqa: B023 (asked at once)
            described, capabilities, load = kind.describe(model, entries, name, settings)
        except ImportError as missing:  # torch (or kokoro) is not installed: the bundled Piper voice needs none of it
            raise EngineUnavailable(
                f"the {engine} model {model!r} needs the Python package {missing.name!r}, which is not installed "
                f"({kind.install_hint(missing.name)})") from None
        pinned = any(entry.pinned for entry in entries.values())
        defaults = tuple(name for name, entry in entries.items() if entry.language_default)
        specs.append(ModelSpec(name, described, load, pinned, (engine, model, tuple(entries.items())), registry=True,
                               language_defaults=defaults, capabilities=capabilities))
    return specs


def _unique(name: str, taken: set[str]) -> str:
    candidate, number = name, 2
    while candidate in taken:
        candidate, number = f"{name}-{number}", number + 1
    return candidate
