"""Every refusal and failure a caller can see, one class each, with its status and code.

This is the one table of error kinds. The HTTP API, the WebSocket, the UI and the job runner each
map a `ChorusError` in one place (api/errors.py, api/speech_socket.py, ui/, jobs/); nothing else
decides what a failure answers. Anything that is not a ChorusError is a bug: 500, logged.
"""

from __future__ import annotations

from enum import StrEnum, unique
from typing import ClassVar

from pydantic import BaseModel

# OpenAI's `error.type` for each status
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error", 410: "not_found_error",
               413: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_exceeded",
               499: "client_closed", 500: "server_error", 503: "server_overloaded", 504: "timeout_error"}


@unique
class ErrorCode(StrEnum):
    """Every `code` a caller can see, by the kind that answers it (docs/api.md lists them). A StrEnum: JSON
    bodies, Wyoming events and stored job errors carry the plain string."""

    # 400 InvalidRequest: the text
    EMPTY_INPUT = "empty_input"  # empty, blank, or nothing left to say once normalised
    UNSUPPORTED_SCRIPT = "unsupported_script"  # only letters of scripts the voice's language is not written in
    INVALID_SSML = "invalid_ssml"  # SSML that does not parse, or that Chorus does not read
    UNKNOWN_OPTION = "unknown_option"  # a normalization option that does not exist (a pydantic error type)
    STRING_ABOVE_MAX_LENGTH = "string_above_max_length"  # a text over TTS_MAX_CHARS (a transcript over its cap)
    SPOKEN_TEXT_ABOVE_MAX_LENGTH = "spoken_text_above_max_length"  # over the limit once numbers are said as words
    TIER_TEXT_LIMIT = "tier_text_limit"  # longer than the caller's tier allows
    TEXT_ABOVE_QUEUE_CAPACITY = "text_above_queue_capacity"  # more pieces than the queue ever holds for one caller
    # 400 InvalidRequest: the other fields
    MISSING = "missing"  # a required field is absent (pydantic's error type, also raised by Chorus)
    UNSUPPORTED_VALUE = "unsupported_value"  # a value this route, model or voice cannot serve (format, rate, speed)
    MODEL_NOT_FOUND = "model_not_found"  # no such model or alias
    VOICE_NOT_FOUND = "voice_not_found"  # no such voice for this caller (404 deleting one not the caller's)
    VOICE_MODEL_MISMATCH = "voice_model_mismatch"  # the voice belongs to another model than the one named
    UNSUPPORTED_LANGUAGE = "unsupported_language"  # no voice here speaks the language asked for
    LANGUAGE_MISMATCH = "language_mismatch"  # the voice named does not speak the language named
    INVALID_JSON = "invalid_json"  # a body or message that is not JSON (or nests too deeply)
    BODY_TOO_LARGE = "body_too_large"  # a body (413), a WebSocket message or a UI clip over TTS_MAX_BODY_BYTES
    UPLOAD_TOO_LARGE = "upload_too_large"  # an upload larger than the uploads' room could ever hold (413)
    TOO_MANY_ITEMS = "too_many_items"  # a batch over TTS_MAX_BATCH_ITEMS
    DEADLINE_TOO_LONG = "deadline_too_long"  # a job's deadline_s over TTS_JOB_DEADLINE_S
    UPSTREAM_REJECTED = "upstream_rejected"  # an upstream model's server refused the request (its message)
    # 400 InvalidRequest: a dialogue's script (POST /v1/audio/dialogue)
    INVALID_DIALOGUE = "invalid_dialogue"  # no turns, a line that is not `Name: text`, or an empty turn
    UNKNOWN_SPEAKER = "unknown_speaker"  # a speaker of the script with no voice in `voices`
    TOO_MANY_SPEAKERS = "too_many_speakers"  # more speakers than a dialogue (or its model's one context) takes
    # 400 InvalidRequest: the WebSocket and Wyoming
    BINARY_MESSAGE = "binary_message"  # a binary WebSocket message (only JSON text is read)
    INVALID_EVENT = "invalid_event"  # not a Wyoming event, or one whose data is not what its type needs
    INVALID_EVENT_LENGTH = "invalid_event_length"  # a Wyoming event's lengths are not whole numbers of bytes
    EVENT_TOO_LARGE = "event_too_large"  # a Wyoming event (or its header line) over the limit
    NO_STREAM = "no_stream"  # a Wyoming synthesize-chunk or -stop outside a stream
    # 400 InvalidRequest: cloning and the lexicon
    CONSENT_REQUIRED = "consent_required"  # cloning without the speaker's consent
    INVALID_NAME = "invalid_name"  # a cloned voice's name that is not a plain name
    MODEL_CANNOT_CLONE = "model_cannot_clone"  # no model here (or not the one named) can clone
    AUDIO_UNREADABLE = "audio_unreadable"  # a clip that is not audio that can be decoded
    AUDIO_TOO_SHORT = "audio_too_short"  # a clip shorter than a voice needs
    AUDIO_TOO_LONG = "audio_too_long"  # a clip longer than a voice needs
    AUDIO_SILENT = "audio_silent"  # a clip with no one speaking
    INVALID_LEXICON_FILE = "invalid_lexicon_file"  # a lexicon import that is not UTF-8 or has bad lines
    # 401 Unauthorized
    INVALID_API_KEY = "invalid_api_key"  # a key missing where one is required, wrong or revoked
    # 404 NotFound
    NOT_FOUND = "not_found"  # no such route or resource
    JOB_NOT_FOUND = "job_not_found"  # no such job of this caller's
    JOB_RESULT_MISSING = "job_result_missing"  # the job's audio is not readable on this replica; retry
    # 409 Conflict
    CONFLICT = "conflict"  # not possible now (the kind's default)
    JOB_NOT_READY = "job_not_ready"  # the job's audio exists once it has succeeded
    JOB_FINISHED = "job_finished"  # the job has already ended, so cannot be cancelled
    MODEL_BUSY = "model_busy"  # a model the new registry changes is busy or still unloading
    VOICE_EXISTS = "voice_exists"  # a cloned voice's name is taken
    CLONED_VOICE_LIMIT = "cloned_voice_limit"  # the caller has as many cloned voices as allowed
    LEXICON_ENTRY_EXISTS = "lexicon_entry_exists"  # a lexicon entry for that phrase and language exists
    # 410 Gone
    GONE = "gone"  # existed, no longer does (the kind's default)
    JOB_EXPIRED = "job_expired"  # the job's audio is past TTS_RESULT_TTL_S
    # 422 InvalidSetting (the admin API)
    INVALID_SETTING = "invalid_setting"  # an operator value out of its bounds, or unknown
    INVALID_BODY = "invalid_body"  # a settings change that is not a non-empty JSON object
    UNKNOWN_TIER = "unknown_tier"  # a key's tier that does not exist
    INVALID_REGISTRY = "invalid_registry"  # a voices file that cannot be loaded
    # 429 RateLimited
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"  # over the tier's rate limit (or too many wrong admin tokens)
    TOO_MANY_SOCKETS = "too_many_sockets"  # the caller holds as many WebSocket or Wyoming connections as allowed
    # 499 ClientGone (recorded, never sent)
    CLIENT_CLOSED = "client_closed"  # the caller hung up before its answer was ready
    # 500 ChorusError, SynthesisError
    INTERNAL_ERROR = "internal_error"  # a bug: logged
    SYNTHESIS_FAILED = "synthesis_failed"  # the engine failed on this item, alone
    # 503 Overloaded: refused for now, Retry-After says when
    QUEUE_FULL = "queue_full"  # the queue holds as much as it may
    QUEUE_WAIT = "queue_wait"  # the predicted wait is over the server's target
    DEADLINE_UNREACHABLE = "deadline_unreachable"  # the predicted wait is past the request's deadline
    CALLER_QUEUE_FULL = "caller_queue_full"  # the caller has TTS_MAX_QUEUE_PER_CALLER pieces waiting
    MODELS_BUSY = "models_busy"  # TTS_MAX_LOADED_MODELS are loaded and none is idle
    MODEL_UNAVAILABLE = "model_unavailable"  # the model failed to load; the next try is after Retry-After
    MODEL_STOPPED = "model_stopped"  # the model was stopped before this was synthesized
    MODEL_RELOADING = "model_reloading"  # the model is being reloaded
    ENGINE_UNAVAILABLE = "engine_unavailable"  # no engine replica answered in time (Ray Serve)
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"  # an upstream model's server failed, or its breaker is open
    STORAGE_UNAVAILABLE = "storage_unavailable"  # the database is unavailable
    JOB_BACKLOG_FULL = "job_backlog_full"  # TTS_MAX_JOB_BACKLOG jobs are waiting
    TOO_MANY_CONNECTIONS = "too_many_connections"  # the server holds as many connections of a kind as it may
    UPLOADS_FULL = "uploads_full"  # the server holds as many uploaded bytes as it may
    # 503 Degraded: refused by degrade mode until its expected end
    DEGRADED = "degraded"  # refused by degrade mode (the kind's default)
    DEGRADED_TEXT_LIMIT = "degraded_text_limit"  # longer than the text cap degrade mode has set
    SHED_LOW_PRIORITY = "shed_low_priority"  # the caller's tier is shed while degrade mode is on
    # 504 DeadlineExceeded
    DEADLINE_EXCEEDED = "deadline_exceeded"  # the work waited past its deadline


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error shape: {"error": {message, type, param, code}}."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": param,
                      "code": code}}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """Every error answer: OpenAI's error shape (error_body's), as the API's and the admin API's routes document
    it (error_responses)."""

    error: ErrorDetail


