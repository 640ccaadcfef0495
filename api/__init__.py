"""The HTTP API: OpenAI-compatible speech, catalogue, probes, status and metrics."""

from __future__ import annotations

import time

from fastapi import FastAPI

from tts_core.metrics import Metrics
from tts_core.service import SpeechService

from . import speech, system
from .errors import install_error_handlers
from .limits import BodySizeLimit


class RequestMetrics:
    """Counts speech responses by status and times them (plain ASGI: sees every outcome)."""

    def __init__(self, app, metrics: Metrics, prefix: str = "/v1/audio/speech"):
        self.app, self.metrics, self.prefix = app, metrics, prefix

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            return await self.app(scope, receive, send)
        status, started = 500, time.perf_counter()

        async def recording_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            self.metrics.requests.labels("api", str(status)).inc()
            self.metrics.request_seconds.labels("api").observe(time.perf_counter() - started)


def build_api(service: SpeechService, lifespan=None) -> FastAPI:
    app = FastAPI(title="Chorus", version="0.1.0", lifespan=lifespan,
                  description="Self-hosted text-to-speech with an OpenAI-compatible API.")
    app.state.service = service
    install_error_handlers(app)
    app.include_router(speech.router)
    app.include_router(system.router)
    app.include_router(system.fallback)  # last: catches only what no route above matched
    app.state.api_routes = [*speech.router.routes, *system.router.routes]
    app.add_middleware(RequestMetrics, metrics=service.metrics)
    app.add_middleware(BodySizeLimit, max_bytes=service.settings.max_body_bytes)
    return app
