"""POST /v1/audio/dialogue: a script of several speakers' turns as one recording, whole or streamed; and with
captions by speaker, POST /v1/audio/dialogue/captioned (docs/api.md, "Dialogue"). A dialogue as a job (POST
/v1/audio/dialogue/jobs) is one of api/jobs.py's routes, with this body and the job's options."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Literal

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from tts_core.audio.encoding import MAX_RATE, MIN_RATE
from tts_core.errors import ErrorCode, InvalidRequest
from tts_core.request.access import Caller, RateLimitState
from tts_core.request.ask import Ask
from tts_core.request.captions import subtitles, word_timings
from tts_core.request.dialogue import MAX_NAME_CHARS, MAX_SPEAKERS, listed_turn_fault
from tts_core.request.script import Reading
from tts_core.service import SpeechService, SpokenAudio
from tts_core.text.frontend import NormalizationOptions, requested
from tts_core.validation import VoiceName

from .errors import stream_failure
from .schemas import STRICT, JobRequest, ResponseFormat
from .speech import (
    AUDIO_RESPONSES,
    CAPTIONED_RESPONSES,
    NDJSON,
    SUBTITLE_TYPES,
    WORD_TIMINGS_HEADER,
    admitted,
    audio_bytes,
    audio_stream,
    until_disconnect,
)

router = APIRouter(tags=["dialogue"])


class DialogueLine(BaseModel):
    model_config = STRICT | ConfigDict(extra="forbid")

    speaker: str = Field(max_length=MAX_NAME_CHARS)
    text: str


class DialogueRequest(BaseModel):
    model_config = STRICT | ConfigDict(extra="ignore")

    script: str | list[DialogueLine] = Field(
        description="one `Name: text` line per turn (blank lines skipped), or a list of {speaker, text}")
    voices: dict[str, VoiceName] = Field(min_length=1, max_length=MAX_SPEAKERS,
                                         description="each speaker's voice: a preset, an alias, a mix, a cloned voice")
    model: str | None = Field(None, min_length=1, max_length=128,
                              description="a model id or alias; none: each voice's own model")
    response_format: ResponseFormat = "mp3"
    sample_rate: int | None = Field(None, ge=MIN_RATE, le=MAX_RATE)
    speed: float = Field(1.0, ge=0.25, le=4.0, description="every turn's (times the voice's own)")
    instructions: str | None = Field(None, max_length=4096)
    stream: bool = Field(False, description="send the audio turn by turn as it is synthesized")
    stream_format: Literal["audio", "sse"] | None = None
    normalize: bool = True
    normalization_options: NormalizationOptions | None = None
    input_type: Literal["auto", "text", "ssml"] = Field("auto", description="how each turn's text is read")

    @field_validator("script", mode="before")
    @classmethod
    def _turns_named(cls, script: object) -> object:
        """A list's faults name the turn and its field (pydantic's union says "script must be a string")."""
        if isinstance(script, list):
            for index, entry in enumerate(script):
                if fault := listed_turn_fault(entry, index):  # (its type is the error's code)
                    raise PydanticCustomError(ErrorCode.INVALID_DIALOGUE, fault)
        return script

    def plain_script(self) -> str | list[dict]:
        return self.script if isinstance(self.script, str) else [line.model_dump() for line in self.script]

    def characters(self) -> int:
        return len(self.script) if isinstance(self.script, str) else sum(len(line.text) for line in self.script)

    def reading(self) -> Reading:
        return Reading(requested(self.normalization_options, self.normalize), self.input_type, None,
                       self.instructions)


class CaptionedDialogueRequest(DialogueRequest):
    timestamps_format: Literal["json", "srt", "vtt"] = Field(
        "json", description="'json': the audio (base64), its words with their speakers, and its turns; "
                            "'srt' or 'vtt': subtitles by speaker only")


class DialogueJobRequest(DialogueRequest):
    """POST /v1/audio/dialogue/jobs: a dialogue to make in the background, with its progress in turns."""

    priority: int = JobRequest.model_fields["priority"]
    deadline_s: float | None = JobRequest.model_fields["deadline_s"]
    captions: bool = Field(False, description="keep the captions by speaker with the recording (GET "
                                              "/v1/audio/jobs/{id}/captions); words a voice does not time are found "
                                              "in its audio")

    def job(self) -> dict:
        """The job's request as stored: what the runner speaks (normalization options resolved) and its length."""
        return {"script": self.plain_script(), "voices": self.voices, "model": self.model, "speed": self.speed,
                "response_format": self.response_format, "sample_rate": self.sample_rate,
                "normalization": self.reading().normalization.model_dump(), "input_type": self.input_type,
                "instructions": self.instructions, "deadline_s": self.deadline_s, "captions": self.captions,
                "characters": self.characters()}


