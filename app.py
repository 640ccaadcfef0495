"""Chorus composition root: settings -> engines -> batchers -> API + UI, on one port.

`python app.py` serves everything on TTS_HOST:TTS_PORT (0.0.0.0:7860, as Hugging Face Spaces expect).
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

import gradio as gr
import uvicorn

from api import build_api
from tts_core.config import Settings
from tts_core.engines import load_engines
from tts_core.metrics import Metrics
from tts_core.service import SpeechService
from ui import build_ui


def create_app(settings: Settings | None = None):
    settings = settings or Settings()
    service = SpeechService(settings, load_engines(settings), Metrics())

    @asynccontextmanager
    async def lifespan(_app):
        service.start()
        try:
            yield
        finally:
            service.stop()

    api = build_api(service, lifespan)
    return gr.mount_gradio_app(api, build_ui(service), path="/")


def main() -> None:
    settings = Settings()
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                log_level=settings.log_level.lower())


if __name__ == "__main__":
    main()
