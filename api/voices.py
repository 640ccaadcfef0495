"""Voices: the list (per caller: cloned voices are their owner's until an admin makes them public),
cloning one from a clip, and deleting a cloned one."""

from __future__ import annotations

from fastapi import APIRouter, Depends, File, Form, Path, Query, Request, Response, UploadFile

from clones import VoiceClones
from tts_core.engines import Capabilities, Voice
from tts_core.errors import Unauthorized, error_responses
from tts_core.request.access import Caller, RateLimitState
from tts_core.validation import VoiceName
from tts_core.voices.catalogue import Catalogue, speaks

from .speech import admitted

router = APIRouter(tags=["voices"])


def _clones(request: Request) -> VoiceClones:
    return request.app.state.clones


def listed_caller(request: Request) -> str | None:
    """Who asks for the list: anyone may; a caller who sends no key where keys are required sees the
    voices everyone may use (a wrong key is still refused)."""
    access = request.app.state.access
    try:
        return access.identify(request.headers.get("authorization"), request.client.host if request.client else None,
                               request.headers.get("x-forwarded-for")).identity
    except Unauthorized:
        if request.headers.get("authorization"):
            raise
        return None


def voice_entry(voice: Voice, engine: str, catalogue: Catalogue, aliases: list[str], caller: str | None) -> dict:
    entry = {"id": voice.name, "object": "voice", "model": voice.model, "engine": engine,
             "language": voice.language, "gender": voice.gender, "speaker": voice.speaker,
             "sample_rate": voice.sample_rate, "speed": voice.speed, "aliases": sorted(aliases),
             "cloned": voice.name in catalogue.clones,
             "capabilities": _capabilities(catalogue.capabilities.get(engine, Capabilities()), voice)}
    clone = catalogue.clones.get(voice.name)
    if clone is not None:
        entry["public"] = clone.public
        if clone.owner == caller:  # others are not told who made a public voice
            entry["owner"] = clone.owner
    return entry


def _capabilities(capabilities: Capabilities, voice: Voice) -> dict:
    """What the voice's model can do, as declared (known before it loads)."""
    return {"word_timestamps": capabilities.times_words, "cloning": capabilities.clones,
            "speed": voice.speed_control, "frames": capabilities.makes_frames, "max_running": capabilities.max_running,
            "mixing": capabilities.mixes_voices}


@router.get("/v1/audio/voices", tags=["catalogue"], responses=error_responses(400, 401))
async def list_voices(request: Request, language: str | None = Query(None, max_length=35, description="en, en-US"),
                      model: str | None = Query(None, max_length=128, description="a model id")) -> dict:
    """The voices the caller may use: OpenAI-style `data`, and `voices` ([{"id", "name", ...}]) as Open
    WebUI and Kokoro-FastAPI's clients read them."""
    catalogue, caller = request.app.state.service.catalogue_now(), listed_caller(request)
    aliases: dict[str, list[str]] = {}
    for alias, target in catalogue.voice_aliases.items():
        aliases.setdefault(target, []).append(alias)
    entries = [voice_entry(voice, engine, catalogue, aliases.get(voice.name, []), caller)
               for voice, engine in catalogue.visible_voices(caller)
               if (language is None or speaks(voice, language)) and model in (None, voice.model, engine)]
    return {"object": "list", "default": catalogue.default_voice, "data": entries,
            "voices": [{**entry, "name": f"{entry['id']} ({entry['language']})"} for entry in entries]}


@router.post("/v1/audio/voices", status_code=201, responses=error_responses(400, 401, 409, 413, 429, 500, 503))
async def clone_voice(request: Request, response: Response,
                      audio: UploadFile = File(description="3 to 30 s of one speaker: wav, mp3, flac or ogg"),
                      name: str = Form(max_length=128, description="the new voice's name (letters, digits, . _ -)"),
                      model: str = Form(max_length=128, description="a model that can clone (or its family)"),
                      consent: str = Form(max_length=16, description="true: the speaker consents to this clone "
                                          "of their voice (only the word true: not yes, 1 or on)"),
                      text: str | None = Form(None, description="what the clip says (stored with the voice)"),
                      admission: tuple[Caller, RateLimitState | None] = Depends(admitted)) -> dict:
    """Make a voice from a clip, usable by its maker (an admin may make it public). It counts against
    the caller's rate limit like a speech request; the body is bounded by TTS_MAX_BODY_BYTES."""
    caller, limit = admission
    data = await audio.read()
    # Consent is a statement, not a checkbox that any truthy word ticks: a form's bool took "yes", "1" and "on".
    record = await _clones(request).create(caller, data, name, model, consent == "true", text)
    response.headers.update(limit.headers() if limit else {})
    catalogue = request.app.state.service.catalogue_now()
    voice, engine = catalogue.voices[record["name"]]
    return {**voice_entry(voice, engine, catalogue, [], caller.identity), "duration_s": record["duration_s"],
            "transcript": record["transcript"], "created_at": int(record["created_at"].timestamp())}


@router.delete("/v1/audio/voices/{name}", responses=error_responses(400, 401, 404, 429, 503))
async def delete_voice(request: Request, name: VoiceName = Path(),
                       admission: tuple[Caller, RateLimitState | None] = Depends(admitted)) -> dict:
    """Delete a cloned voice you made (its file, its row, and its place in the catalogue and engine)."""
    caller, _ = admission
    await _clones(request).delete(name, caller.identity, owner=caller.identity)
    return {"id": name, "object": "voice", "deleted": True}
