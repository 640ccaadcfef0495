"""The HTTP API: OpenAI-compatible speech, catalogue and voice cloning, probes, status and metrics."""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

from access.control import AccessControl, LimitExceeded
from clones import VoiceClones
from tts_core.config import Settings
from tts_core.service import CLIENT_GONE, SpeechService

from . import dialogue, jobs, speech, speech_socket, system, voices
from .connections import OpenSockets
from .errors import install_error_handlers, rate_limit_exceeded
from .limits import BodySizeLimit
from .uploads import UploadLimit


class RequestAccounting:
    """Accounts each speech response with the service (counted and timed by status, and logged). Plain ASGI, so
    it sees every outcome, errors included; the route leaves its details in request.state.speech."""

    def __init__(self, app, service: SpeechService,
                 prefix: tuple[str, ...] = ("/v1/audio/speech", "/v1/audio/dialogue")):
        self.app, self.service, self.prefix = app, service, prefix

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            return await self.app(scope, receive, send)
        status, started, completed = 500, time.perf_counter(), False

        async def recording_send(message):
            nonlocal status, completed
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                completed = True

        try:
            await self.app(scope, receive, recording_send)
        finally:
            if not completed and status < 400:  # the client left before the whole answer was sent
                status = CLIENT_GONE
            details = dict(scope.get("state", {}).get("speech", {}))
            status = details.pop("status", status)  # a stream that failed after its 200 was sent says so
            client = details.pop("client", None) or (scope.get("client") or ("unknown",))[0]
            self.service.account("api", client, status, started, **details)


def build_api(service: SpeechService, settings: Settings, access: AccessControl, lifespan=None) -> FastAPI:
    app = FastAPI(title="Chorus", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Self-hosted text-to-speech with an OpenAI-compatible API.")
    add_offline_docs(app)
    app.state.service, app.state.settings = service, settings
    app.state.access = access
    app.state.clones = VoiceClones(access.storage, service)
    app.state.open_sockets = OpenSockets("WebSockets", settings.ws_max_per_caller, settings.ws_max_connections)
    app.state.speech_sockets = speech_socket.SpeechSockets()  # what a stop waits for (finish_utterances)
    install_error_handlers(app)
    logging.getLogger("uvicorn.error").addFilter(speech.CUT_ON_PURPOSE)  # a raw stream cut on purpose: one line
    # the routes count their callers with slowapi's Limiter (access.counted), the store the WebSocket,
    # Wyoming and the UI count against too; what it refuses answers in the error table's shape
    app.state.limiter = access.limiter
    app.add_exception_handler(LimitExceeded, rate_limit_exceeded)
    app.include_router(speech.router)
    app.include_router(dialogue.router)
    app.include_router(speech_socket.router)
    app.include_router(jobs.router)
    app.include_router(voices.router)
    app.include_router(system.router)
    app.include_router(system.fallback)  # last: catches only what no route above matched
    app.state.api_routes = [*speech.router.routes, *dialogue.router.routes, *jobs.router.routes,
                            *voices.router.routes, *system.router.routes]
    app.add_middleware(RequestAccounting, service=service)
    app.add_middleware(UploadLimit, access=access, settings=settings)  # the UI's, mounted on this app
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    return app


# Swagger UI's and ReDoc's scripts, styles and icon, as the fastapi-offline package ships them.
DOCS_ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"
# The pages may load only from Chorus (should an asset ever ask another host, the browser refuses).
# (Inline: the pages' own start-up script and the styles ReDoc writes; blob: ReDoc's search worker.)
DOCS_CONTENT_POLICY = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
                       "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:")


# ReDoc's footer shows its maker's logo from their CDN; without a source the image hides itself (its onError).
REDOC_LOGO = 'src:"https://cdn.redoc.ly/redoc/logo-mini.svg"'


@functools.cache
def redoc_script() -> str:
    """ReDoc's script as fastapi-offline ships it, less the one thing it fetches from another host."""
    return (DOCS_ASSETS_DIR / "redoc.standalone.js").read_text(encoding="utf-8").replace(REDOC_LOGO, 'src:""')


def add_offline_docs(app: FastAPI, assets: str = "/docs-assets") -> None:
    """/docs (Swagger UI) and /redoc with their assets served by Chorus, not FastAPI's default CDN: a
    self-hosted server often runs where that CDN cannot be reached, and the pages were then blank."""

    @app.get(f"{assets}/redoc.offline.js", include_in_schema=False)  # before the mount, which would answer it
    async def redoc_js() -> Response:
        return Response(redoc_script(), media_type="text/javascript")

    app.mount(assets, StaticFiles(directory=DOCS_ASSETS_DIR), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")  # behind a proxy that serves Chorus under a path
        page = get_swagger_ui_html(openapi_url=root + app.openapi_url, title=f"{app.title} - Swagger UI",
                                   swagger_js_url=f"{root}{assets}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{root}{assets}/swagger-ui.css",
                                   swagger_favicon_url=f"{root}{assets}/favicon.png",
                                   swagger_ui_parameters=app.swagger_ui_parameters)
        page.headers["Content-Security-Policy"] = DOCS_CONTENT_POLICY
        return page

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        page = get_redoc_html(openapi_url=root + app.openapi_url, title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{root}{assets}/redoc.offline.js",
                              redoc_favicon_url=f"{root}{assets}/favicon.png",
                              with_google_fonts=False)  # fonts from Google are another host to reach
        page.headers["Content-Security-Policy"] = DOCS_CONTENT_POLICY
        return page
