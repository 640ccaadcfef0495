"""Admission: what a request is checked for before any work is queued for it.

`validate` is what holds whatever the load (names, speed, text, the caller's tier); `admit` adds
the degrade actions that refuse work up front (shedding low tiers, capping text length). Every refusal that needs
none of the text read (`check`: names, speed, lengths, degrade mode, word timing) is decided before the front end
reads any of it; a stream's first sentence may then be read ahead of the rest (`lead`). The wait a request would
have in the queue is checked where it is queued (tts_core.request.dispatch), against `wait_target` from here.
"""

from __future__ import annotations

from dataclasses import replace

from ..config import Settings
from ..engines import Capabilities, Voice
from ..engines.contract import FrontEnd
from ..errors import Degraded, ErrorCode, InvalidRequest
from ..ops.metrics import Metrics
from ..scheduler.queue import WaitTarget, most_per_text, tier_share
from ..text.chunks import TextError, leading_sentence
from ..text.frontend import (
    NormalizationOptions,
    UnspeakableScript,
    normalize_text,
    nothing_to_say,
    says_something,
    spoken_parts,
    ssml,
)
from ..text.frontend.scripts import writes
from ..text.lexicon import Lexicon
from ..voices.catalogue import Catalogue, speaks
from .access import Caller, Tier
from .operating import DegradeAction, DegradeMode
from .script import Passage, Reading, Script

MIN_SPEED, MAX_SPEED = 0.25, 4.0


