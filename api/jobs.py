"""Asynchronous jobs (/v1/audio/jobs; a dialogue's, /v1/audio/dialogue/jobs) and batch submission
(/v1/audio/speech/batch)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import zipfile
from datetime import datetime, timedelta
from typing import Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from jobs import JobRunner, is_dialogue
from storage import JobStatus, StorageError
from tts_core.audio.encoding import FORMATS
from tts_core.errors import (
    ChorusError,
    Conflict,
    ErrorCode,
    Gone,
    InvalidRequest,
    NotFound,
    SynthesisError,
    error_responses,
)
from tts_core.request.access import Caller, RateLimitState
from tts_core.service import check_format

from .dialogue import DialogueJobRequest, dialogue_ask
from .errors import invalid_input, unavailable
from .schemas import BatchRequest, JobRequest, SpeechRequest
from .speech import SUBTITLE_TYPES, admitted, ask_of, until_disconnect

log = logging.getLogger(__name__)
router = APIRouter(tags=["jobs"])
JobId = Path(min_length=1, max_length=40, pattern=r"^job_[0-9a-f]+$")


def _runner(request: Request) -> JobRunner:
    return request.app.state.jobs


def _unix(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment else None


def public_job(job: dict) -> dict:
    """A job as its owner sees it (the owner and storage details stay inside); a dialogue's with its progress."""
    request, expired = job["request"], job["status"] == JobStatus.SUCCEEDED and job["result_path"] is None
    ready = job["status"] == JobStatus.SUCCEEDED and not expired
    started, finished, created = job["started_at"], job["finished_at"], job["created_at"]
    return {
        "id": job["id"], "object": "audio.job", "status": job["status"], "attempts": job["attempts"],
        "error": job["error"], "created_at": _unix(created), "started_at": _unix(started),
        "finished_at": _unix(finished), "expires_at": _unix(job["expires_at"]),
        "timings": {"queued_s": round((started - created).total_seconds(), 3) if started else None,
                    "run_s": round((finished - started).total_seconds(), 3) if started and finished else None},
        "request": {key: request[key] for key in ("voices" if is_dialogue(request) else "voice", "model", "speed",
                                                  "response_format")}
                   | {"characters": len(request["input"]) if "input" in request else request["characters"]},
        "audio_s": job["audio_s"], "expired": expired,
        # when it fails if not done (jobs from before deadlines: the server's setting applies, not shown)
        "deadline_at": _unix(created + timedelta(seconds=request["deadline_s"])) if "deadline_s" in request else None,
        "audio_url": f"/v1/audio/jobs/{job['id']}/audio" if ready else None,
        **({} if job["turns"] is None else {
            "progress": {"turns_done": job["turns_done"], "turns": job["turns"]},
            "captions_url": f"/v1/audio/jobs/{job['id']}/captions" if ready and request.get("captions") else None}),
    }


def _own_job(request: Request, job_id: str, caller: Caller) -> dict:
    job = _runner(request).storage.jobs.get(job_id)
    if job is None or job["owner"] != caller.identity:  # others' jobs do not exist
        raise NotFound(f"no job {job_id!r}", "job_id", ErrorCode.JOB_NOT_FOUND)
    return job


def _queue(request: Request, body: SpeechRequest, caller: Caller, priority: int = 0,
           deadline_s: float | None = None) -> dict:
    """Validate now (a bad request fails at once, not in the background), then queue."""
    service = request.app.state.service
    _check_job_output(body)
    normalization = body.normalization()
    check_format(body.response_format, body.sample_rate)
    script = service.validate(ask_of(body, caller, stream=False))
    return _runner(request).submit(caller, {"input": body.input, "voice": script.voice.name, "model": body.model,
                                            "speed": body.speed, "response_format": body.response_format,
                                            "sample_rate": body.sample_rate,
                                            "normalization": normalization.model_dump(),
                                            "input_type": body.input_type, "deadline_s": deadline_s,
                                            "instructions": body.instructions}, priority)


def _check_job_output(body: SpeechRequest | DialogueJobRequest) -> None:
    """A job's answer is a file: not streamed, in a format (and rate) it can be encoded in."""
    if body.stream or body.stream_format is not None:
        raise InvalidRequest("jobs are not streamed; leave out stream and stream_format", "stream",
                             ErrorCode.UNSUPPORTED_VALUE)
    check_format(body.response_format, body.sample_rate)


@router.post("/v1/audio/jobs", status_code=202, responses=error_responses(400, 401, 429, 503))
async def create_job(body: JobRequest, request: Request, response: Response,
                     admission: tuple[Caller, RateLimitState | None] = Depends(admitted)):
    caller, limit = admission
    job = await asyncio.to_thread(_queue, request, body, caller, body.priority, body.deadline_s)
    response.headers["Location"] = f"/v1/audio/jobs/{job['id']}"
    response.headers.update(limit.headers() if limit else {})
    return public_job(job)


