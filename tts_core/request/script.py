"""What a request says, once admitted: passages, each in one voice at one speed, with the pause before
it. Plain text is one passage; SSML (tts_core.text.frontend.ssml) may switch voice and rate, and pause."""

from __future__ import annotations

from dataclasses import dataclass

from ..engines import Voice
from ..text.frontend import NormalizationOptions, SpokenText


@dataclass(frozen=True)
class Reading:
    """How a request's text is read: what the front end rewrites, whether it is SSML, and the language the
    caller asked for (a voice is picked for it, or checked against it)."""

    normalization: NormalizationOptions = NormalizationOptions()
    input_type: str = "auto"
    language: str | None = None
    instructions: str | None = None  # how to speak (OpenAI's field): passed on to models that take it


@dataclass(frozen=True)
class Passage:
    spoken: SpokenText
    voice: Voice
    model: str  # the name of the voice's model
    speed: float  # the request's, times an SSML <prosody rate> (the voice's own default applies on top)
    pause_before_s: float | None = None  # None: the usual pause between sentences (none before the first)
    instructions: str | None = None  # the request's, for a model that takes them (an upstream that declares it)
    whole: bool = False  # one piece, never cut into sentences: a conversation a model speaks in one context
    # A stream's first piece is queued as soon as its first sentence is read, before the rest of its text is:
    first_piece_only: bool = False  # the first sentence's passage: queue its first piece, nothing else
    after_lead_of: str | None = None  # the whole text's: its pieces after that first piece (this is what it was read
    # from), if it is still the whole's first piece (else the scheduler says LeadMoved)


@dataclass(frozen=True)
class Script:
    passages: tuple[Passage, ...]
    voice: Voice  # the request's voice: its sample rate is the answer's
    model: str
    pause_after_s: float = 0.0

    @staticmethod
    def plain(spoken: SpokenText, voice: Voice, model: str, speed: float) -> Script:
        return Script((Passage(spoken, voice, model, speed),), voice, model)

    @property
    def key(self) -> tuple:
        """Equal for scripts that sound the same (the cache's key, with the format)."""
        return (self.voice.name, self.pause_after_s,
                *((passage.voice.name, passage.speed, passage.pause_before_s, passage.spoken.text,
                   passage.instructions) for passage in self.passages))
