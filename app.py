"""Chorus composition root: settings -> storage -> engines -> batchers -> API + UI + admin, one port.

`python app.py` serves everything on TTS_HOST:TTS_PORT (0.0.0.0:7860, as Hugging Face Spaces expect).
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import NoReturn

import gradio as gr
import uvicorn
from gradio.routes import App as GradioApp
from pydantic import ValidationError
from pydantic_settings import SettingsError
from starlette.routing import Mount

from access.control import AccessControl
from admin.api import router as admin_router
from admin.cluster import ReplicaReporter
from admin.control import OperatorControl
from admin.gate import AdminGate
from admin.lexicon import LexiconControl
from admin.ui import build_admin_tab
from api import build_api
from api.connections import AnsweredHandshakeProtocol, OpenSockets, bounded_http_protocol
from api.logs import redacting_handler
from api.wyoming import WyomingServer
from clones import stored_clones
from jobs import JobRunner
from storage import Storage, StorageError
from storage.request_log import RequestLogWriter
from tts_core.config import Settings
from tts_core.controls import ServiceControls
from tts_core.engines import Engine, EngineUnavailable, ModelSpec
from tts_core.errors import InvalidSetting
from tts_core.monitor import Monitor
from tts_core.ops.metrics import Metrics
from tts_core.request.access import trusted_proxy
from tts_core.request.dispatch import Scheduler
from tts_core.request.operating import OperatorSettings
from tts_core.scheduler.memory import limit_heap_arenas
from tts_core.scheduler.pool import ModelPool
from tts_core.service import SpeechService
from tts_core.voices.registry import model_specs
from ui import build_ui, takes_folder
from ui import files as ui_files
from ui.browser import PAGE_CSS


class StartupError(Exception):
    """A configuration mistake found at start-up: main() says it in one line and exits with 2."""


def _check_can_listen(host: str, port: int, variable: str) -> None:
    """StartupError, naming the variable, when host:port cannot be listened on (taken, or not this machine's)."""
    try:
        family, kind, _, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds it
            probe.bind(address)
    except OSError as error:
        raise StartupError(f"{variable}: cannot listen on {host}:{port}: {error.strerror or error}") from None


def create_app(settings: Settings | None = None, engines: list[Engine | ModelSpec] | None = None,
               make_scheduler: Callable[[Settings, ModelPool, Metrics], Scheduler] = Scheduler):
    """The whole app; `engines` replaces the configured models (tests pass fake engines), `make_scheduler` where
    their passages are queued (deploy/ray_serve.py: on Ray Serve engine replicas). StartupError (or
    EngineUnavailable) names the setting at fault."""
    limit_heap_arenas()  # before the server's threads start
    settings = settings or Settings()
    storage, models = prepare(settings, engines)
    try:
        access = AccessControl(storage, settings, lambda: controls.settings())
        clones = stored_clones(storage, settings.data_dir, [model.name for model in models])
    except ValueError as error:  # TTS_RATELIMIT_STORAGE or TTS_TRUSTED_PROXIES, named in the message
        raise StartupError(str(error)) from None
    except StorageError as error:
        raise StartupError(f"the database (TTS_DATABASE_URL) cannot be read: {error}") from None
    request_log = RequestLogWriter(storage)
    service = SpeechService(settings, models, Metrics(), clones=clones, make_scheduler=make_scheduler,
                            request_log=request_log, calibrations=storage.calibrations)
    controls = ServiceControls(service)  # the operator's: degrade mode, the cache, the lexicon, the registry
    control = OperatorControl(storage, controls, request_log, defaults=settings.operator_defaults)
    lexicon = LexiconControl(storage, controls)
    control.on_reload.append(lexicon.refresh)  # the lexicon's changes, from any replica, within a refresh
    control.reload()  # stored settings apply before the first request
    monitor = Monitor(service)
    job_runner = JobRunner(storage, service, settings, controls.settings)
    gate = AdminGate(settings.admin_token.get_secret_value() if settings.admin_token else None)
    wyoming = _wyoming_server(settings, service, access)
    control.on_reload.append(access.refresh_keys)  # keys revoked through another replica stop working here too
    replicas = ReplicaReporter(storage, service, settings.replica)
    control.on_reload.append(replicas.report)  # every second, beside the refresh: the cluster view reads them
    lifespan = _lifespan(service, settings, request_log, control, monitor, job_runner, wyoming)
    api = build_api(service, settings, access, lifespan)
    api.state.control, api.state.controls, api.state.monitor, api.state.admin_gate = control, controls, monitor, gate
    api.state.jobs, api.state.lexicon, api.state.replicas = job_runner, lexicon, replicas
    api.include_router(admin_router)
    control.on_reload.append(api.state.clones.refresh)  # voices cloned or deleted through another replica
    api.include_router(ui_files.router(takes_folder(settings)))  # the UI's files, by take and name (no paths)
    admit_ui, identify_ui = _ui_callers(access)
    page = build_ui(service, settings, admit_ui, identify_ui, api.state.clones,
                    [lambda: build_admin_tab(controls, monitor, control, access, gate, api.state.clones, lexicon,
                                             replicas)])
    # Gradio's own run history would keep every typed text in the browser's plain localStorage: off
    app = gr.mount_gradio_app(api, page, path="/", run_history=False, css=PAGE_CSS)
    calm_gradio_queue(page)
    return app


def _wyoming_server(settings: Settings, service: SpeechService, access: AccessControl) -> WyomingServer | None:
    """The Wyoming listener where TTS_WYOMING_PORT is set; a taken port is a mistake to say now, not a
    traceback in the lifespan."""
    if settings.wyoming_port is None:
        return None
    _check_can_listen(settings.host, settings.wyoming_port, "TTS_WYOMING_PORT")
    return WyomingServer(service, access, settings)


async def _announce_ready(service: SpeechService, settings: Settings) -> None:
    """One line once the server serves, with where (the wait is in short spells: a stop is never held)."""
    while not await asyncio.to_thread(service.wait_ready, 1.0):
        pass
    host = "localhost" if settings.host in ("0.0.0.0", "::", "") else settings.host
    url = f"http://{host}:{settings.port}"
    logging.getLogger("chorus").info("Chorus is ready: the UI at %s/ , the API at %s/v1 (docs at %s/docs)",
                                     url, url, url)


def _lifespan(service: SpeechService, settings: Settings, request_log: RequestLogWriter, control: OperatorControl,
              monitor: Monitor, job_runner: JobRunner, wyoming: WyomingServer | None):
    """The app's lifespan: the parts start in order, and stop in the reverse order."""

    @asynccontextmanager
    async def lifespan(_app):
        for part in (service, request_log, control, monitor):
            part.start()
        announcing = asyncio.create_task(_announce_ready(service, settings))
        await job_runner.start()
        try:
            if wyoming is not None:
                await wyoming.start()
            yield
        finally:
            announcing.cancel()
            if wyoming is not None:
                await wyoming.stop()
            await job_runner.stop()
            for part in (monitor, control, request_log, service):
                part.stop()
    return lifespan


def _ui_callers(access: AccessControl):
    """How the UI admits (counting against the caller's limits) and identifies a browser's caller."""

    async def admit_ui(request: gr.Request):
        return await access.admit(None, request.client.host if request.client else None,
                                  request.headers.get("x-forwarded-for"))

    def identify_ui(request: gr.Request):
        return access.identify(None, request.client.host if request.client else None,
                               request.headers.get("x-forwarded-for"))
    return admit_ui, identify_ui


def prepare(settings: Settings, engines: list[Engine | ModelSpec] | None) -> tuple[Storage, list[Engine | ModelSpec]]:
    """Check what start-up needs before anything starts, each fault as one StartupError: the data
    folder can be written, the operator defaults validate, the database opens and migrates, and the
    pinned models fit the limit. Returns the storage and the models."""
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=settings.data_dir).close()
    except OSError as error:
        raise StartupError(f"TTS_DATA_DIR {str(settings.data_dir)!r} cannot be written: "
                           f"{error.strerror or error}") from None
    try:
        OperatorSettings().merged(settings.operator_defaults)
    except InvalidSetting as invalid:
        raise StartupError(f"TTS_OPERATOR_DEFAULTS: {invalid.message}") from None
    try:
        storage = Storage(settings.database)
        storage.migrate()
    except StorageError as error:
        raise StartupError(f"the database (TTS_DATABASE_URL) cannot be used: {error}") from None
    # Pinned models stay loaded and the limit is a promise about memory: both cannot hold, and which
    # one to give up is the operator's choice, so say so now rather than fail when the pool fills.
    models = engines if engines is not None else model_specs(settings)
    pinned = [model.name for model in models if not isinstance(model, ModelSpec) or model.pinned]
    if 0 < settings.max_loaded_models < len(pinned):
        raise StartupError(f"{len(pinned)} models are pinned ({', '.join(pinned)}) but TTS_MAX_LOADED_MODELS is "
                           f"{settings.max_loaded_models}: set it to at least {len(pinned)} (0: no limit), or pin "
                           "fewer (pinned entries in TTS_VOICES_FILE, voices in TTS_VOICES_DIR)")
    return storage, models