class Admission:
    def __init__(self, settings: Settings, degrade: DegradeMode, metrics: Metrics):
        self.settings = settings
        self.degrade = degrade
        self.metrics = metrics
        # the operator's pronunciations: a snapshot, replaced whole (one assignment) when the stored ones change
        self.lexicon = Lexicon()

    def validate(self, catalogue: Catalogue, text: str, voice: str | None, model: str | None, speed: float,
                 caller: Caller | None, reading: Reading = Reading()) -> Script:
        """What to say (the front end's text for each voice's language, with its map back to the input),
        in which voices, at what speeds."""
        voice_info, model_name = self._named(catalogue, text, voice, model, speed, caller, reading)
        return self._read(catalogue, text, voice_info, model_name, speed, caller, reading)

    def _named(self, catalogue: Catalogue, text: str, voice: str | None, model: str | None, speed: float,
               caller: Caller | None, reading: Reading) -> tuple[Voice, str]:
        """The request's voice and model, checked with its speed and its length as sent (TTS_MAX_CHARS, the
        tier's): cheap, before the front end, whose work grows with the text."""
        voice_info, model_name = _voice(catalogue, voice, model, caller, reading.language)
        _check_speed(voice_info, speed, "speed")
        limit = self.settings.max_chars
        if len(text) > limit:
            raise InvalidRequest(f"input is {len(text)} characters long; the limit is {limit}", "input",
                                 ErrorCode.STRING_ABOVE_MAX_LENGTH)
        tier = caller.tier if caller else Tier()
        if len(text) > tier.max_chars:
            raise InvalidRequest(f"input is {len(text)} characters long; the {caller.tier_name} tier allows "
                                 f"{tier.max_chars}", "input", ErrorCode.TIER_TEXT_LIMIT)
        return voice_info, model_name

    def _read(self, catalogue: Catalogue, text: str, voice_info: Voice, model_name: str, speed: float,
              caller: Caller | None, reading: Reading) -> Script:
        """The whole text through the front end, and the limit on what it says."""
        is_ssml = reading.input_type == "ssml" or (reading.input_type == "auto" and ssml.is_ssml(text))
        try:
            if is_ssml and _front_end(catalogue, model_name).ssml:
                script = self._ssml_script(catalogue, text, voice_info, model_name, speed, caller,
                                           reading.normalization)
            else:  # plain text; or SSML for a model that reads it itself (an upstream): as written
                plain = NormalizationOptions(normalize=False) if is_ssml else reading.normalization
                spoken = normalize_text(text, voice_info.language, *self._reading(catalogue, model_name, plain))
                script = Script.plain(spoken, voice_info, model_name, speed)
        except UnspeakableScript as error:
            raise _unspeakable(error, voice_info, catalogue, caller) from None
        except TextError as error:
            raise InvalidRequest(str(error), "input", error.code) from None
        # The work is the spoken text's, which number words make longer than what was written ("9" * 4,900 says
        # 24,500 characters): bounded here, before any of it is queued.
        spoken = sum(len(passage.spoken.text) for passage in script.passages)
        if spoken > self.settings.max_spoken_chars:
            raise InvalidRequest(f"input is {spoken} characters long once its numbers and symbols are said as words; "
                                 f"the limit is {self.settings.max_spoken_chars}", "input",
                                 ErrorCode.SPOKEN_TEXT_ABOVE_MAX_LENGTH)
        return _instructed(script, reading)

    def _reading(self, catalogue: Catalogue, model: str, normalization: NormalizationOptions
                 ) -> tuple[NormalizationOptions, Lexicon]:
        """The front end's options and lexicon for a model: the request's and the operator's, unless the model
        (an upstream that reads text its own way) switches them off."""
        front_end = _front_end(catalogue, model)
        return (normalization if front_end.normalize else NormalizationOptions(normalize=False),
                self.lexicon if front_end.lexicon else Lexicon())

    def _ssml_script(self, catalogue: Catalogue, text: str, voice_info: Voice, model_name: str, speed: float,
                     caller: Caller | None, normalization: NormalizationOptions) -> Script:
        """An SSML document's passages, each in its voice's language; a passage with nothing to say leaves
        its pause to the next."""
        parsed = ssml.parse(text)
        passages, carried = [], None
        for raw in parsed.passages:
            voice, model = voice_info, model_name
            if raw.voice is not None:
                try:
                    voice, model = catalogue.resolve_voice(raw.voice, None, caller.identity if caller else None)
                except InvalidRequest as error:
                    raise InvalidRequest(f"<voice> at {raw.at}: {error.message}", "input", error.code) from None
            _check_speed(voice, speed * raw.rate, "input", f"<prosody rate> at {raw.at}: ")
            spoken = spoken_parts(raw.parts, voice.language, *self._reading(catalogue, model, normalization))
            pauses = [pause for pause in (carried, raw.pause_before_s) if pause is not None]
            pause = sum(pauses) if pauses else None
            if not says_something(spoken.text):
                carried = pause
                continue
            passages.append(Passage(spoken, voice, model, speed * raw.rate, pause))
            carried = None
        if not passages:
            raise nothing_to_say(text, voice_info.language)
        return Script(tuple(passages), voice_info, model_name, parsed.pause_after_s + (carried or 0))

    def admit(self, catalogue: Catalogue, text: str, voice: str | None, model: str | None, speed: float,
              caller: Caller | None, reading: Reading = Reading(), words: bool = False) -> Script:
        """The request compiled: the refusals decided on it as sent (`check`), then the whole text read. Words
        (`words`) are never refused: a voice whose model does not time them has them found in its audio."""
        voice_info, model_name = self.check(catalogue, text, voice, model, speed, caller, reading, words)
        return self._read(catalogue, text, voice_info, model_name, speed, caller, reading)

    def check(self, catalogue: Catalogue, text: str, voice: str | None, model: str | None, speed: float,
              caller: Caller | None, reading: Reading = Reading(), words: bool = False) -> tuple[Voice, str]:
        """Every refusal that needs none of the text read, cheap whatever its length, decided before any of it is:
        degrade mode's shedding, the voice, model and speed, the length limits (the server's, the tier's,
        degrade mode's cap). Returns the voice and its model's name."""
        state, settings = self.degrade.state, self.degrade.settings
        tier = caller.tier if caller else Tier()
        if DegradeAction.SHED in state.actions and tier.sheddable:
            self.metrics.degrade_actions.labels(DegradeAction.SHED).inc()
            retry = self._retry_after_s()
            raise Degraded("the server is under heavy load and is serving higher priorities only; "
                           f"retry after {retry} s", retry, ErrorCode.SHED_LOW_PRIORITY)
        voice_info, model_name = self._named(catalogue, text, voice, model, speed, caller, reading)
        if DegradeAction.CAP_TEXT in state.actions and len(text) > settings.cap_text_chars:
            self.metrics.degrade_actions.labels(DegradeAction.CAP_TEXT).inc()
            retry = self._retry_after_s()
            raise Degraded(f"the server is under heavy load: texts of up to {settings.cap_text_chars} characters "
                           f"are accepted now (this one has {len(text)}); longer ones again in about {retry} s",
                           retry, ErrorCode.DEGRADED_TEXT_LIMIT, "input")
        return voice_info, model_name

    def lead(self, catalogue: Catalogue, text: str, voice: str | None, model: str | None, speed: float,
             caller: Caller | None, reading: Reading = Reading(), words: bool = False) -> Script | None:
        """For a stream: `check`, then the text's first sentence read alone, so that its first piece is queued
        before the rest is read (the whole text's reading, `admit`, still decides every refusal, and whether
        that piece is still its first). None where there is nothing to read ahead: an SSML document, a text of
        one sentence, or a first sentence that says nothing alone."""
        voice_info, model_name = self.check(catalogue, text, voice, model, speed, caller, reading, words)
        head = leading_sentence(text)
        if head is None or reading.input_type == "ssml" or (reading.input_type == "auto" and ssml.is_ssml(text)):
            return None
        try:
            spoken = normalize_text(head, voice_info.language,
                                    *self._reading(catalogue, model_name, reading.normalization))
        except TextError:  # the whole text's reading says why, if it is a refusal
            return None
        return _instructed(Script.plain(spoken, voice_info, model_name, speed), reading)

    def most_pieces_queued(self, caller: Caller | None) -> int:
        """The most pieces of one request of this caller's that could ever wait in a model's queue at once (the
        queue's size, the tier's share of it, TTS_MAX_QUEUE_PER_CALLER): a script of more is refused up front."""
        size, tier = self.settings.max_queue, caller.tier if caller else Tier()
        return most_per_text(size, self.settings.max_queue_per_caller, caller.identity if caller else "",
                             tier_share(tier.max_queue_share, size))

    def _retry_after_s(self) -> int:
        """When a degrade-mode refusal may pass: the mode's expected end, at least a second."""
        return max(1, round(self.degrade.expected_end_s()))

    def wait_target(self) -> WaitTarget:
        """The longest predicted queue wait a request is accepted with, usually and in an overload
        (operator settings)."""
        settings = self.degrade.settings
        return WaitTarget(settings.queue_wait_target_s, settings.overload_wait_target_s)


