"""The HTTP side of the error table (tts_core.errors): every failure answers OpenAI's
{"error": {message, type, param, code}} with the status its class says."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from access.control import LimitExceeded
from storage import StorageError
from tts_core.errors import (
    ChorusError,
    ErrorCode,
    InvalidRequest,
    InvalidSetting,
    StorageUnavailable,
    SynthesisError,
    error_body,
)
from tts_core.validation import not_json, plain_message

log = logging.getLogger(__name__)


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """An error answer for what happens outside the routes (the framework's errors, middleware)."""
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def chorus_response(error: ChorusError) -> JSONResponse:
    return error_response(error.status, error.message, error.param, error.code, error.headers())


def unavailable(error: StorageError) -> StorageUnavailable:
    """What a caller is told when storage fails: 503 with Retry-After; the driver's text goes to the log
    only (it can name files, hosts and statements)."""
    log.warning("storage unavailable: %s", error)
    return StorageUnavailable()


def stream_failure(error: Exception, what: str = "stream") -> ChorusError:
    """What a stream whose status line is sent ends with (an SSE or NDJSON error event, a WebSocket error
    message), logged as one line: the error handlers cannot answer any more, and a traceback per failed stream
    (two, with the framework's) says nothing the line does not. A failure that is not one of ours is said as
    ours (its text can hold anything)."""
    if isinstance(error, ChorusError):
        log.warning("%s failed after its headers: %s (%s)", what, error.message, error.code)
        return error
    log.error("%s failed after its headers: %s: %s", what, type(error).__name__, error)
    return SynthesisError("synthesis failed (internal error)", code=ErrorCode.INTERNAL_ERROR)


def invalid_input(errors: list[dict], kind: type[ChorusError] = InvalidRequest,
                  model: type[BaseModel] | None = None) -> ChorusError:
    """The first of pydantic's validation errors, in OpenAI's shape and plain words (routes, batch items, socket
    messages); `model`, what was validated, gives a number's whole range."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return kind("the request body is not valid JSON", None, ErrorCode.INVALID_JSON)
    location = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path")]
    if not location and first.get("loc") == ("body",):
        return kind(_body_fault(first), None, ErrorCode.INVALID_JSON)
    param = location[0] if location else None  # the top-level field or query parameter, as OpenAI names it
    field = model.model_fields.get(param) if model is not None and param else None
    message = plain_message(first, param, field) if param else first.get("msg", "invalid request")
    return kind(message, param, first.get("type"))


def _body_fault(error: dict) -> str:
    """What is wrong with a body that is not an object of fields at all."""
    if error.get("type") == ErrorCode.MISSING:
        return "the request body is empty: send a JSON object"
    if isinstance(error.get("input"), bytes):  # a body FastAPI did not parse: not sent as JSON
        return "the request body is not JSON: send a JSON object with Content-Type: application/json"
    return "the request body must be a JSON object (of fields), not " + _json_kind(error.get("input"))


def _json_kind(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "true or false", type(None): "null"}.get(type(value), "a number")


def rate_limit_exceeded(_: Request, exc: LimitExceeded) -> JSONResponse:
    """slowapi's refusal of an HTTP request, in the error table's shape: 429 rate_limit_exceeded with
    Retry-After and the X-RateLimit headers."""
    return chorus_response(exc.refusal())


def _invalid_kind(request: Request) -> type[ChorusError]:
    # OpenAI answers invalid requests with 400; the admin API uses 422 for invalid values.
    return InvalidSetting if request.url.path.startswith("/admin/") else InvalidRequest


def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return chorus_response(invalid_input(exc.errors(), _invalid_kind(request), _body_model(request)))


def _body_model(request: Request) -> type[BaseModel] | None:
    """The model the route reads its body as (where it reads one)."""
    body = getattr(request.scope.get("route"), "body_field", None)
    model = getattr(getattr(body, "field_info", None), "annotation", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI parses a route's JSON body with json.loads and answers any failure but malformed JSON with
        # a bare 400 "error parsing the body": a body nested past Python's stack is the caller's mistake,
        # said as json_body says it. Every other RecursionError is a bug: the 500 below, logged.
        if isinstance(exc.__cause__, RecursionError):
            return chorus_response(not_json(_invalid_kind(request), "nested too deeply"))
        return error_response(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(ChorusError)
    async def _chorus_error(_: Request, exc: ChorusError) -> JSONResponse:
        if exc.status >= 500 and not exc.retryable:
            log.error("request failed: %s", exc.message)
        return chorus_response(exc)

    @app.exception_handler(StorageError)
    async def _storage_error(_: Request, exc: StorageError) -> JSONResponse:
        return chorus_response(unavailable(exc))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_response(500, "internal server error", None, ErrorCode.INTERNAL_ERROR)