def calm_gradio_queue(page: gr.Blocks) -> None:
    """Gradio's queue looks for new UI events every 1 ms while idle: a share of a core spent by a
    process doing nothing, on the event loop the API shares. 20 ms still starts a click at once."""
    page._queue.sleep_when_free = 0.02
    page._queue.progress_update_sleep_when_free = 0.1


def refuse_to_start(reason: str) -> NoReturn:
    """A configuration mistake: one line that names it, no traceback, exit code 2."""
    logging.getLogger("chorus").error("cannot start: %s", reason)
    raise SystemExit(2)


def settings_fault(error: ValidationError | SettingsError) -> str:
    """The first fault in the TTS_ environment, naming its variable."""
    if isinstance(error, SettingsError):  # a value that is not the JSON its setting needs
        field = re.search(r'field "(\w+)"', str(error))
        name = f"TTS_{field.group(1).upper()}" if field else "a TTS_ variable"
        return f"{name} is not valid JSON: {error.__cause__ or error}"
    first = error.errors()[0]
    return f"TTS_{str(first['loc'][0]).upper() if first['loc'] else '?'}: {first['msg']}"


GIL_SWITCH_INTERVAL_S = 0.001  # Python's default is 0.005


class UiClosingServer(uvicorn.Server):
    """uvicorn's server, stopping within a bound and letting what is in flight finish. On SIGTERM it stops
    listening; the speech WebSockets' utterances begun (or queued) are sent whole, `done` event included, before
    uvicorn closes the sockets (1012: it did so at once, cutting them); it ends the UI's heartbeat streams (each
    open page holds one, and uvicorn waits for every open connection to end: one tab left open held the stop until
    the process manager's kill); and what is still running after TTS_SHUTDOWN_GRACE_S in all is cut (uvicorn
    waited for ever on a stream whose client stopped reading). The in-flight HTTP requests end as they would."""

    async def shutdown(self, sockets=None) -> None:
        app, grace_s = self.config.app, self.config.timeout_graceful_shutdown or 0.0
        started = time.monotonic()
        for server in self.servers:
            server.close()  # no new connections while the WebSockets finish (uvicorn closes them again: no harm)
        if (speaking := await app.state.speech_sockets.finish_utterances(grace_s)):
            logging.getLogger("chorus").warning("stopping: %d WebSockets still speaking after %g s are closed",
                                                speaking, grace_s)
        for route in app.routes:
            if isinstance(route, Mount) and isinstance(route.app, GradioApp):
                route.app.stop_event.set()  # what Gradio's own launch() sets as it closes
        self.config.timeout_graceful_shutdown = max(0.1, grace_s - (time.monotonic() - started))
        await super().shutdown(sockets)