ERROR_MEANINGS = {
    400: "Invalid request (the field at fault, if any, is in error.param)", 401: "Missing, invalid or revoked key",
    403: "Wrong admin token, or admin disabled", 404: "No such resource",
    409: "Not possible in the current state (busy, not ready or already ended)",
    410: "Gone: the result has expired", 413: "Request body too large",
    422: "Invalid setting value", 429: "Rate limit exceeded; see Retry-After and X-RateLimit-*",
    500: "Synthesis failed", 503: "At capacity or shedding load; see Retry-After",
    504: "Waited in the queue past its deadline",
}


def error_responses(*statuses: int) -> dict:
    """OpenAPI `responses` documenting the error answers a route can give."""
    return {status: {"model": ErrorBody, "description": ERROR_MEANINGS[status]} for status in statuses}


class ChorusError(Exception):
    status: ClassVar[int] = 500
    default_code: ClassVar[str | None] = ErrorCode.INTERNAL_ERROR
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


def voice_deleted(model: str, voice: str) -> InvalidRequest:
    """A request's piece in a cloned voice deleted after the request was accepted, before the piece started (the
    pieces already running finish in it): refused as soon as the voice is deleted, or where its engine finds it
    gone."""
    return InvalidRequest(f"{model} has no voice {voice!r}: it was deleted while this request ran; choose another "
                          "voice", "voice", ErrorCode.VOICE_NOT_FOUND)


