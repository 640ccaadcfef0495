"""Decoding helpers shared by the integration tests."""

from __future__ import annotations

import io

import av
import numpy as np

from bench.recognition import as_heard


def decode(data: bytes, response_format: str) -> tuple[np.ndarray, int]:
    """Decode any response format to float32 mono samples and their rate."""
    if response_format == "pcm":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768, 24000
    chunks, rate = [], 0
    with av.open(io.BytesIO(data)) as container:
        for frame in container.decode(audio=0):
            rate = frame.sample_rate
            chunks.append(frame.to_ndarray().astype(np.float32).reshape(frame.layout.nb_channels, -1)[0])
    samples = np.concatenate(chunks)
    if np.abs(samples).max() > 2:  # integer sample formats
        samples = samples / 32768
    return samples, rate


def duration(data: bytes, response_format: str) -> float:
    samples, rate = decode(data, response_format)
    return samples.size / rate


def to_16k_int16(data: bytes) -> np.ndarray:
    """A WAV file as pocketsphinx listens to it."""
    return as_heard(*decode(data, "wav"))
