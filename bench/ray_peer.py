"""The benchmark's external peer: the same engine behind a real Ray Serve deployment whose requests
are batched by Ray's own `@serve.batch` (up to 16 texts, 10 ms wait), as a Ray Serve user would
write it. Needs `pip install "ray[serve]"`; `python -m bench` runs it when Ray is installed.

    python -m bench.ray_peer --port 8000 [--voice en_US-joe-medium] [--voices-file voices.yaml]

serves `POST /v1/audio/speech` (OpenAI's body; answers raw 16-bit PCM whatever the format asked,
422 for a body without speakable `input`), `GET /metrics` (batch sizes and padding under Chorus's
metric names) and `GET /ready` on 127.0.0.1 until it is stopped (SIGTERM or SIGINT).
"""

import argparse
import asyncio
import signal
import threading
import time
from pathlib import Path

import numpy as np
import ray
from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field
from ray import serve

from tts_core.audio.encoding import encode
from tts_core.audio.playable import join
from tts_core.config import Settings
from tts_core.engines.contract import EngineInput
from tts_core.ops.metrics import BatchRecord, Metrics
from tts_core.scheduler.policy import padded_tokens
from tts_core.scheduler.strategies import synthesize_batch
from tts_core.text.chunks import split_chunks
from tts_core.voices.registry import load_voice_engine

MAX_BATCH_SIZE = 16  # the same as the "window" peer, Chorus's own fixed-window policy
BATCH_WAIT_S = 0.01

ingress = FastAPI()


class SpeechBody(BaseModel):
    """OpenAI's body; only the text matters here (one voice, raw PCM). FastAPI answers 422 otherwise."""

    input: str = Field(min_length=1, max_length=4096, pattern=r"\w")  # something speakable


@serve.deployment(max_ongoing_requests=1024, ray_actor_options={"num_cpus": 0})
@serve.ingress(ingress)
class RaySpeech:
    def __init__(self, voice: str, voices_file: str | None):
        settings = Settings(voices_file=Path(voices_file) if voices_file else None, voice_aliases={},
                            model_aliases={})
        self.engine, self.voice = load_voice_engine(settings, voice), voice
        self.max_chunk_chars = settings.max_chunk_chars
        self.metrics = Metrics()  # batch sizes and padding under Chorus's names, for the harness

    @ingress.get("/metrics")
    def prometheus(self) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @ingress.get("/ready")
    def ready(self) -> dict:
        return {"ready": True}

    @ingress.post("/v1/audio/speech")
    async def speech(self, body: SpeechBody) -> Response:
        audio = await self.speak(body.input)
        return Response(encode(audio, self.engine.sample_rate, "pcm"), media_type="audio/pcm")

    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_S)
    async def speak(self, texts: list[str]) -> list[np.ndarray]:
        return await asyncio.to_thread(self._synthesize, texts)

    def _synthesize(self, texts: list[str]) -> list[np.ndarray]:
        """Every sentence of every text in one padded model call; each text's audio joined."""
        per_text = [[tokens for chunk in split_chunks(text, self.max_chunk_chars)
                     for tokens in self.engine.tokenize(chunk, self.voice)] for text in texts]
        items = [EngineInput(tokens, self.voice) for token_lists in per_text for tokens in token_lists]
        started = time.perf_counter()
        audio = iter(output.audio for output in synthesize_batch(self.engine, items))
        self.metrics.batch_finished(self.engine.name, BatchRecord(
            time.monotonic(), self.engine.name, len(items), padded_tokens(items), sum(item.length for item in items),
            time.perf_counter() - started, MAX_BATCH_SIZE), [])
        return [join([next(audio) for _ in token_lists], self.engine.sample_rate) for token_lists in per_text]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--voice", default="en_US-joe-medium")
    parser.add_argument("--voices-file")
    args = parser.parse_args()
    ray.init(include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    try:
        serve.run(RaySpeech.bind(args.voice, args.voices_file), route_prefix="/")
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):  # after Ray's start-up, which sets its own
            signal.signal(signum, lambda *_: stop.set())
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
