"""Limits on the UI's file uploads (Gradio's POST /gradio_api/upload, open to anyone who can reach
the page, each file kept on disk for an hour or more): per caller, uploads and bytes an hour; for
all callers together, the bytes Gradio may still be keeping. Plain ASGI in front of Gradio's route."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from starlette.datastructures import Headers

from access.control import AccessControl
from tts_core.config import Settings
from tts_core.errors import ChorusError, ErrorCode, Overloaded, RateLimited
from tts_core.request.access import RateLimitState

from .errors import chorus_response, error_response

UPLOAD_PATH = "/gradio_api/upload"
HOUR_S = 3600.0
KEPT_S = 2 * HOUR_S  # ui/ has Gradio delete files over an hour old, once an hour: a file lives up to two
MB = 1024 * 1024


@dataclass
class Upload:
    at: float
    caller: str
    size: int  # bytes: reserved when admitted, settled when the upload ends (0 if nothing was kept)


class UploadLedger:
    """Recent uploads, per caller (the last hour) and in total (what may still be on disk).
    Used on the event loop only: one owner, no lock."""

    def __init__(self, per_caller: int, caller_bytes: int, total_bytes: int,
                 clock: Callable[[], float] = time.monotonic):
        self.per_caller, self.caller_bytes, self.total_bytes = per_caller, caller_bytes, total_bytes
        self.clock = clock
        self.kept_bytes = 0
        self._uploads: deque[Upload] = deque()  # every upload of the last KEPT_S, oldest first
        self._by_caller: dict[str, deque[Upload]] = {}  # each caller's uploads of the last hour, oldest first

    @property
    def largest(self) -> int:
        """The largest upload that could ever be admitted; larger ones answer 413."""
        return min(self.caller_bytes, self.total_bytes)

    def admit(self, caller: str, size: int) -> Upload:
        """Reserve an upload of up to `size` bytes for caller: RateLimited over the caller's hourly
        limits, Overloaded when all callers' uploads would take more than the total."""
        now = self.clock()
        self._expire(now)
        mine = self._by_caller.setdefault(caller, deque())
        while mine and mine[0].at <= now - HOUR_S:
            mine.popleft()
        if len(mine) >= self.per_caller or sum(upload.size for upload in mine) + size > self.caller_bytes:
            retry_s = math.ceil(mine[0].at + HOUR_S - now) if mine else int(HOUR_S)  # none: the limit is 0
            state = RateLimitState(self.per_caller, 0, time.time() + retry_s)
            raise RateLimited(f"upload limit reached: {self.per_caller} uploads or "
                              f"{self.caller_bytes // MB} MB an hour per caller", max(1, retry_s), state.headers())
        if self.kept_bytes + size > self.total_bytes:
            raise Overloaded("the server holds as many uploaded files as it may; retry later",
                             self._seconds_until_free(now, size), ErrorCode.UPLOADS_FULL)
        upload = Upload(now, caller, size)
        self._uploads.append(upload)
        mine.append(upload)
        self.kept_bytes += size
        return upload

    def settle(self, upload: Upload, size: int) -> None:
        """The upload ended having kept `size` bytes (the reservation was the most it could)."""
        self.kept_bytes += size - upload.size  # it is still in the ledger: it ended long before KEPT_S
        upload.size = size

    def _expire(self, now: float) -> None:
        while self._uploads and self._uploads[0].at <= now - KEPT_S:
            upload = self._uploads.popleft()
            self.kept_bytes -= upload.size
            mine = self._by_caller.get(upload.caller)
            if mine and mine[0] is upload:  # a caller not seen for an hour: its entries go now
                mine.popleft()
            if mine is not None and not mine:
                del self._by_caller[upload.caller]

    def _seconds_until_free(self, now: float, size: int) -> int:
        """When enough of the oldest uploads will have expired for `size` more bytes."""
        excess = self.kept_bytes + size - self.total_bytes
        for upload in self._uploads:
            excess -= upload.size
            if excess <= 0:
                return max(1, math.ceil(upload.at + KEPT_S - now))
        return int(KEPT_S)


class UploadLimit:
    """ASGI middleware: every POST to Gradio's upload route is counted against its caller (an API
    key, or the address, as AccessControl identifies callers) before Gradio reads a byte of it."""

    def __init__(self, app, access: AccessControl, settings: Settings):
        self.app, self.access, self.max_body_bytes = app, access, settings.max_body_bytes
        self.ledger = UploadLedger(settings.upload_max_per_caller_per_hour,
                                   int(settings.upload_max_mb_per_caller_per_hour * MB),
                                   int(settings.upload_max_total_mb * MB))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != UPLOAD_PATH or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        # reserve the most it can be (BodySizeLimit stops a chunked body at max_body_bytes); settled after
        size = min(int(declared) if declared.isdigit() else self.max_body_bytes, self.ledger.largest)
        try:
            caller = self.access.identify(headers.get("authorization"), (scope.get("client") or (None,))[0],
                                          headers.get("x-forwarded-for"))
            if declared.isdigit() and int(declared) > self.ledger.largest:  # it could never be admitted
                return await error_response(413, f"an upload may be at most {self.ledger.largest} bytes", None,
                                            ErrorCode.UPLOAD_TOO_LARGE)(scope, receive, send)
            upload = self.ledger.admit(caller.identity, size)
        except ChorusError as refusal:
            return await chorus_response(refusal)(scope, receive, send)
        received, status = 0, 500

        async def counting_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            return message

        async def recording_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, counting_receive, recording_send)
        finally:
            self.ledger.settle(upload, received if status == 200 else 0)
