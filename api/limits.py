"""Request body size limit, as plain ASGI middleware (it must see chunked bodies too, and the mounted UI's)."""

from __future__ import annotations

from fastapi import HTTPException

from tts_core.errors import ErrorCode

from .errors import error_response


class BodySizeLimit:
    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large()(scope, receive, send)
        received, over, started, ours = 0, False, False, False

        async def counting_receive():
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    over = True
                    raise HTTPException(413, self._message())  # unwinds whatever is reading the body
            return message

        async def answering_send(message):
            # The app below answers that exception in its own shape (a mounted Gradio app's is not
            # OpenAI's, FastAPI's has no code): unless it had already begun answering, answer in ours.
            nonlocal started, ours
            if message["type"] == "http.response.start" and not started:
                started, ours = True, over
                if ours:
                    return await self._too_large()(scope, receive, send)
            if not ours:
                await send(message)

        await self.app(scope, counting_receive, answering_send)

    def _message(self) -> str:
        return f"request body is larger than {self.max_bytes} bytes"

    def _too_large(self):
        return error_response(413, self._message(), None, ErrorCode.BODY_TOO_LARGE)
