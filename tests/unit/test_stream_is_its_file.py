"""A stream is its file: the same text gives the same audio whole or streamed, on the bundled Piper voice (noise off,
so that two syntheses of one text can be compared). A file used to be synthesized in whole sentences while its stream
began with short pieces cut at clause ends, where the voice lengthens: this text's stream was 3.3% shorter."""

from __future__ import annotations

import asyncio

import pytest

from tts_core.config import Settings
from tts_core.engines.piper import PiperEngine, bundled_voice_path
from tts_core.ops.metrics import Metrics
from tts_core.request.ask import Ask
from tts_core.service import SpeechService

CLAUSES = "Wait, stop, listen: the bell, the bell is ringing. Go now."


@pytest.fixture(scope="module")
def service():
    engine = PiperEngine(bundled_voice_path(), noise_scale=0.0, noise_w=0.0)
    service = SpeechService(Settings(batch_policy="sequential", calibration_sizes=[1]), [engine], Metrics())
    service.start()
    yield service
    service.stop()


def test_a_stream_is_the_same_audio_as_its_file(service):
    async def file() -> bytes:
        return (await service.answer(Ask(CLAUSES, "alloy", response_format="pcm"))).data

    async def stream() -> list[bytes]:
        answer = await service.answer(Ask(CLAUSES, "alloy", response_format="pcm", stream=True))
        return [data async for data, _, _ in answer.encoded("pcm") if data]

    whole, pieces = asyncio.run(file()), asyncio.run(stream())
    assert len(pieces) > 2  # the stream starts with short pieces (its first clauses)
    streamed = b"".join(pieces)
    assert len(whole) > 2 * 24000 * 3  # over 3 s of 16-bit audio at pcm's 24 kHz
    assert len(streamed) == pytest.approx(len(whole), rel=0.01), (len(streamed), len(whole))
