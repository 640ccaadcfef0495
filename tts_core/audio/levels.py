"""Loudness matched across voices: a dialogue's turns, each in its speaker's voice (voices of different models
speak at different levels), are scaled to one speech level, their peaks kept below full scale."""

from __future__ import annotations

import numpy as np

TARGET_LEVEL = 0.1  # RMS of the speech (-20 dBFS): leaves a loud voice's peaks room below full scale
MOST_PEAK = 0.97
MOST_GAIN = 8.0  # a whisper-quiet turn is raised this much at most (its noise would rise with it)
FRAME_S = 0.02
SPEECH_FRAME = 0.01  # a frame quieter than this (RMS, 1% of full scale) is a pause, not speech


def speech_level(audio: np.ndarray, sample_rate: int) -> float:
    """The RMS of the audio's speech: of its 20 ms frames that are not pauses (a turn's pauses would otherwise
    count a slow speaker quieter than a fast one)."""
    size = max(1, round(FRAME_S * sample_rate))
    frames = audio[:audio.size // size * size].astype(np.float64).reshape(-1, size)
    if not frames.size:
        return 0.0
    powers = (frames ** 2).mean(axis=1)
    speech = powers[powers > SPEECH_FRAME ** 2]
    return float(np.sqrt(speech.mean())) if speech.size else 0.0


def gain_for(audio: np.ndarray, sample_rate: int) -> float:
    """The gain that brings the audio's speech to TARGET_LEVEL, its peak at most MOST_PEAK (1.0 for silence)."""
    level = speech_level(audio, sample_rate)
    if level == 0.0:
        return 1.0
    peak = float(np.abs(audio).max())
    return min(TARGET_LEVEL / level, MOST_PEAK / peak, MOST_GAIN)


def scaled(audio: np.ndarray, gain: float) -> np.ndarray:
    """The audio times gain, clipped to full scale (a streamed turn's gain is set by its first piece: a later
    piece may peak higher)."""
    return np.clip(audio * np.float32(gain), -1.0, 1.0).astype(np.float32)


def matched(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    return scaled(audio, gain_for(audio, sample_rate))
