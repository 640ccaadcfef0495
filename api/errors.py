"""The OpenAI error model: every failure answers {"error": {message, type, param, code}}."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tts_core.access import RateLimited, Unauthorized
from tts_core.request import DeadlineExceeded, SynthesisError
from tts_core.service import InvalidRequest, Overloaded

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error", 410: "not_found_error",
          413: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_exceeded",
          503: "server_overloaded", 504: "timeout_error"}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param,
                      "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


@dataclass
class ApiError(Exception):
    """An error answer; raised where a route's helper refuses, or built from a service error."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] | None = None

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.param, self.code, self.headers)


def api_error(exc: Exception) -> ApiError | None:
    """What a refusal or failure of the service answers; None for an unexpected exception."""
    if isinstance(exc, InvalidRequest):
        return ApiError(400, exc.message, exc.param, exc.code)
    if isinstance(exc, Unauthorized):
        return ApiError(401, exc.message, None, "invalid_api_key", {"WWW-Authenticate": "Bearer"})
    if isinstance(exc, RateLimited):
        return ApiError(429, str(exc), None, "rate_limit_exceeded",
                        {"Retry-After": str(exc.retry_after_s), **exc.state.headers()})
    if isinstance(exc, Overloaded):
        return ApiError(503, str(exc), None, exc.code, {"Retry-After": str(exc.retry_after_s)})
    if isinstance(exc, DeadlineExceeded):
        return ApiError(504, f"request timed out: {exc}", None, "deadline_exceeded")
    if isinstance(exc, SynthesisError):
        return ApiError(500, str(exc), None, "synthesis_failed")
    return None


SERVICE_ERRORS = (InvalidRequest, Unauthorized, RateLimited, Overloaded, DeadlineExceeded, SynthesisError)


def invalid_input(errors: list[dict], status: int = 400) -> ApiError:
    """The first of pydantic's validation errors, in OpenAI's shape (routes, batch items, socket messages)."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return ApiError(status, "the request body is not valid JSON", None, "invalid_json")
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = location[0] if location else None  # the top-level field, as OpenAI names it
    message = first.get("msg", "invalid request")
    if first.get("type") == "missing":
        message = f"{param} is required"
    elif param:
        message = f"{param}: {message}"
    return ApiError(status, message, param, first.get("type"))


def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    # OpenAI answers invalid requests with 400; the admin API uses 422 for invalid values.
    return invalid_input(exc.errors(), 422 if request.url.path.startswith("/admin/") else 400).response()


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    async def _service_error(_: Request, exc: Exception) -> JSONResponse:
        return api_error(exc).response()

    for error_class in SERVICE_ERRORS:
        app.add_exception_handler(error_class, _service_error)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_response(500, "internal server error", None, "internal_error")