class InvalidSetting(ChorusError):
    """An operator value that cannot be used (the admin API answers 422 for these)."""

    status, default_code = 422, ErrorCode.INVALID_SETTING


class Unauthorized(ChorusError):
    status, default_code = 401, ErrorCode.INVALID_API_KEY

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class NotFound(ChorusError):
    status, default_code = 404, ErrorCode.NOT_FOUND


class Conflict(ChorusError):
    status, default_code = 409, ErrorCode.CONFLICT


class Gone(ChorusError):
    status, default_code = 410, ErrorCode.GONE


class RateLimited(ChorusError):
    status, default_code = 429, ErrorCode.RATE_LIMIT_EXCEEDED

    def __init__(self, message: str, retry_after_s: int, limit_headers: dict[str, str]):
        super().__init__(message, retry_after_s=retry_after_s)
        self.limit_headers = limit_headers

    def headers(self) -> dict[str, str]:
        return {**super().headers(), **self.limit_headers}


class ClientGone(ChorusError):
    """The caller hung up before its answer was ready (recorded as 499, never sent)."""

    status, default_code = 499, ErrorCode.CLIENT_CLOSED


class SynthesisError(ChorusError):
    """The engine failed on this item (alone, after its batch was retried item by item)."""

    status, default_code, retryable = 500, ErrorCode.SYNTHESIS_FAILED, True

    @classmethod
    def in_engine(cls, model: str, error: BaseException) -> SynthesisError:
        """What a caller is told of an exception raised inside a model: the model and the exception's class. Its
        text stays in the server's log (it can hold raw tensors, `tensor([nan, nan, ...])`, paths, internals)."""
        return cls(f"synthesis failed in model {model} ({type(error).__name__}); retry, or report it if it repeats")


class Overloaded(ChorusError):
    """Refused for now: the queue, the models or the storage cannot take it; Retry-After says when."""

    status, default_code, retryable = 503, ErrorCode.QUEUE_FULL, True

    def __init__(self, message: str, retry_after_s: int, code: str | None = None):
        super().__init__(message, code=code, retry_after_s=max(1, int(retry_after_s)))


class PartFailed(Overloaded):
    """Refused because a part the request needs has failed (an upstream that answers 5xx, its breaker open), not
    for load: the same 503 and Retry-After, but a job spends an attempt on it (jobs/), backing off, and never holds
    the runner's other work while it waits."""


class Degraded(Overloaded):
    """Refused by a degrade-mode action (the text cap, shedding): a temporary overload, not a fault of the
    request. It passes once the mode ends (Retry-After: its expected end); jobs wait for it without spending
    an attempt."""

    default_code = ErrorCode.DEGRADED

    def __init__(self, message: str, retry_after_s: float, code: str | None = None, param: str | None = None):
        super().__init__(message, retry_after_s, code)
        self.param = param


class StorageUnavailable(Overloaded):
    def __init__(self, message: str = "the database is unavailable; retry shortly", retry_after_s: int = 5):
        super().__init__(message, retry_after_s, ErrorCode.STORAGE_UNAVAILABLE)


class DeadlineExceeded(ChorusError):
    """The work waited past its deadline and was dropped unsynthesized."""

    status, default_code, retryable = 504, ErrorCode.DEADLINE_EXCEEDED, True


def _rebuilt(kind: type[ChorusError], fields: dict) -> ChorusError:
    error = kind.__new__(kind)
    Exception.__init__(error, fields["message"])
    error.__dict__.update(fields)
    return error
