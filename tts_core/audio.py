"""Audio encoding (one PyAV path for every format) and joining of chunk audio."""

from __future__ import annotations

import io
from dataclasses import dataclass

import av
import numpy as np


@dataclass(frozen=True)
class AudioFormat:
    container: str
    codec: str
    content_type: str
    sample_rate: int | None = None  # None: keep the engine's rate


FORMATS: dict[str, AudioFormat] = {
    "mp3": AudioFormat("mp3", "libmp3lame", "audio/mpeg"),
    "opus": AudioFormat("ogg", "libopus", "audio/ogg", 24000),  # Opus runs at 8/12/16/24/48 kHz
    "aac": AudioFormat("adts", "aac", "audio/aac"),
    "flac": AudioFormat("flac", "flac", "audio/flac"),
    "wav": AudioFormat("wav", "pcm_s16le", "audio/wav"),
    # What OpenAI documents for pcm: 24 kHz, 16-bit signed little-endian, mono, no header.
    "pcm": AudioFormat("s16le", "pcm_s16le", "audio/pcm", 24000),
}

JOIN_PAUSE_S = 0.12
EDGE_FADE_S = 0.005


def encode(audio: np.ndarray, sample_rate: int, format_name: str) -> bytes:
    """Encode float32 mono audio in [-1, 1]; PyAV resamples to what the codec needs."""
    spec = FORMATS[format_name]
    buffer = io.BytesIO()
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio, dtype=np.float32)[None, :],
                                       format="flt", layout="mono")
    frame.sample_rate = sample_rate
    with av.open(buffer, "w", format=spec.container) as container:
        stream = container.add_stream(spec.codec, rate=spec.sample_rate or sample_rate, layout="mono")
        for packet in stream.encode(frame if audio.size else None):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


def join(chunks: list[np.ndarray], sample_rate: int) -> np.ndarray:
    """Concatenate sentence audio with a short pause, fading each edge so no join clicks."""
    fade = max(1, int(EDGE_FADE_S * sample_rate))
    pause = np.zeros(int(JOIN_PAUSE_S * sample_rate), dtype=np.float32)
    pieces: list[np.ndarray] = []
    for index, chunk in enumerate(chunks):
        chunk = chunk.astype(np.float32, copy=True)
        edge = min(fade, chunk.size // 2)
        if edge:
            ramp = np.linspace(0.0, 1.0, edge, dtype=np.float32)
            chunk[:edge] *= ramp
            chunk[-edge:] *= ramp[::-1]
        if index:
            pieces.append(pause)
        pieces.append(chunk)
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
