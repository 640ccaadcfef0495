"""The catalogue: which voices and models are offered, their aliases, and what a request's names mean.

A catalogue is immutable. A registry reload builds a new one beside the old and the service swaps
it in with one assignment, so a request never sees a half-built table (valid voices never answer
"not found" during a reload). A cloned voice's owner or public flag changing makes a new one too.

Cloned voices are private to their owner until an admin makes them public: whether a caller may use
or see one is checked here, where a request's voice is resolved, and a caller who may not gets the
same "not found" as for a voice that does not exist.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from ..config import Settings
from ..engines import Capabilities, ModelSpec, Voice
from ..engines.base import mix_name, voice_mix
from ..errors import ErrorCode, InvalidRequest
from ..text.lexicon import language_code
from .cloning import ClonedVoice

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Catalogue:
    voices: dict[str, tuple[Voice, str]]  # voice name -> (voice, name of the loaded model speaking it)
    models: list[str]  # what callers may pass as `model`
    model_aliases: dict[str, str]
    voice_aliases: dict[str, str]
    default_voice: str
    clones: dict[str, ClonedVoice] = field(default_factory=dict)  # the cloned voices among `voices`
    language_voices: dict[str, str] = field(default_factory=dict)  # a language's voice, when a request names none
    capabilities: dict[str, Capabilities] = field(default_factory=dict)  # loaded-model name -> what it can do

    @classmethod
    def build(cls, specs: Iterable[ModelSpec], settings: Settings,
              clones: Mapping[str, ClonedVoice] | None = None) -> Catalogue:
        specs = list(specs)
        voices: dict[str, tuple[Voice, str]] = {}
        for spec in specs:
            for voice in spec.voices:
                voices.setdefault(voice.name, (voice, spec.name))
        if not voices:
            raise RuntimeError("no voices could be loaded")
        models = sorted({voice.model for voice, _ in voices.values()})
        default = settings.default_voice if settings.default_voice in voices else next(iter(voices))
        listed = _cloned(specs, clones or {}, set(voices))
        voices.update({name: (voice, clone.model) for name, (voice, clone) in listed.items()})
        return cls(voices, models, _valid_aliases(settings.model_aliases, set(models), "model"),
                   _valid_aliases(settings.voice_aliases, set(voices), "voice"), default,
                   {name: clone for name, (_, clone) in listed.items()},
                   _valid_aliases(_language_voices(specs, settings), set(voices), "language voice"),
                   {spec.name: spec.capabilities for spec in specs})

    def visible(self, name: str, caller: str | None) -> bool:
        """Whether the caller ("key:<id>", "ip:<address>"; None: nobody in particular) may see and use the
        voice: every voice but another caller's private cloned one."""
        clone = self.clones.get(name)
        return clone is None or clone.usable_by(caller)

    def visible_voices(self, caller: str | None = None) -> list[tuple[Voice, str]]:
        """(voice, its model's name) of every voice the caller may use."""
        return [entry for name, entry in self.voices.items() if self.visible(name, caller)]

    def voice_list(self, caller: str | None = None) -> list[Voice]:
        return [voice for voice, _ in self.visible_voices(caller)]

    def resolve_model(self, name: str) -> str:
        model = self.model_aliases.get(name, name)
        if model not in self.models:
            known = ", ".join(self.models + sorted(self.model_aliases))
            raise InvalidRequest(f"model {name!r} does not exist; available: {known}", "model",
                                 ErrorCode.MODEL_NOT_FOUND)
        return model

    def resolve_voice(self, name: str, model: str | None = None, caller: str | None = None) -> tuple[Voice, str]:
        """The voice and the name of the model that speaks it, if the caller may use it."""
        target = self.voice_aliases.get(name, name)
        found = (self.voices.get(target) if self.visible(target, caller) else None) or self._mixed(target, caller)
        if found is None:
            known = ", ".join(sorted(voice.name for voice in self.voice_list(caller)) + sorted(self.voice_aliases))
            raise InvalidRequest(f"voice {name!r} does not exist; available: {known}", "voice",
                                 ErrorCode.VOICE_NOT_FOUND)
        if model is not None and found[0].model != model:
            raise InvalidRequest(f"voice {name!r} belongs to model {found[0].model!r}, not {model!r}", "voice",
                                 ErrorCode.VOICE_MODEL_MISMATCH)
        return found

    def _mixed(self, name: str, caller: str | None) -> tuple[Voice, str] | None:
        """A mix of one model's voices ("af_bella+af_sky", "af_bella(2)+af_sky(1)") where that model mixes them,
        as a voice of its own (the first part's language); None where the name is no mix."""
        try:
            parts = voice_mix(name)
        except ValueError as error:
            raise InvalidRequest(f"voice {name!r}: {error}", "voice", ErrorCode.VOICE_NOT_FOUND) from None
        if parts is None:
            return None
        found, named = [], []
        for part, weight in parts:
            target = self.voice_aliases.get(part, part)
            entry = self.voices.get(target) if self.visible(target, caller) else None
            if entry is None:
                raise InvalidRequest(f"voice {name!r}: {part!r} is not a voice", "voice", ErrorCode.VOICE_NOT_FOUND)
            found.append(entry)
            named.append((target, weight))
        engines = {engine for _, engine in found}
        if len(engines) > 1:
            raise InvalidRequest(f"voice {name!r} mixes voices of several models ({', '.join(sorted(engines))}); a "
                                 "mix is of one model's voices", "voice", ErrorCode.VOICE_NOT_FOUND)
        engine = found[0][1]
        if not self.capabilities.get(engine, Capabilities()).mixes_voices:
            raise InvalidRequest(f"voice {name!r}: model {found[0][0].model!r} does not mix voices", "voice",
                                 ErrorCode.VOICE_NOT_FOUND)
        return replace(found[0][0], name=mix_name(named)), engine

    def resolve(self, voice: str | None, model: str | None = None, caller: str | None = None) -> tuple[Voice, str]:
        """The voice a request names (or the default) and the name of its model. A model alias (OpenAI's
        names) accepts any voice; a model named as itself, only its own voices."""
        model_id = self.resolve_model(model) if model is not None else None
        return self.resolve_voice(voice or self.default_voice, None if model in self.model_aliases else model_id,
                                  caller)


    def voice_for_language(self, language: str, model: str | None = None, caller: str | None = None
                           ) -> tuple[Voice, str]:
        """The voice for a request that names a language and no voice: the operator's for that language
        (TTS_LANGUAGE_VOICES), else the default voice if it speaks it, else the first that does (of the
        model asked for, if it names one of ours)."""
        model_id = self.resolve_model(model) if model is not None else None
        family = None if model in self.model_aliases else model_id
        wanted = [self.language_voices.get(language), self.language_voices.get(language_code(language)),
                  self.default_voice, *(voice.name for voice in self.voice_list(caller))]
        for name in wanted:
            entry = self.voices.get(name) if name and self.visible(name, caller) else None
            if entry is not None and speaks(entry[0], language) and family in (None, entry[0].model):
                return entry
        offered = sorted({voice.language for voice in self.voice_list(caller)})
        raise InvalidRequest(f"no voice speaks {language!r}; the languages offered are {', '.join(offered)}",
                             "language", ErrorCode.UNSUPPORTED_LANGUAGE)


