"""The catalogue: which voices and models are offered, their aliases, and what a request's names mean.

A catalogue is immutable. A registry reload builds a new one beside the old and the service swaps
it in with one assignment, so a request never sees a half-built table (valid voices never answer
"not found" during a reload).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from .config import Settings
from .engines import ModelSpec, Voice
from .errors import InvalidRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Catalogue:
    voices: dict[str, tuple[Voice, str]]  # voice name -> (voice, name of the loaded model speaking it)
    models: list[str]  # what callers may pass as `model`
    model_aliases: dict[str, str]
    voice_aliases: dict[str, str]
    default_voice: str

    @classmethod
    def build(cls, specs: Iterable[ModelSpec], settings: Settings) -> Catalogue:
        voices: dict[str, tuple[Voice, str]] = {}
        for spec in specs:
            for voice in spec.voices:
                voices.setdefault(voice.name, (voice, spec.name))
        if not voices:
            raise RuntimeError("no voices could be loaded")
        models = sorted({voice.model for voice, _ in voices.values()})
        default = settings.default_voice if settings.default_voice in voices else next(iter(voices))
        return cls(voices, models, _valid_aliases(settings.model_aliases, set(models), "model"),
                   _valid_aliases(settings.voice_aliases, set(voices), "voice"), default)

    def voice_list(self) -> list[Voice]:
        return [voice for voice, _ in self.voices.values()]

    def resolve_model(self, name: str) -> str:
        model = self.model_aliases.get(name, name)
        if model not in self.models:
            known = ", ".join(self.models + sorted(self.model_aliases))
            raise InvalidRequest(f"model {name!r} does not exist; available: {known}", "model", "model_not_found")
        return model

    def resolve_voice(self, name: str, model: str | None = None) -> tuple[Voice, str]:
        """The voice and the name of the model that speaks it."""
        found = self.voices.get(self.voice_aliases.get(name, name))
        if found is None:
            known = ", ".join(sorted(self.voices) + sorted(self.voice_aliases))
            raise InvalidRequest(f"voice {name!r} does not exist; available: {known}", "voice", "voice_not_found")
        if model is not None and found[0].model != model:
            raise InvalidRequest(f"voice {name!r} belongs to model {found[0].model!r}, not {model!r}", "voice",
                                 "voice_model_mismatch")
        return found

    def resolve(self, voice: str | None, model: str | None = None) -> tuple[Voice, str]:
        """The voice a request names (or the default) and the name of its model. A model alias (OpenAI's
        names) accepts any voice; a model named as itself, only its own voices."""
        model_id = self.resolve_model(model) if model is not None else None
        return self.resolve_voice(voice or self.default_voice, None if model in self.model_aliases else model_id)


def _valid_aliases(aliases: dict[str, str], targets: set[str], kind: str) -> dict[str, str]:
    valid = {alias: target for alias, target in aliases.items() if target in targets}
    for alias in aliases.keys() - valid.keys():
        log.warning("ignoring %s alias %r: %r is not installed", kind, alias, aliases[alias])
    return valid
