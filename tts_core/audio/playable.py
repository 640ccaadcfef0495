"""Audio made playable: pieces joined with pauses, edges faded, silence, and resampling
(PyAV's resampler)."""

from __future__ import annotations

import av
import numpy as np

JOIN_PAUSE_S = 0.12
EDGE_FADE_S = 0.005


def join(chunks: list[np.ndarray], sample_rate: int, pauses_s: list[float] | None = None) -> np.ndarray:
    """Concatenate sentence audio with a pause before each (by default none before the first and a short
    one between sentences), fading each edge so no join clicks."""
    if pauses_s is None:
        pauses_s = [0.0] + [JOIN_PAUSE_S] * (len(chunks) - 1)
    pieces = [faded(chunk, sample_rate, pause_s=pause) for chunk, pause in zip(chunks, pauses_s, strict=True)]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)


def silence(seconds: float, sample_rate: int) -> np.ndarray:
    return np.zeros(round(seconds * sample_rate), dtype=np.float32)


def resample(audio: np.ndarray, sample_rate: int, target_rate: int) -> np.ndarray:
    """float32 mono at another rate."""
    audio = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
    if sample_rate == target_rate or not audio.size:
        return audio
    frame = av.AudioFrame.from_ndarray(audio[None, :], format="flt", layout="mono")
    frame.sample_rate = sample_rate
    resampler = av.AudioResampler(format="flt", layout="mono", rate=target_rate)
    pieces = [out.to_ndarray().reshape(-1) for out in [*resampler.resample(frame), *resampler.resample(None)]]
    return np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)


def faded(chunk: np.ndarray, sample_rate: int, fade_in: bool = True, fade_out: bool = True,
          pause_s: float = 0.0) -> np.ndarray:
    """One piece of a join, streamed: its edges faded as asked, with a pause in front (a sentence streamed
    in several pieces fades in on the first and is joined seamlessly after)."""
    chunk = chunk.astype(np.float32, copy=True)
    edge = min(max(1, int(EDGE_FADE_S * sample_rate)), chunk.size // 2)
    if edge:
        ramp = np.linspace(0.0, 1.0, edge, dtype=np.float32)
        if fade_in:
            chunk[:edge] *= ramp
        if fade_out:
            chunk[-edge:] *= ramp[::-1]
    return np.concatenate([silence(pause_s, sample_rate), chunk]) if pause_s else chunk