def speaks(voice: Voice, language: str) -> bool:
    """A voice speaks "en" if its language is English of any region; "en-US" if it is US English, or English
    of no region said."""
    wanted, own = language.replace("-", "_").lower(), voice.language.replace("-", "_").lower()
    return own == wanted or language_code(own) == language_code(wanted) and ("_" not in wanted or "_" not in own)


def _language_voices(specs: list[ModelSpec], settings: Settings) -> dict[str, str]:
    """Each language's voice: the registry's `language_default` voices, then TTS_LANGUAGE_VOICES over them."""
    marked = {language_code(voice.language): voice.name for spec in specs for voice in spec.voices
              if voice.name in spec.language_defaults}
    return {**marked, **settings.language_voices}


def _cloned(specs: list[ModelSpec], clones: Mapping[str, ClonedVoice], taken: set[str]
            ) -> dict[str, tuple[Voice, ClonedVoice]]:
    """The cloned voices whose model is offered, described like that model's own voices. A configured
    voice keeps its name: a registry reload may bring one named like a cloned voice."""
    templates = {spec.name: spec.voices[0] for spec in specs if spec.voices}
    listed = {}
    for name, clone in clones.items():
        template = templates.get(clone.model)
        if template is None or name in taken:
            log.warning("cloned voice %r is not offered: its model %r is not configured, or the name is taken",
                        name, clone.model)
            continue
        listed[name] = (replace(template, name=name, speaker=None, speed=1.0), clone)  # speaks the model's language
    return listed


def _valid_aliases(aliases: dict[str, str], targets: set[str], kind: str) -> dict[str, str]:
    valid = {alias: target for alias, target in aliases.items() if target in targets}
    for alias in aliases.keys() - valid.keys():
        log.warning("ignoring %s alias %r: %r is not installed", kind, alias, aliases[alias])
    return valid
