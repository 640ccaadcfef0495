"""Joins between sentences: no click (no sample jump beyond the signal's own) and no DC step."""

import numpy as np

from tts_core.audio.playable import JOIN_PAUSE_S, faded, join

RATE = 22050


def sentence(seconds: float, dc: float, frequency: float, phase: float) -> np.ndarray:
    """Speech-like worst case: a tone riding on a DC offset, cut anywhere in its cycle."""
    t = np.arange(int(seconds * RATE)) / RATE
    return (dc + 0.3 * np.sin(2 * np.pi * frequency * t + phase)).astype(np.float32)


CHUNKS = [sentence(0.5, 0.4, 180, 1.0), sentence(0.7, -0.3, 240, 2.5), sentence(0.4, 0.2, 300, 0.3)]


def join_points(chunks: list[np.ndarray]) -> list[int]:
    pause, points, at = int(JOIN_PAUSE_S * RATE), [], 0
    for chunk in chunks[:-1]:
        at += chunk.size
        points += [at, at + pause]  # where a sentence ends and where the next begins
        at += pause
    return points


def largest_step(audio: np.ndarray, around: int, width: int = 8) -> float:
    window = audio[max(0, around - width):around + width]
    return float(np.abs(np.diff(window)).max())


def test_joins_add_no_jump_larger_than_the_signal_itself():
    joined = join(CHUNKS, RATE)
    own_step = max(float(np.abs(np.diff(chunk)).max()) for chunk in CHUNKS)
    for point in join_points(CHUNKS):
        assert largest_step(joined, point) <= own_step
    raw = np.concatenate(CHUNKS)  # what a plain concatenation would do: a click at each join
    assert largest_step(raw, CHUNKS[0].size) > 10 * own_step


def test_joins_have_no_dc_step():
    joined = join(CHUNKS, RATE)
    pause = int(JOIN_PAUSE_S * RATE)
    for point in join_points(CHUNKS)[::2]:
        assert abs(joined[point - 1]) < 0.01 and abs(joined[point + pause]) < 0.01  # edges come to rest at 0
        assert np.all(joined[point:point + pause] == 0)  # the pause between them is silent, not offset
    assert abs(joined[0]) < 0.01 and abs(joined[-1]) < 0.01


def test_streamed_pieces_concatenate_to_the_same_join():
    pieces = [faded(chunk, RATE, pause_s=JOIN_PAUSE_S if index else 0.0) for index, chunk in enumerate(CHUNKS)]
    assert np.array_equal(np.concatenate(pieces), join(CHUNKS, RATE))
