"""Admin REST API: /admin/api/settings, /admin/api/audit, /admin/api/stats, behind a bearer token."""

from __future__ import annotations

import hmac
import json

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from api.errors import error_response
from tts_core.degrade import OperatorSettings, SettingsInvalid

from .control import OperatorControl, StorageUnavailable
from .stats import collect_stats

router = APIRouter(prefix="/admin/api", tags=["admin"])


def check_token(expected: str | None, given: str | None) -> None:
    """401 without a token, 403 with a wrong one, 403 when admin is disabled (no token configured)."""
    if not expected:
        raise HTTPException(403, "admin is disabled: set TTS_ADMIN_TOKEN to enable it")
    if not given:
        raise HTTPException(401, "admin token required: send Authorization: Bearer <token>",
                            headers={"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(403, "wrong admin token")


def require_admin(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    check_token(request.app.state.admin_token, token.strip() if scheme.lower() == "bearer" else None)
    return request.headers.get("x-chorus-actor", "admin-api")[:128]


def _control(request: Request) -> OperatorControl:
    return request.app.state.control


def describe_settings(settings: OperatorSettings) -> dict:
    fields = {name: {"type": info.annotation.__name__, "default": info.default, "description": info.description}
              for name, info in OperatorSettings.model_fields.items()}
    return {"settings": settings.model_dump(), "fields": fields}


@router.get("/settings")
async def get_settings(request: Request, _: str = Depends(require_admin)) -> dict:
    return describe_settings(_control(request).settings)


@router.put("/settings")
async def put_settings(request: Request, actor: str = Depends(require_admin)):
    try:
        changes = json.loads(await request.body())
    except ValueError:
        return error_response(422, "the request body is not valid JSON", None, "invalid_json")
    if not isinstance(changes, dict) or not changes:
        return error_response(422, "send a JSON object of the settings to change", None, "invalid_body")
    try:
        settings, entries = _control(request).update(changes, actor)
    except SettingsInvalid as invalid:
        return error_response(422, invalid.message, invalid.field, "invalid_setting")
    except StorageUnavailable as error:
        return error_response(503, str(error), None, "storage_unavailable", {"Retry-After": "5"})
    return {**describe_settings(settings), "changes": entries}


@router.get("/audit")
async def get_audit(request: Request, limit: int = Query(50, ge=1, le=1000), _: str = Depends(require_admin)):
    return {"object": "list", "data": _control(request).audit(limit)}


@router.get("/stats")
async def get_stats(request: Request, _: str = Depends(require_admin)) -> dict:
    return collect_stats(request.app.state.service, request.app.state.monitor, _control(request))
