"""Every refusal and failure a caller can see, one class each, with its status and code.

This is the one table of error kinds. The HTTP API, the WebSocket, the UI and the job runner each
map a `ChorusError` in one place (api/errors.py, api/speech_socket.py, ui/, jobs/); nothing else
decides what a failure answers. Anything that is not a ChorusError is a bug: 500, logged.
"""

from __future__ import annotations

from typing import ClassVar

# OpenAI's `error.type` for each status
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error", 410: "not_found_error",
               413: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_exceeded",
               499: "client_closed", 500: "server_error", 503: "server_overloaded", 504: "timeout_error"}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error shape: {"error": {message, type, param, code}}."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": param,
                      "code": code}}


class ChorusError(Exception):
    status: ClassVar[int] = 500
    default_code: ClassVar[str | None] = "internal_error"
    retryable: ClassVar[bool] = False  # the same request may succeed later (jobs retry it)

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 retry_after_s: int | None = None):
        super().__init__(message)
        self.message, self.param = message, param
        self.code = code or self.default_code
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else {}

    def __reduce__(self):
        """Pickled as its class and fields, whatever its __init__ takes: it crosses processes whole (an engine
        replica's refusal, answered by the Ray Serve ingress)."""
        return _rebuilt, (type(self), dict(self.__dict__))

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


class InvalidRequest(ChorusError):
    status, default_code = 400, None


class InvalidSetting(ChorusError):
    """An operator value that cannot be used (the admin API answers 422 for these)."""

    status, default_code = 422, "invalid_setting"


class Unauthorized(ChorusError):
    status, default_code = 401, "invalid_api_key"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class NotFound(ChorusError):
    status, default_code = 404, "not_found"


class Conflict(ChorusError):
    status, default_code = 409, "conflict"


class Gone(ChorusError):
    status, default_code = 410, "gone"


class RateLimited(ChorusError):
    status, default_code = 429, "rate_limit_exceeded"

    def __init__(self, message: str, retry_after_s: int, limit_headers: dict[str, str]):
        super().__init__(message, retry_after_s=retry_after_s)
        self.limit_headers = limit_headers

    def headers(self) -> dict[str, str]:
        return {**super().headers(), **self.limit_headers}


class ClientGone(ChorusError):
    """The caller hung up before its answer was ready (recorded as 499, never sent)."""

    status, default_code = 499, "client_closed"


class SynthesisError(ChorusError):
    """The engine failed on this item (alone, after its batch was retried item by item)."""

    status, default_code, retryable = 500, "synthesis_failed", True


class Overloaded(ChorusError):
    """Refused for now: the queue, the models or the storage cannot take it; Retry-After says when."""

    status, default_code, retryable = 503, "queue_full", True

    def __init__(self, message: str, retry_after_s: int, code: str | None = None):
        super().__init__(message, code=code, retry_after_s=max(1, int(retry_after_s)))


class Degraded(Overloaded):
    """Refused by a degrade-mode action (the text cap, shedding): a temporary overload, not a fault of the
    request. It passes once the mode ends (Retry-After: its expected end); jobs wait for it without spending
    an attempt."""

    default_code = "degraded"

    def __init__(self, message: str, retry_after_s: float, code: str | None = None, param: str | None = None):
        super().__init__(message, retry_after_s, code)
        self.param = param


class StorageUnavailable(Overloaded):
    def __init__(self, message: str = "the database is unavailable; retry shortly", retry_after_s: int = 5):
        super().__init__(message, retry_after_s, "storage_unavailable")


class DeadlineExceeded(ChorusError):
    """The work waited past its deadline and was dropped unsynthesized."""

    status, default_code, retryable = 504, "deadline_exceeded", True


def _rebuilt(kind: type[ChorusError], fields: dict) -> ChorusError:
    error = kind.__new__(kind)
    Exception.__init__(error, fields["message"])
    error.__dict__.update(fields)
    return error
