"""Admin REST API: /admin/api/settings, audit, stats, keys, voices/reload, a model's precision reset, cloned voices and
the pronunciation lexicon, behind a bearer token."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, Field

from storage import AlreadyExists, StorageError
from tts_core.engines import EngineUnavailable
from tts_core.errors import (
    Conflict,
    ErrorCode,
    InvalidRequest,
    InvalidSetting,
    NotFound,
    RateLimited,
    StorageUnavailable,
    error_responses,
)
from tts_core.request.access import Tier, client_address
from tts_core.request.operating import OperatorSettings
from tts_core.text.lexicon import LexiconEntry, LexiconFileError
from tts_core.validation import VoiceName, json_body

from .control import OperatorControl
from .gate import AdminRefused
from .lexicon import LexiconControl
from .stats import collect_stats

router = APIRouter(prefix="/admin/api", tags=["admin"], responses=error_responses(400, 401, 403, 422, 429))


def require_admin(request: Request) -> str:
    """The admin token's check (wrong guesses slowed down per address); the actor named in the audit log."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    address = client_address(request.client.host if request.client else None,
                             request.headers.get("x-forwarded-for"), request.app.state.access.trusted_proxies)
    try:
        request.app.state.admin_gate.check(token.strip() if scheme.lower() == "bearer" else None, address)
    except AdminRefused as refused:
        if refused.status == 429:
            raise RateLimited(refused.message, refused.retry_after_s, {}) from None
        headers = {"WWW-Authenticate": "Bearer"} if refused.status == 401 else None
        raise HTTPException(refused.status, refused.message, headers=headers) from None
    return request.headers.get("x-chorus-actor", "admin-api")[:128]


def _control(request: Request) -> OperatorControl:
    return request.app.state.control


BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
          "minProperties", "maxProperties")


def _fields(model: type[BaseModel]) -> dict:
    """Each field's type, default, description and bounds, as the JSON schema states them."""
    properties, defaults = model.model_json_schema()["properties"], model().model_dump()
    return {name: {"type": getattr(info.annotation, "__name__", str(info.annotation)),
                   "default": defaults[name], "description": info.description,
                   **{bound: properties[name][bound] for bound in BOUNDS if bound in properties[name]}}
            for name, info in model.model_fields.items()}


def describe_settings(settings: OperatorSettings) -> dict:
    fields = _fields(OperatorSettings)
    fields["tiers"]["tier_fields"] = _fields(Tier)
    return {"settings": settings.model_dump(), "fields": fields}


class SettingsView(BaseModel):
    settings: OperatorSettings  # so /openapi.json states every value's bounds
    fields: dict[str, dict]


class SettingsChanged(SettingsView):
    changes: list[dict]


# PUT takes any subset of the settings: OperatorSettings' schema says so (every field has a default).
PARTIAL_SETTINGS = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/OperatorSettings"}}}}}


@router.get("/settings", response_model=SettingsView)
async def get_settings(request: Request, _: str = Depends(require_admin)) -> dict:
    return describe_settings(_control(request).settings)


@router.put("/settings", response_model=SettingsChanged, responses=error_responses(429, 503),
            openapi_extra=PARTIAL_SETTINGS)
async def put_settings(request: Request, actor: str = Depends(require_admin)):
    changes = json_body(await request.body(), InvalidSetting)
    if not isinstance(changes, dict) or not changes:
        raise InvalidSetting("send a JSON object of the settings to change", None, ErrorCode.INVALID_BODY)
    settings, entries = await asyncio.to_thread(_control(request).update, changes, actor)
    return {**describe_settings(settings), "changes": entries}


@router.get("/audit", responses=error_responses(503))
async def get_audit(request: Request, limit: int = Query(50, ge=1, le=1000), _: str = Depends(require_admin)):
    return {"object": "list", "data": await asyncio.to_thread(_control(request).audit, limit)}


@router.get("/stats")
async def get_stats(request: Request, _: str = Depends(require_admin)) -> dict:
    """This replica's figures, and `replicas`: every replica of the deployment as it last reported."""
    state = request.app.state
    return await asyncio.to_thread(collect_stats, state.controls, state.monitor, _control(request), state.access,
                                   state.replicas)


class NewKey(BaseModel):
    name: str = Field(min_length=1, max_length=128)
    tier: str = Field(min_length=1, max_length=64)


