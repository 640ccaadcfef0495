"""Audio that arrives in pieces over a connection (an upstream's answer), read as float32 mono at a given rate:
raw 16-bit PCM, or a WAV whose header is read as a header (its format and rate from it), not played as samples.

A piece's bytes need not end on a sample: what is left over waits for the next piece. `samples` counts what has
been read whole, so that an answer with bytes but no whole sample is told apart from one with audio.
"""

from __future__ import annotations

import av
import numpy as np

MOST_HEADER_BYTES = 64 * 1024  # a WAV's chunks before its data: more is not a header
PCM, FLOAT, EXTENSIBLE = 1, 3, 0xFFFE  # WAV format tags
READABLE = {(PCM, 16): "<i2", (FLOAT, 32): "<f4"}  # (format, bits per sample) -> the samples' dtype
UNKNOWN_SIZES = (0, 0xFFFFFFFF)  # a streamed WAV's data size: not known when its header was written


class UnreadableAudio(ValueError):
    """The bytes are not audio this reader can read (a WAV in a format it does not know, a header past its bound)."""


def is_wav(head: bytes) -> bool:
    return head[:4] == b"RIFF" and head[8:12] == b"WAVE"


class PcmStream:
    def __init__(self, rate: int, wav: bool = False):
        """rate: the rate to read at (and raw PCM's own). wav: the bytes begin with a WAV header."""
        self.rate = rate
        self.samples = 0  # read whole so far, at `rate`
        self._header: bytearray | None = bytearray() if wav else None  # a WAV header not yet read whole
        self._dtype, self._channels, self._source_rate = np.dtype("<i2"), 1, rate
        self._left: int | None = None  # a WAV's data bytes still to come, where its header says
        self._carry = b""  # bytes of a sample (or frame) split between two pieces
        self._resampler: av.AudioResampler | None = None

    def read(self, data: bytes) -> np.ndarray:
        """The whole samples the bytes complete (empty while a WAV header is still arriving)."""
        if self._header is not None:
            self._header += data
            if (data := self._read_header()) is None:
                return np.zeros(0, np.float32)
        if self._left is not None:  # (a chunk after the data, such as LIST, is not audio)
            data, self._left = data[:self._left], max(0, self._left - len(data))
        data = self._carry + data
        frame = self._dtype.itemsize * self._channels
        whole = len(data) - len(data) % frame
        self._carry = data[whole:]
        samples = np.frombuffer(data[:whole], dtype=self._dtype).astype(np.float32)
        if self._dtype.kind == "i":
            samples /= 32768.0
        return self._at_rate(samples.reshape(-1, self._channels).mean(axis=1) if self._channels > 1 else samples)

    def finish(self) -> np.ndarray:
        """What the resampler still holds, once the bytes have ended."""
        return self._at_rate(None) if self._resampler is not None else np.zeros(0, np.float32)

    def _at_rate(self, samples: np.ndarray | None) -> np.ndarray:
        if self._source_rate != self.rate:
            if self._resampler is None:  # one for the whole answer: its pieces join as one signal
                self._resampler = av.AudioResampler(format="flt", layout="mono", rate=self.rate)
            frame = None
            if samples is not None:
                if not samples.size:
                    return samples
                frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples)[None, :], format="flt",
                                                   layout="mono")
                frame.sample_rate = self._source_rate
            out = [piece.to_ndarray().reshape(-1) for piece in self._resampler.resample(frame)]
            samples = np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)
        self.samples += samples.size
        return samples

    def _read_header(self) -> bytes | None:
        """Once the header has arrived whole (up to its data chunk): its format taken, the bytes after it returned."""
        head = bytes(self._header)
        if len(head) >= 12 and not is_wav(head):
            raise UnreadableAudio("the answer says it is a WAV but does not begin with a RIFF/WAVE header")
        at, found = 12, None
        while at + 8 <= len(head):
            name, size = head[at:at + 4], int.from_bytes(head[at + 4:at + 8], "little")
            if name == b"fmt " and at + 8 + min(size, 40) <= len(head):
                found = head[at + 8:at + 8 + min(size, 40)]
            if name == b"data":
                self._take_format(found)
                self._header, self._left = None, None if size in UNKNOWN_SIZES else size
                return head[at + 8:]
            at += 8 + size + size % 2  # (chunks are padded to an even size)
        if len(head) > MOST_HEADER_BYTES:
            raise UnreadableAudio(f"the WAV header goes on past {MOST_HEADER_BYTES} bytes")
        return None

    def _take_format(self, fmt: bytes | None) -> None:
        if fmt is None or len(fmt) < 16:
            raise UnreadableAudio("the WAV has no format chunk before its data")
        tag, channels = int.from_bytes(fmt[0:2], "little"), int.from_bytes(fmt[2:4], "little")
        rate, bits = int.from_bytes(fmt[4:8], "little"), int.from_bytes(fmt[14:16], "little")
        if tag == EXTENSIBLE and len(fmt) >= 26:
            tag = int.from_bytes(fmt[24:26], "little")  # the sub-format's first two bytes: its tag
        if (tag, bits) not in READABLE or not channels or not rate:
            raise UnreadableAudio(f"a WAV of format {tag}, {bits} bits, {channels} channels at {rate} Hz cannot "
                                  "be read (16-bit PCM or 32-bit float can)")
        self._dtype, self._channels, self._source_rate = np.dtype(READABLE[tag, bits]), channels, rate
