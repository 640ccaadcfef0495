"""Admission: what a request is checked for before any work is queued for it.

`validate` is what holds whatever the load (names, speed, text, the caller's tier); `admit` adds
the degrade actions that refuse work up front (shedding low tiers, capping text length). The wait
a request would have in the queue is checked where it is queued (tts_core.scheduling), against
`max_wait_s` from here.
"""

from __future__ import annotations

from .access import Caller, Tier
from .catalogue import Catalogue
from .config import Settings
from .degrade import DegradeController
from .engines import Voice
from .errors import InvalidRequest, Overloaded
from .frontend import NormalizationOptions, SpokenText, normalize_text
from .lexicon import Lexicon
from .metrics import Metrics
from .text import TextError

MIN_SPEED, MAX_SPEED = 0.25, 4.0


class Admission:
    def __init__(self, settings: Settings, degrade: DegradeController, metrics: Metrics):
        self.settings = settings
        self.degrade = degrade
        self.metrics = metrics
        # the operator's pronunciations: a snapshot, replaced whole (one assignment) when the stored ones change
        self.lexicon = Lexicon()

    def validate(self, catalogue: Catalogue, text: str, voice: str | None, model: str | None, speed: float,
                 caller: Caller | None, normalization: NormalizationOptions = NormalizationOptions()
                 ) -> tuple[SpokenText, Voice, str]:
        """Returns what to say (the front end's text for the voice's language, with its map back to the
        input), the voice and the name of its model."""
        voice_info, model_name = catalogue.resolve(voice, model, caller.identity if caller else None)
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise InvalidRequest(f"speed must be between {MIN_SPEED} and {MAX_SPEED}", "speed")
        if speed != 1.0 and not voice_info.speed_control:
            raise InvalidRequest(f"voice {voice_info.name!r} ({voice_info.model}) has no speaking-rate control; "
                                 "send speed 1.0", "speed", "unsupported_value")
        spoken = self._spoken(text, voice_info.language, normalization)
        # Every length limit (this, TTS_MAX_CHARS, degrade mode's cap) is on what the caller sent, not on the
        # spoken text, which number words and symbols make longer than what was written.
        tier = caller.tier if caller else Tier()
        if len(text) > tier.max_chars:
            raise InvalidRequest(f"input is {len(text)} characters long; the {caller.tier_name} tier allows "
                                 f"{tier.max_chars}", "input", "tier_text_limit")
        return spoken, voice_info, model_name

    def _spoken(self, text: str, language: str, normalization: NormalizationOptions) -> SpokenText:
        limit = self.settings.max_chars
        if len(text) > limit:  # checked before the front end, whose work grows with the length
            raise InvalidRequest(f"input is {len(text)} characters long; the limit is {limit}", "input",
                                 "string_above_max_length")
        try:
            return normalize_text(text, language, normalization, self.lexicon)
        except TextError as error:
            raise InvalidRequest(str(error), "input") from None

    def admit(self, catalogue: Catalogue, text: str, voice: str | None, model: str | None, speed: float,
              caller: Caller | None, normalization: NormalizationOptions = NormalizationOptions()
              ) -> tuple[SpokenText, Voice, str]:
        """validate(), and the degrade actions that refuse work up front."""
        state, settings = self.degrade.state, self.degrade.settings
        tier = caller.tier if caller else Tier()
        if "shed" in state.actions and tier.sheddable:
            self.metrics.degrade_actions.labels("shed").inc()
            retry = max(5, round(settings.exit_hold_s))  # the mode lasts at least that long once calm
            raise Overloaded("the server is under heavy load and is serving higher priorities only; "
                             f"retry after {retry} s", retry, "shed_low_priority")
        spoken, voice_info, model_name = self.validate(catalogue, text, voice, model, speed, caller, normalization)
        if "cap_text" in state.actions and len(text) > settings.cap_text_chars:
            self.metrics.degrade_actions.labels("cap_text").inc()
            raise InvalidRequest(f"the server is under heavy load: texts are limited to "
                                 f"{settings.cap_text_chars} characters for now (this one has {len(text)})",
                                 "input", "degraded_text_limit")
        return spoken, voice_info, model_name

    def max_wait_s(self) -> float:
        """The longest predicted queue wait a request is accepted with (operator setting)."""
        return self.degrade.settings.queue_wait_target_s