def _public(record: dict) -> dict:
    return {key: value for key, value in record.items() if key != "key_hash"}


@router.get("/keys", responses=error_responses(503))
async def list_keys(request: Request, _: str = Depends(require_admin)) -> dict:
    rows = await asyncio.to_thread(request.app.state.access.storage.keys.all)
    return {"object": "list", "data": [_public(row) for row in rows]}


@router.post("/keys", status_code=201, responses=error_responses(503))
async def create_key(body: NewKey, request: Request, actor: str = Depends(require_admin)):
    tiers = _control(request).settings.tiers
    if body.tier not in tiers:
        raise InvalidSetting(f"tier {body.tier!r} does not exist; tiers: {', '.join(tiers)}", "tier",
                             ErrorCode.UNKNOWN_TIER)
    key, record = await asyncio.to_thread(request.app.state.access.create_key, body.name, body.tier, actor)
    return {**_public(record), "key": key, "note": "store this key now: it is not shown again"}


@router.delete("/keys/{key_id}", responses=error_responses(404, 503))
async def revoke_key(request: Request, key_id: int = Path(ge=1, le=2**63 - 1),
                     actor: str = Depends(require_admin)):
    record = await asyncio.to_thread(request.app.state.access.revoke_key, key_id, actor)
    if record is None:
        raise NotFound(f"no API key with id {key_id}", "key_id")
    return _public(record)


@router.post("/voices/reload", responses=error_responses(409))
async def reload_voices(request: Request, actor: str = Depends(require_admin)):
    """Read TTS_VOICES_FILE again: new models are added, removed or changed ones unloaded once idle."""
    try:
        summary = await asyncio.to_thread(request.app.state.controls.reload_registry)
    except EngineUnavailable as error:
        raise InvalidSetting(str(error), "voices_file", ErrorCode.INVALID_REGISTRY) from None
    try:
        await asyncio.to_thread(request.app.state.access.storage.audit.add, actor, "voices.reload", "voices_file",
                                summary)
    except StorageError:  # the reload happened; a failing audit write must not hide that
        summary = {**summary, "audit_error": StorageUnavailable().message}
    return summary


@router.post("/models/{model}/precision/reset", responses=error_responses(404))
async def reset_precision(request: Request, model: str = Path(max_length=128), actor: str = Depends(require_admin)):
    """After a batch failed at degrade mode's lower precision, the model stays at full; this lets degrade mode lower
    it again (tts_core.scheduler.precision)."""
    reset = request.app.state.controls.reset_precision(model)
    try:
        await asyncio.to_thread(request.app.state.access.storage.audit.add, actor, "precision.reset", model,
                                {"was_off": reset["was_off"]})
    except StorageError:  # the reset happened; a failing audit write must not hide that
        pass
    return reset


# --- cloned voices --------------------------------------------------------------------------------


def cloned_view(record: dict) -> dict:
    """A cloned voice as the admin sees it (its file stays inside)."""
    moments = {key: record[key].isoformat() for key in ("created_at", "consent_at") if key in record}
    return {key: value for key, value in record.items() if key != "path"} | moments


class PublicFlag(BaseModel):
    public: bool = Field(description="true: everyone may use the voice; false: its owner only")


@router.get("/voices/cloned", responses=error_responses(503))
async def list_cloned(request: Request, _: str = Depends(require_admin)) -> dict:
    return {"object": "list", "data": [cloned_view(row) for row in await request.app.state.clones.listing()]}


@router.delete("/voices/cloned/{name}", responses=error_responses(404, 503))
async def delete_cloned(request: Request, name: VoiceName = Path(), actor: str = Depends(require_admin)) -> dict:
    return cloned_view(await request.app.state.clones.delete(name, actor))


@router.put("/voices/cloned/{name}/public", responses=error_responses(404, 503))
async def publish_cloned(body: PublicFlag, request: Request, name: VoiceName = Path(),
                         actor: str = Depends(require_admin)) -> dict:
    return cloned_view(await request.app.state.clones.set_public(name, body.public, actor))


# --- pronunciation lexicon ------------------------------------------------------------------------

TSV = "text/tab-separated-values"
EntryId = Path(ge=1, le=2**63 - 1)


def _lexicon(request: Request) -> LexiconControl:
    return request.app.state.lexicon