def dialogue_ask(body: DialogueRequest, caller: Caller, stream: bool, words: bool = False) -> Ask:
    """What this body asks the service for."""
    return Ask(model=body.model, speed=body.speed, response_format=body.response_format, sample_rate=body.sample_rate,
               reading=body.reading(), words=words, stream=stream, caller=caller, script=body.plain_script(),
               voices=body.voices)


def _headers(spoken: SpokenAudio, limit: RateLimitState | None) -> dict[str, str]:
    headers = {"X-Chorus-Voice": spoken.voice, "X-Chorus-Audio-Duration": f"{spoken.duration_s:.3f}",
               "X-Chorus-Cache": spoken.cache, **(limit.headers() if limit else {})}
    if spoken.degraded:
        headers["X-Chorus-Degraded"] = ",".join(spoken.degraded)
    return headers


@router.post("/v1/audio/dialogue", response_class=Response, responses=AUDIO_RESPONSES)
async def create_dialogue(body: DialogueRequest, request: Request,
                          admission: tuple[Caller, RateLimitState | None] = Depends(admitted)) -> Response:
    service: SpeechService = request.app.state.service
    caller, limit = admission
    request.state.speech["characters"] = body.characters()
    if body.stream or body.stream_format is not None:
        stream = await service.answer(dialogue_ask(body, caller, stream=True))
        chunks = audio_bytes(stream.encoded(body.response_format, body.sample_rate), request.state.speech)
        headers = limit.headers() if limit else {}
        return audio_stream(chunks, request.state.speech, body.response_format, body.stream_format, headers)
    spoken = await until_disconnect(request, service.answer(dialogue_ask(body, caller, stream=False)))
    request.state.speech.update(voice=spoken.voice, audio_s=spoken.duration_s, **asdict(spoken.timings))
    return Response(spoken.data, media_type=spoken.content_type, headers=_headers(spoken, limit))


@router.post("/v1/audio/dialogue/captioned", response_class=Response, responses=CAPTIONED_RESPONSES)
async def create_captioned_dialogue(body: CaptionedDialogueRequest, request: Request,
                                    admission: tuple[Caller, RateLimitState | None] = Depends(admitted)
                                    ) -> Response:
    """The dialogue with who says each word when: JSON (the audio, the words with their speakers, the turns), or
    SubRip/WebVTT cues labelled by speaker; streamed, newline-delimited JSON pieces."""
    service: SpeechService = request.app.state.service
    caller, limit = admission
    request.state.speech["characters"] = body.characters()
    if body.stream:
        if body.timestamps_format != "json":
            raise InvalidRequest("subtitles are made of the whole audio: send stream false for srt or vtt",
                                 "timestamps_format", ErrorCode.UNSUPPORTED_VALUE)
        stream = await service.answer(dialogue_ask(body, caller, stream=True, words=True))
        return StreamingResponse(_captioned_lines(stream.encoded(body.response_format, body.sample_rate),
                                                  body.response_format, request.state.speech), media_type=NDJSON,
                                 headers={**(limit.headers() if limit else {}),
                                          WORD_TIMINGS_HEADER: service.word_timing(stream.dialogue.script)})
    spoken = await until_disconnect(request, service.answer(dialogue_ask(body, caller, stream=False, words=True)))
    request.state.speech.update(voice=spoken.voice, audio_s=spoken.duration_s, **asdict(spoken.timings))
    words = list(spoken.words or ())
    headers = {**_headers(spoken, limit), WORD_TIMINGS_HEADER: word_timings(words) or "none"}
    if body.timestamps_format in SUBTITLE_TYPES:
        return Response(subtitles(words, body.timestamps_format), media_type=SUBTITLE_TYPES[body.timestamps_format],
                        headers=headers)
    answer = {"audio": base64.b64encode(spoken.data).decode(), "response_format": body.response_format,
              "words": [word.as_json() for word in words], "turns": [turn.as_json() for turn in spoken.turns],
              **({"word_timings": way} if (way := word_timings(words)) else {})}
    return Response(json.dumps(answer), media_type="application/json", headers=headers)


async def _captioned_lines(encoded: AsyncIterator, response_format: str, details: dict) -> AsyncIterator[str]:
    """Each streamed piece as a JSON line: its audio (base64) and the words it speaks, with their speakers."""
    details["audio_s"] = 0.0
    try:
        async for data, seconds, words in encoded:
            details["audio_s"] += seconds
            if data or words:
                timings = {"word_timings": way} if (way := word_timings(words)) else {}
                yield json.dumps({"audio": base64.b64encode(data).decode(), "response_format": response_format,
                                  "words": [word.as_json() for word in words], **timings}) + "\n"
    except Exception as error:  # the status line is sent: the failure is the last line
        failure = stream_failure(error)
        details["status"] = failure.status
        yield json.dumps(failure.body()) + "\n"
    finally:
        await encoded.aclose()