def main() -> None:
    try:
        settings = Settings()
    except (ValidationError, SettingsError) as error:
        refuse_to_start(settings_fault(error))  # before logging is set up: Python's last-resort handler says it
    # One handler for every record, uvicorn's access log included (log_config=None below leaves
    # uvicorn's loggers propagating to it): it takes keys and texts out of query strings and messages.
    logging.basicConfig(level=settings.log_level.upper(), handlers=[redacting_handler()],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line for every request to an upstream model
    try:
        app = create_app(settings)
    except (EngineUnavailable, StartupError) as error:  # say what to change, no traceback
        refuse_to_start(str(error))
    # proxy_headers off: uvicorn would otherwise believe X-Forwarded-For from 127.0.0.1; Chorus
    # decides which proxies to believe itself (TTS_TRUSTED_PROXIES).
    # http: h11 with a deadline for each request to arrive whole (TTS_HEADER_TIMEOUT_S), so that
    # connections trickling a byte at a time are closed, and a bound on each request's line and headers;
    # idle keep-alive ones close after 5 s. ws: websockets, with the handshakes it refuses answered and closed.
    # Connections are capped per address and in all (a file descriptor each); a trusted proxy's count in all only.
    connections = OpenSockets("HTTP connections", settings.http_max_per_caller, settings.http_max_connections)
    http = bounded_http_protocol(settings.header_timeout_s, connections, trusted_proxy(settings.trusted_proxies),
                                 settings.write_timeout_s)
    # The event loop shares the GIL with the text reader and the engines' Python: a thread that wants it waits
    # out the holder's switch interval, several times per request; a shorter one keeps the loop's answers prompt.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    UiClosingServer(uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
                                   log_config=None, proxy_headers=False, http=http, ws=AnsweredHandshakeProtocol,
                                   timeout_graceful_shutdown=settings.shutdown_grace_s)
                    ).run()


if __name__ == "__main__":
    main()