@router.get("/lexicon", responses=error_responses(503))
async def list_lexicon(request: Request, language: str | None = Query(None, min_length=2, max_length=16),
                       _: str = Depends(require_admin)) -> dict:
    return {"object": "list", "data": await asyncio.to_thread(_lexicon(request).entries, language)}


@router.post("/lexicon", status_code=201, responses=error_responses(409, 503))
async def add_lexicon_entry(entry: LexiconEntry, request: Request, actor: str = Depends(require_admin)) -> dict:
    try:
        return await asyncio.to_thread(_lexicon(request).add, entry, actor)
    except AlreadyExists as error:
        raise Conflict(str(error), "phrase", ErrorCode.LEXICON_ENTRY_EXISTS) from None


@router.put("/lexicon/{entry_id}", responses=error_responses(404, 409, 503))
async def change_lexicon_entry(entry: LexiconEntry, request: Request, entry_id: int = EntryId,
                               actor: str = Depends(require_admin)) -> dict:
    """The entry as the body says (every field: what is left out takes its default)."""
    try:
        record = await asyncio.to_thread(_lexicon(request).change, entry_id, entry, actor)
    except AlreadyExists as error:
        raise Conflict(str(error), "phrase", ErrorCode.LEXICON_ENTRY_EXISTS) from None
    if record is None:
        raise NotFound(f"no lexicon entry with id {entry_id}", "entry_id")
    return record


@router.delete("/lexicon/{entry_id}", responses=error_responses(404, 503))
async def delete_lexicon_entry(request: Request, entry_id: int = EntryId, actor: str = Depends(require_admin)) -> dict:
    record = await asyncio.to_thread(_lexicon(request).delete, entry_id, actor)
    if record is None:
        raise NotFound(f"no lexicon entry with id {entry_id}", "entry_id")
    return record


# No response_class: the route's errors stay documented as JSON; its file is documented here.
@router.get("/lexicon/export", responses={200: {"content": {TSV: {"schema": {"type": "string"}}}},
                                          **error_responses(503)})
async def export_lexicon(request: Request, language: str | None = Query(None, min_length=2, max_length=16),
                         _: str = Depends(require_admin)) -> PlainTextResponse:
    text = await asyncio.to_thread(_lexicon(request).export_tsv, language)
    return PlainTextResponse(text, media_type=TSV,
                             headers={"Content-Disposition": 'attachment; filename="lexicon.tsv"'})


@router.post("/lexicon/import", responses=error_responses(413, 503),
             openapi_extra={"requestBody": {"required": True, "content": {TSV: {"schema": {"type": "string"}}}}})
async def import_lexicon(request: Request, actor: str = Depends(require_admin)) -> dict:
    """Merge a TSV file (as export writes it) into the lexicon: its entries are added, or change the entry
    with the same language and phrase; entries it does not name stay. All or nothing: one bad line and
    nothing is stored, and the answer (400) names every bad line. At most MAX_IMPORT_LINES entries."""
    try:
        text = (await request.body()).decode("utf-8-sig")  # its size is bounded as every body's is (api/limits.py)
    except UnicodeDecodeError:
        raise InvalidRequest("the file is not UTF-8 text", "body", ErrorCode.INVALID_LEXICON_FILE) from None
    try:
        return await asyncio.to_thread(_lexicon(request).import_tsv, text, actor)
    except LexiconFileError as error:
        raise InvalidRequest(str(error), "body", ErrorCode.INVALID_LEXICON_FILE) from None


# --- what no route above answers ----------------------------------------------------------------------

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]


@router.api_route("/{rest:path}", methods=ALL_METHODS, include_in_schema=False)
async def admin_not_found(request: Request, rest: str):
    """Unknown admin paths and wrong methods answer in the error table's shape (404, or 405 with Allow), not with
    the mounted UI's {"detail": "Not Found"}. Last of the router's routes: only what none above matched."""
    path = request.url.path
    allowed = sorted({method for route in router.routes if route.endpoint is not admin_not_found
                      and route.path_regex.match(path) for method in route.methods})
    if allowed:
        raise HTTPException(405, f"{request.method} is not allowed on {path}; use {', '.join(allowed)}",
                            headers={"Allow": ", ".join(allowed)})
    raise NotFound(f"no such route: {path}", None)