@router.post("/v1/audio/dialogue/jobs", status_code=202, responses=error_responses(400, 401, 429, 503))
async def create_dialogue_job(body: DialogueJobRequest, request: Request, response: Response,
                              admission: tuple[Caller, RateLimitState | None] = Depends(admitted)):
    """A dialogue made in the background: checked now as POST /v1/audio/dialogue checks it (the limits on the
    script's text), its progress counted in turns."""
    caller, limit = admission
    _check_job_output(body)
    ask = dialogue_ask(body, caller, stream=False, words=body.captions)
    turns = await request.app.state.service.dialogue_turns(ask)
    job = await asyncio.to_thread(_runner(request).submit, caller, body.job(), body.priority, turns)
    response.headers["Location"] = f"/v1/audio/jobs/{job['id']}"
    response.headers.update(limit.headers() if limit else {})
    return public_job(job)


@router.get("/v1/audio/jobs", responses=error_responses(400, 401))
async def list_jobs(request: Request, limit: int = Query(100, ge=1, le=1000),
                    status: str | None = Query(None, pattern="^(queued|running|succeeded|failed|cancelled)$"),
                    admission: tuple[Caller, RateLimitState | None] = Depends(admitted)):
    rows = await asyncio.to_thread(_runner(request).storage.jobs.owned_by, admission[0].identity, limit, status)
    return {"object": "list", "data": [public_job(job) for job in rows]}


@router.get("/v1/audio/jobs/{job_id}", responses=error_responses(400, 401, 404))
async def get_job(request: Request, job_id: str = JobId,
                  admission: tuple[Caller, RateLimitState | None] = Depends(admitted)):
    return public_job(await asyncio.to_thread(_own_job, request, job_id, admission[0]))


@router.get("/v1/audio/jobs/{job_id}/audio", response_class=Response, responses={
    200: {"content": {spec.content_type: {} for spec in FORMATS.values()}, "description": "The job's audio"},
    **error_responses(400, 401, 404, 409, 410)})
async def get_job_audio(request: Request, job_id: str = JobId,
                        admission: tuple[Caller, RateLimitState | None] = Depends(admitted)):
    job = await asyncio.to_thread(_own_job, request, job_id, admission[0])
    _check_result(request, job)
    runner = _runner(request)
    try:  # read whole: the sweep may delete the file at any moment, and a half-sent answer is worse than none
        data = await asyncio.to_thread(runner.result_file(job).read_bytes)
    except FileNotFoundError:
        if (await asyncio.to_thread(runner.storage.jobs.get, job_id) or {}).get("result_path") is None:  # just swept
            raise Gone(f"the audio of job {job_id} has expired", "job_id", ErrorCode.JOB_EXPIRED) from None
        log.error("job %s: its result %s is not in this replica's results folder (TTS_RESULTS_DIR must be one "
                  "folder that every replica mounts)", job_id, job["result_path"])
        raise NotFound(f"the audio of job {job_id} is not readable on this server; retry", "job_id",
                       ErrorCode.JOB_RESULT_MISSING) from None
    return Response(data, media_type=job["content_type"], headers={"X-Chorus-Audio-Duration": f"{job['audio_s']:.3f}"})


def _check_result(request: Request, job: dict) -> None:
    """The job has succeeded and its result is kept: else 409 (not yet, or never) or 410 (expired)."""
    if job["status"] != JobStatus.SUCCEEDED:
        raise Conflict(f"job {job['id']} is {job['status']}; its audio exists once it has succeeded", "job_id",
                       ErrorCode.JOB_NOT_READY, 2 if job["status"] in (JobStatus.QUEUED, JobStatus.RUNNING) else None)
    if job["result_path"] is None:
        raise Gone(f"the audio of job {job['id']} has expired (results are kept for {int(_runner(request).ttl_s)} s "
                   "after they are ready)", "job_id", ErrorCode.JOB_EXPIRED)


@router.get("/v1/audio/jobs/{job_id}/captions", responses={
    200: {"content": {"application/json": {}, **{kind: {} for kind in SUBTITLE_TYPES.values()}},
          "description": "The dialogue's words with their speakers and its turns (json), or subtitles by speaker"},
    **error_responses(400, 401, 404, 409, 410)})
