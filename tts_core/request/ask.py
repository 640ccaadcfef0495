"""What a caller asks the service for, whatever the surface it came through: one frozen record that each surface
(an HTTP route, the WebSocket, Wyoming, the UI, a job) builds once from its input, and `SpeechService.answer`
answers whole (encoded) or as a stream."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .access import Caller
from .dialogue import ScriptText
from .script import Reading


@dataclass(frozen=True)
class Ask:
    text: str = ""  # what to say (a dialogue's is its script)
    voice: str | None = None  # None: the model's (or the server's) default voice
    model: str | None = None
    speed: float = 1.0
    response_format: str = "mp3"  # a stream's pieces are encoded in it (pcm: raw samples, as Wyoming plays them)
    sample_rate: int | None = None  # resampled to it, if asked
    reading: Reading = Reading()  # how the text is read: normalization, SSML, language, instructions
    words: bool = False  # when each word of the input is spoken (captions): never cached
    stream: bool = False  # the answer as its sentences (a dialogue's turns) are made
    caller: Caller | None = None  # who asks: their tier's limits and priority
    script: ScriptText | None = None  # a dialogue: its turns, in place of the text
    voices: Mapping[str, str] = field(default_factory=dict)  # a dialogue's cast: speaker -> voice

    @property
    def dialogue(self) -> bool:
        return self.script is not None
