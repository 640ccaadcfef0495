"""Request bodies of the OpenAI-compatible routes."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from tts_core.audio.encoding import FORMATS, MAX_RATE, MIN_RATE
from tts_core.errors import ErrorCode
from tts_core.request.script import Reading
from tts_core.text.frontend import NormalizationOptions, requested
from tts_core.validation import VoiceName

ResponseFormat = Literal[tuple(FORMATS)]  # type: ignore[valid-type]


class VoiceRef(BaseModel):
    """OpenAI also accepts a voice as an object: {"id": "..."}."""

    id: VoiceName


# Types are strict, as OpenAI's are: a boolean is only true or false, a number only a number (an
# integer is a number: "speed": 1 is 1.0), a string only a string. Lax parsing took "speed": true
# as 1.0 and "stream": "yes" as a request to stream.
STRICT = ConfigDict(strict=True)


class SpeechRequest(BaseModel):
    model_config = STRICT | ConfigDict(extra="ignore")  # unknown OpenAI fields are ignored, as OpenAI SDKs add them

    model: str = Field(min_length=1, max_length=128, description="A model id or alias (see /v1/models)")
    input: str = Field(description="The text to speak (an empty one: 400 empty_input)")
    language: str | None = Field(None, min_length=2, max_length=35, pattern=r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})*$",
                                 description="BCP 47 or ISO 639 (en, en-US, fr): with no voice, picks one that "
                                             "speaks it; with a voice of another language, a 400")
    voice: VoiceName | VoiceRef | None = Field(
        None, validate_default=True,
        description="A voice name or alias (see /v1/audio/voices); required unless `language` picks one")
    response_format: ResponseFormat = "mp3"
    sample_rate: int | None = Field(None, ge=MIN_RATE, le=MAX_RATE, description="resample the answer to this rate "
                                    "(Hz); default: the format's (pcm, opus: 24000) or else the voice's")
    speed: float = Field(1.0, ge=0.25, le=4.0)
    instructions: str | None = Field(None, max_length=4096,
                                     description="How to speak (tone, emotion): passed on to upstream models that "
                                                 "take it (docs/upstream.md); the others ignore it")
    stream: bool = Field(False, description="send audio as it is synthesized (chunked transfer)")
    stream_format: Literal["audio", "sse"] | None = Field(
        None, description="'audio': stream raw audio; 'sse': server-sent events with base64 audio deltas")
    normalize: bool = Field(True, description="false: speak the input as written (no markdown, number or "
                                              "symbol reading); the same as normalization_options.normalize")
    normalization_options: NormalizationOptions | None = Field(
        None, description="what the text front end rewrites, one switch per kind (all on by default)")
    input_type: Literal["auto", "text", "ssml"] = Field(
        "auto", description="'ssml': the input is SSML (<speak>...</speak>); 'text': plain text or markdown; "
                            "'auto': SSML if the input starts with <speak>")

    @field_validator("voice")
    @classmethod
    def _voice_or_language(cls, voice, info: ValidationInfo):
        """A voice, as OpenAI requires, unless a language (checked before it) asks for one to be picked."""
        if voice is None and not info.data.get("language"):
            raise PydanticCustomError(ErrorCode.MISSING, "Field required")
        return voice

    @property
    def voice_name(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice

    def normalization(self) -> NormalizationOptions:
        return requested(self.normalization_options, self.normalize)

    def reading(self) -> Reading:
        return Reading(self.normalization(), self.input_type, self.language, self.instructions)


class CaptionedSpeechRequest(SpeechRequest):
    """POST /v1/audio/speech/captioned: speech with when each word of the input is spoken."""

    timestamps_format: Literal["json", "srt", "vtt"] = Field(
        "json", description="'json': the audio (base64) and its words; 'srt' or 'vtt': subtitles only")
    return_timestamps: bool = Field(True, description="Accepted for Kokoro-FastAPI's clients; the words always come")


class JobRequest(SpeechRequest):
    """POST /v1/audio/jobs: a speech request to run in the background."""

    priority: int = Field(0, ge=-10, le=10, description="order among the caller's own jobs (higher first); "
                                                         "never above the caller's tier")
    deadline_s: float | None = Field(None, gt=0, description="seconds after queueing by which the job must be done, "
                                     "else it fails (default and most: the server's TTS_JOB_DEADLINE_S)")


class BatchRequest(BaseModel):
    """POST /v1/audio/speech/batch. Items are checked one by one: a bad item fails alone."""

    model_config = STRICT | ConfigDict(extra="forbid")

    items: list[dict] = Field(min_length=1, description="speech request bodies, as for /v1/audio/speech")
    mode: Literal["zip", "jobs"] = Field("zip", description="'zip': the audio files in one zip with a manifest; "
                                                            "'jobs': one job per item")


class SocketMessage(BaseModel):
    """One client message on the speech WebSocket: text to buffer and/or settings for what follows.
    Strict for JSON messages; the query string's settings are strings, so they are read lax."""

    model_config = STRICT | ConfigDict(extra="forbid")

    type: Literal["speech"] = "speech"
    text: str | None = Field(None, validation_alias=AliasChoices("text", "input"))
    voice: VoiceName | None = None
    model: str | None = Field(None, min_length=1, max_length=128)
    speed: float | None = Field(None, ge=0.25, le=4.0)
    response_format: ResponseFormat | None = None
    sample_rate: int | None = Field(None, ge=MIN_RATE, le=MAX_RATE)
    normalize: bool | None = None
    normalization_options: NormalizationOptions | None = None
    flush: bool = Field(True, description="speak the buffered text now")
