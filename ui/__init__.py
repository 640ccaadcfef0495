"""The Gradio synthesis tab. It submits through the same SpeechService (and batcher) as the API."""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from pathlib import Path

import gradio as gr

from tts_core.audio import encode
from tts_core.request import DeadlineExceeded, SynthesisError
from tts_core.service import MAX_SPEED, MIN_SPEED, InvalidRequest, Overloaded, SpeechService

UI_FORMATS = ["mp3", "wav", "opus", "flac", "aac"]  # pcm has no header, so browsers cannot play it
KEEP_FILES_S = 3600


def _prune(folder: Path, older_than_s: float) -> None:
    limit = time.time() - older_than_s
    for path in folder.glob("*"):
        if path.stat().st_mtime < limit:
            path.unlink(missing_ok=True)


def build_ui(service: SpeechService) -> gr.Blocks:
    out_dir = Path(tempfile.gettempdir()) / "chorus-ui"
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = service.metrics

    async def synthesize(text: str, voice: str, speed: float, response_format: str) -> str:
        started = time.perf_counter()
        try:
            speech = await service.synthesize(text or "", voice, None, float(speed))
        except (InvalidRequest, Overloaded, DeadlineExceeded, SynthesisError) as error:
            metrics.requests.labels("ui", "error").inc()
            raise gr.Error(getattr(error, "message", str(error))) from None
        data = await asyncio.to_thread(encode, speech.audio, speech.sample_rate, response_format)
        await asyncio.to_thread(_prune, out_dir, KEEP_FILES_S)
        path = out_dir / f"chorus-{uuid.uuid4().hex[:12]}.{response_format}"
        path.write_bytes(data)
        metrics.requests.labels("ui", "200").inc()
        metrics.request_seconds.labels("ui").observe(time.perf_counter() - started)
        return str(path)

    def readiness() -> str:
        return "" if service.ready else "⏳ Warming up: the first request waits until calibration ends."

    voices = [voice.name for voice in service.voices()]
    with gr.Blocks(title="Chorus", delete_cache=(KEEP_FILES_S, KEEP_FILES_S)) as demo:
        gr.Markdown("# Chorus\nType text, pick a voice, hear it. "
                    "The same server answers the OpenAI-compatible API at `/v1/audio/speech`.")
        status = gr.Markdown()
        with gr.Row():
            with gr.Column(scale=3):
                text = gr.Textbox(label="Text", lines=6, max_length=service.settings.max_chars,
                                  placeholder="Hello! This is Chorus speaking.")
            with gr.Column(scale=2):
                voice = gr.Dropdown(voices, value=service.default_voice, label="Voice")
                speed = gr.Slider(MIN_SPEED, MAX_SPEED, value=1.0, step=0.05, label="Speed")
                response_format = gr.Dropdown(UI_FORMATS, value="mp3", label="Format")
                button = gr.Button("Synthesize", variant="primary")
        audio = gr.Audio(label="Speech", type="filepath", interactive=False, buttons=["download"])
        button.click(synthesize, [text, voice, speed, response_format], audio,
                     api_name="synthesize", concurrency_limit=None)
        demo.load(readiness, None, status)
    return demo
