"""Request bodies of the OpenAI-compatible routes."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tts_core.audio import FORMATS

ResponseFormat = Literal[tuple(FORMATS)]  # type: ignore[valid-type]


class VoiceRef(BaseModel):
    """OpenAI also accepts a voice as an object: {"id": "..."}."""

    id: str = Field(min_length=1, max_length=128)


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # unknown OpenAI fields are ignored, as OpenAI SDKs add them

    model: str = Field(min_length=1, max_length=128, description="A model id or alias (see /v1/models)")
    input: str = Field(min_length=1, description="The text to speak")
    voice: str | VoiceRef = Field(description="A voice name or alias (see /v1/audio/voices)")
    response_format: ResponseFormat = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    instructions: str | None = Field(None, max_length=4096,
                                     description="Accepted for compatibility; Piper voices ignore it")
    stream_format: Literal["audio", "sse"] | None = None

    @property
    def voice_name(self) -> str:
        return self.voice if isinstance(self.voice, str) else self.voice.id
