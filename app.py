"""Chorus composition root: settings -> storage -> engines -> batchers -> API + UI + admin, one port.

`python app.py` serves everything on TTS_HOST:TTS_PORT (0.0.0.0:7860, as Hugging Face Spaces expect).
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

import gradio as gr
import uvicorn

from admin.api import router as admin_router
from admin.control import OperatorControl
from admin.ui import build_admin_tab
from api import build_api
from api.access import AccessControl
from jobs import JobRunner
from storage import Storage
from storage.request_log import RequestLogWriter
from tts_core.config import Settings
from tts_core.engines import Engine, EngineUnavailable, model_specs
from tts_core.metrics import Metrics
from tts_core.monitor import Monitor
from tts_core.service import SpeechService
from ui import build_ui


def create_app(settings: Settings | None = None, engines: list[Engine] | None = None):
    """The whole app; `engines` replaces the configured ones (tests pass fake engines)."""
    settings = settings or Settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    storage = Storage(settings.database)
    storage.migrate()
    service = SpeechService(settings, engines if engines is not None else model_specs(settings), Metrics())
    request_log = RequestLogWriter(storage)
    control = OperatorControl(storage, service, request_log, defaults=settings.operator_defaults)
    control.reload()  # stored settings apply before the first request
    monitor = Monitor(service)
    job_runner = JobRunner(storage, service, settings, lambda: service.degrade.settings)
    admin_token = settings.admin_token.get_secret_value() if settings.admin_token else None

    @asynccontextmanager
    async def lifespan(_app):
        for part in (service, request_log, control, monitor):
            part.start()
        await job_runner.start()
        try:
            yield
        finally:
            await job_runner.stop()
            for part in (monitor, control, request_log, service):
                part.stop()

    access = AccessControl(storage, settings, lambda: service.degrade.settings)
    control.on_reload.append(access.refresh_keys)  # keys revoked through another replica stop working here too

    def admit_ui(request: gr.Request):
        return access.admit_blocking(None, request.client.host if request.client else None,
                                     request.headers.get("x-forwarded-for"))

    api = build_api(service, access, request_log, lifespan)
    api.state.control, api.state.monitor, api.state.admin_token = control, monitor, admin_token
    api.state.jobs = job_runner
    api.include_router(admin_router)
    page = build_ui(service, admit_ui, request_log,
                    [lambda: build_admin_tab(service, monitor, control, access, admin_token)])
    app = gr.mount_gradio_app(api, page, path="/")
    calm_gradio_queue(page)
    return app


def calm_gradio_queue(page: gr.Blocks) -> None:
    """Gradio's queue looks for new UI events every 1 ms while idle: about 7% of a core per
    process doing nothing, on the event loop the API shares. 20 ms still starts a click at once."""
    page._queue.sleep_when_free = 0.02
    page._queue.progress_update_sleep_when_free = 0.1


def main() -> None:
    settings = Settings()
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # proxy_headers off: uvicorn would otherwise believe X-Forwarded-For from 127.0.0.1; Chorus
    # decides which proxies to believe itself (TTS_TRUSTED_PROXIES).
    try:
        app = create_app(settings)
    except EngineUnavailable as error:  # a configured model is missing: say which, no traceback
        logging.getLogger("chorus").error("cannot start: %s", error)
        raise SystemExit(2) from None
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
                proxy_headers=False)


if __name__ == "__main__":
    main()