async def get_job_captions(request: Request, job_id: str = JobId,
                           timestamps_format: Literal["json", "srt", "vtt"] = Query("json"),
                           admission: tuple[Caller, RateLimitState | None] = Depends(admitted)):
    """A dialogue job's captions, kept with its recording when it asked for them (`captions: true`)."""
    job = await asyncio.to_thread(_own_job, request, job_id, admission[0])
    if not job["request"].get("captions"):
        raise NotFound(f"job {job_id} kept no captions: a dialogue job keeps them when it is submitted with "
                       "\"captions\": true", "job_id", ErrorCode.NOT_FOUND)
    _check_result(request, job)
    captions = json.loads(job["captions"])
    if timestamps_format in SUBTITLE_TYPES:
        return Response(captions[timestamps_format], media_type=SUBTITLE_TYPES[timestamps_format])
    way = captions.get("word_timings")  # (kept by jobs since words of every voice are timed: native, aligned, ...)
    return {"words": captions["words"], "turns": captions["turns"], **({"word_timings": way} if way else {})}


@router.delete("/v1/audio/jobs/{job_id}", responses=error_responses(400, 401, 404, 409))
async def cancel_job(request: Request, job_id: str = JobId,
                     admission: tuple[Caller, RateLimitState | None] = Depends(admitted)):
    await asyncio.to_thread(_own_job, request, job_id, admission[0])
    cancelled = await _runner(request).cancel(job_id)
    if cancelled is None:
        job = await asyncio.to_thread(_own_job, request, job_id, admission[0])  # as it ended, not as it was
        raise Conflict(f"job {job_id} has already ended ({job['status']})", "job_id", ErrorCode.JOB_FINISHED)
    return public_job(cancelled)


# --- batch submission ---------------------------------------------------------------------------------

def _item_error(index: int, error: ChorusError) -> dict:
    return {"index": index, **error.body()}


@router.post("/v1/audio/speech/batch", responses={
    200: {"content": {"application/zip": {}}, "description": "mode 'zip': the audio and manifest.json"},
    202: {"description": "mode 'jobs': a job or an error per item"}, **error_responses(400, 401, 429)})
async def speech_batch(body: BatchRequest, request: Request,
                       admission: tuple[Caller, RateLimitState | None] = Depends(admitted)):
    caller, _ = admission
    access, limit = request.app.state.access, request.app.state.settings.max_batch_items
    if len(body.items) > limit:
        raise InvalidRequest(f"{len(body.items)} items; at most {limit} per call (TTS_MAX_BATCH_ITEMS)", "items",
                             ErrorCode.TOO_MANY_ITEMS)
    items: list[tuple[int, SpeechRequest | ChorusError]] = []
    for index, raw in enumerate(body.items):
        try:
            if index:  # the call itself counted the first item against the rate limit
                await access.hit(caller)
            items.append((index, SpeechRequest.model_validate(raw)))
        except ValidationError as invalid:
            items.append((index, invalid_input(invalid.errors(), model=SpeechRequest)))
        except ChorusError as refused:
            items.append((index, refused))
    if body.mode == "jobs":
        return JSONResponse({"object": "list", "data": [await _job_item(request, index, item, caller)
                                                        for index, item in items]}, status_code=202)
    return await _zip(request, items, caller)


async def _job_item(request: Request, index: int, item: SpeechRequest | ChorusError, caller: Caller) -> dict:
    if isinstance(item, ChorusError):
        return _item_error(index, item)
    try:
        return {"index": index, "job": public_job(await asyncio.to_thread(_queue, request, item, caller))}
    except ChorusError as refused:
        return _item_error(index, refused)
    except StorageError as error:  # this item's answer; the items queued before it stay queued
        return _item_error(index, unavailable(error))


async def _zip(request: Request, items: list[tuple[int, SpeechRequest | ChorusError]], caller: Caller) -> Response:
    """Every valid item synthesized at once (so they batch together); one zip with a manifest. A client
    that hangs up has its items dropped from the queue, as any other request's."""
    service = request.app.state.service

    async def speak(item: SpeechRequest):
        return await service.answer(ask_of(item, caller, stream=False))

    valid = [(index, item) for index, item in items if not isinstance(item, ChorusError)]
    spoken = await until_disconnect(request, asyncio.gather(*(speak(item) for _, item in valid),
                                                            return_exceptions=True))
    outcomes = dict(zip((index for index, _ in valid), spoken))
    manifest, buffer = [], io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for index, item in items:
            result = item if isinstance(item, ChorusError) else outcomes[index]
            if isinstance(result, BaseException) and not isinstance(result, ChorusError):
                result = SynthesisError("synthesis failed", code=ErrorCode.INTERNAL_ERROR)
            if isinstance(result, ChorusError):
                manifest.append(_item_error(index, result))
                continue
            name = f"item-{index:03d}.{item.response_format}"
            archive.writestr(name, result.data)
            manifest.append({"index": index, "file": name, "voice": result.voice,
                             "audio_s": round(result.duration_s, 3)})
        archive.writestr("manifest.json", json.dumps({"items": manifest}, indent=2))
    return Response(buffer.getvalue(), media_type="application/zip",
                    headers={"Content-Disposition": 'attachment; filename="speech.zip"'})
