"""Catalogue, probes, status and metrics."""

from __future__ import annotations

import hmac
import time

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tts_core.errors import ErrorCode, Unauthorized, error_responses
from tts_core.scheduler.upstream import UpstreamStatus
from tts_core.service import SpeechService

from .errors import error_response

router = APIRouter()
STARTED = int(time.time())


def _service(request: Request) -> SpeechService:
    return request.app.state.service


def _model_card(model_id: str) -> dict:
    return {"id": model_id, "object": "model", "created": STARTED, "owned_by": "chorus"}


@router.get("/v1/models", tags=["catalogue"])
async def list_models(request: Request) -> dict:
    catalogue = _service(request).catalogue_now()
    ids = catalogue.models + sorted(catalogue.model_aliases)
    return {"object": "list", "data": [_model_card(model_id) for model_id in ids]}


@router.get("/v1/audio/models", tags=["catalogue"])
async def list_audio_models(request: Request) -> dict:
    """The models in the shape Open WebUI and Kokoro-FastAPI's clients read: {"models": [{"id", ...}]}."""
    catalogue = _service(request).catalogue_now()
    return {"object": "list", "models": [_model_card(model_id)
                                         for model_id in catalogue.models + sorted(catalogue.model_aliases)]}


@router.get("/v1/models/{model_id}", tags=["catalogue"], responses=error_responses(404))
async def get_model(model_id: str, request: Request):
    catalogue = _service(request).catalogue_now()
    if model_id not in catalogue.models and model_id not in catalogue.model_aliases:
        return error_response(404, f"model {model_id!r} does not exist", "model", ErrorCode.MODEL_NOT_FOUND)
    return _model_card(model_id)


@router.get("/health", tags=["probes"])
async def health(request: Request) -> dict:
    """The process answers. Where upstream models are loaded, each one's circuit breaker state too (an open one is
    the upstream's outage, not a reason to restart this server: the status stays ok)."""
    breakers = {name: status.strategy.breaker.state for name, status in _service(request).loop_statuses().items()
                if isinstance(status.strategy, UpstreamStatus)}
    return {"status": "ok", **({"upstreams": breakers} if breakers else {})}


@router.get("/ready", tags=["probes"], responses={503: {"description": "Warming up or calibrating"},
                                                  **error_responses(400)})
async def ready(request: Request, calibrated: bool = Query(
        False, description="kept for older probes: /ready waits for the calibration in any case")):
    """200 once the models loaded at start serve as they will go on serving: loaded, warmed up and calibrated (a
    calibration kept from an earlier start on this machine counts: then in about the time to load them)."""
    if _service(request).ready:
        return {"status": "ready"}
    return JSONResponse({"status": "warming_up"}, status_code=503, headers={"Retry-After": "2"})


async def status_reader(request: Request) -> None:
    """Who may read the status and metrics (the load, the models, the error rates): anyone, unless API keys
    are required or TTS_METRICS_TOKEN is set; then the metrics token (a Prometheus scraper's) or any valid
    API key, else 401. The probes (/health, /ready) stay open."""
    token, access = request.app.state.settings.metrics_token, request.app.state.access
    if token is None and not access.require_api_key:
        return
    authorization = request.headers.get("authorization")
    scheme, _, given = (authorization or "").partition(" ")
    if token is not None and scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), token.get_secret_value().encode()):
        return
    caller = access.identify(authorization, request.client.host if request.client else None,
                             request.headers.get("x-forwarded-for"))  # a wrong or revoked key: 401 here
    if caller.key_id is None:
        raise Unauthorized("the status and metrics need a key: send Authorization: Bearer <an API key or "
                           "TTS_METRICS_TOKEN>")


@router.get("/api/v1/batch/status", tags=["status"], dependencies=[Depends(status_reader)],
            responses=error_responses(401))
async def batch_status(request: Request) -> dict:
    return _service(request).status()


@router.get("/metrics", tags=["status"], response_class=Response, dependencies=[Depends(status_reader)],
            responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
                             "description": "Prometheus text format"}, **error_responses(401)})
async def metrics(request: Request) -> Response:
    return Response(generate_latest(_service(request).metrics_registry()), media_type=CONTENT_TYPE_LATEST)


ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
fallback = APIRouter()


@fallback.api_route("/v1/{rest:path}", methods=ALL_METHODS, include_in_schema=False)
@fallback.api_route("/api/{rest:path}", methods=ALL_METHODS, include_in_schema=False)
async def api_not_found(request: Request):
    """Unknown API paths answer in the error model here, not with the UI's page (mounted at /)."""
    path = request.url.path
    allowed = sorted({method for route in request.app.state.api_routes if route.path_regex.match(path)
                      for method in route.methods})
    if allowed:
        return error_response(405, f"{request.method} is not allowed on {path}; use {', '.join(allowed)}",
                              headers={"Allow": ", ".join(allowed)})
    return error_response(404, f"no such route: {path}", None, ErrorCode.NOT_FOUND)