def _front_end(catalogue: Catalogue, model: str) -> FrontEnd:
    return catalogue.capabilities.get(model, Capabilities()).front_end


def _voice(catalogue: Catalogue, voice: str | None, model: str | None, caller: Caller | None,
           language: str | None) -> tuple[Voice, str]:
    """The request's voice and its model's name: the one it names (which must speak its language, if it
    names one too), else the one for its language, else the default."""
    identity = caller.identity if caller else None
    if voice is None and language:
        return catalogue.voice_for_language(language, model, identity)
    voice_info, model_name = catalogue.resolve(voice, model, identity)
    if language and not speaks(voice_info, language):
        raise InvalidRequest(f"voice {voice_info.name!r} speaks {voice_info.language}, not {language}; leave out "
                             "the voice to get one that does", "language", ErrorCode.LANGUAGE_MISMATCH)
    return voice_info, model_name


def _unspeakable(error: UnspeakableScript, voice: Voice, catalogue: Catalogue, caller: Caller | None
                 ) -> InvalidRequest:
    """The refusal of a text in scripts the voice cannot speak, naming its language and the voices that could."""
    able = sorted(other.name for other in catalogue.voice_list(caller.identity if caller else None)
                  if writes(other.language, error.scripts))
    could = f"voices that can: {', '.join(able[:10])}" if able else "no voice here can"
    return InvalidRequest(f"{error.written_in}, which voice {voice.name!r} (language {voice.language}) cannot speak; "
                          f"{could}", "input", error.code)


def _instructed(script: Script, reading: Reading) -> Script:
    """The script with the request's instructions on each passage (for the models that take them)."""
    if not reading.instructions:
        return script
    return replace(script, passages=tuple(replace(passage, instructions=reading.instructions)
                                          for passage in script.passages))


def _check_speed(voice: Voice, speed: float, param: str, where: str = "") -> None:
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise InvalidRequest(f"{where}speed must be between {MIN_SPEED} and {MAX_SPEED} (it is {speed:g})", param)
    if speed != 1.0 and not voice.speed_control:
        raise InvalidRequest(f"{where}voice {voice.name!r} ({voice.model}) has no speaking-rate control; "
                             "send speed 1.0", param, ErrorCode.UNSUPPORTED_VALUE)
