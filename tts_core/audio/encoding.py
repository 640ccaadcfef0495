"""Encoding: whole WAV and FLAC files are written by soundfile (libsndfile); PyAV encodes the compressed
formats (mp3, opus, aac), raw pcm and every stream."""

from __future__ import annotations

import io
from dataclasses import dataclass

import av
import numpy as np
import soundfile

from .playable import resample

MIN_RATE, MAX_RATE = 8000, 48000  # what a request may ask for
_MPEG_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)


@dataclass(frozen=True)
class AudioFormat:
    container: str
    codec: str
    content_type: str
    sample_rate: int | None = None  # None: keep the engine's rate
    rates: tuple[int, ...] | None = None  # the rates the codec takes; None: any

    def rate(self, engine_rate: int, asked: int | None = None) -> int:
        """The rate to encode at: the one asked for (resampled to), else the format's own, else the engine's."""
        return asked or self.sample_rate or engine_rate


# Written by soundfile (libsndfile's container names): a plain RIFF header, no encoder tags.
SOUNDFILE_FORMATS = {"wav": "WAV", "flac": "FLAC"}
FORMATS: dict[str, AudioFormat] = {
    "mp3": AudioFormat("mp3", "libmp3lame", "audio/mpeg", rates=_MPEG_RATES),
    "opus": AudioFormat("ogg", "libopus", "audio/ogg", 24000, (8000, 12000, 16000, 24000, 48000)),
    "aac": AudioFormat("adts", "aac", "audio/aac", rates=_MPEG_RATES),
    "flac": AudioFormat("flac", "flac", "audio/flac"),
    "wav": AudioFormat("wav", "pcm_s16le", "audio/wav"),
    # What OpenAI documents for pcm: 24 kHz, 16-bit signed little-endian, mono, no header.
    "pcm": AudioFormat("s16le", "pcm_s16le", "audio/pcm", 24000),
}


def unsupported_rate(format_name: str, rate: int | None) -> str | None:
    """Why a format cannot be encoded at a rate a request asks for (None: it can)."""
    allowed = FORMATS[format_name].rates
    if rate is None or (MIN_RATE <= rate <= MAX_RATE and (allowed is None or rate in allowed)):
        return None
    if allowed is None:
        return f"sample_rate must be between {MIN_RATE} and {MAX_RATE}"
    return f"{format_name} takes a sample_rate of {', '.join(map(str, allowed))}"


def encode(audio: np.ndarray, sample_rate: int, format_name: str, out_rate: int | None = None) -> bytes:
    """Encode float32 mono audio in [-1, 1] at out_rate (or the format's rate, or sample_rate): WAV and
    FLAC with soundfile, the others with PyAV; PyAV's resampler converts the rate."""
    spec = FORMATS[format_name]
    buffer = io.BytesIO()
    if format_name in SOUNDFILE_FORMATS and (audio.size or format_name == "wav"):  # (of no samples libsndfile
        # writes no FLAC header at all: PyAV writes that one)
        rate = spec.rate(sample_rate, out_rate)
        soundfile.write(buffer, int16(resample(audio, sample_rate, rate)), rate,
                        format=SOUNDFILE_FORMATS[format_name], subtype="PCM_16")
        return buffer.getvalue()
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio, dtype=np.float32)[None, :],
                                       format="flt", layout="mono")
    frame.sample_rate = sample_rate
    with av.open(buffer, "w", format=spec.container) as container:
        stream = container.add_stream(spec.codec, rate=spec.rate(sample_rate, out_rate), layout="mono")
        for packet in stream.encode(frame) if audio.size else ():  # (the codec is flushed once, below)
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


def int16(audio: np.ndarray) -> np.ndarray:
    """float32 audio in [-1, 1] as 16-bit samples, converted as FFmpeg converts (scaled by 2^15, rounded,
    clipped): a WAV file, its stream and raw pcm carry the same samples."""
    return np.clip(np.rint(np.asarray(audio, dtype=np.float32) * 32768.0), -32768, 32767).astype("<i2")


def pcm16(audio: np.ndarray) -> bytes:
    """float32 audio in [-1, 1] as raw 16-bit signed little-endian samples, at its own rate."""
    return int16(audio).tobytes()


STREAMABLE = ("pcm", "wav", "mp3", "opus", "aac")  # FLAC writes its header last: not streamable


class StreamEncoder:
    """Encodes audio piece by piece into one stream whose concatenated bytes decode as one file.

    One container is kept open for the whole stream; after each piece, what it has written is
    drained and returned. WAV goes out with an unknown-size header, as streaming players expect.
    """

    def __init__(self, format_name: str, sample_rate: int, out_rate: int | None = None):
        """out_rate: the rate asked for. The codec keeps one resampler for the whole stream, so pieces
        join as one resampled signal (no edge effects at their joins)."""
        if format_name not in STREAMABLE:
            raise ValueError(f"{format_name} cannot be streamed")
        self.format_name = format_name
        self._spec = FORMATS["pcm" if format_name == "wav" else format_name]
        self._rate = sample_rate
        self._out_rate = FORMATS[format_name].rate(sample_rate, out_rate)
        self._buffer = io.BytesIO()
        # The MP3 muxer would seek back at the end to fill in a Xing header: not in a stream.
        # Ogg pages are cut every 100 ms rather than every second, so the first audio leaves early.
        options = {"mp3": {"write_xing": "0"}, "opus": {"page_duration": "100000"}}.get(format_name, {})
        self._container = av.open(self._buffer, "w", format=self._spec.container, options=options)
        self._stream = self._container.add_stream(self._spec.codec, rate=self._out_rate, layout="mono")
        self._started = False

    def _drain(self) -> bytes:
        data = self._buffer.getvalue()
        self._buffer.seek(0)
        self._buffer.truncate()
        return data

    def _wav_header(self) -> bytes:
        unknown = 0xFFFFFFFF
        byte_rate = self._out_rate * 2
        return (b"RIFF" + unknown.to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
                + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + self._out_rate.to_bytes(4, "little")
                + byte_rate.to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
                + b"data" + unknown.to_bytes(4, "little"))

    def encode(self, audio: np.ndarray) -> bytes:
        head = b""
        if not self._started:
            self._started = True
            head = self._wav_header() if self.format_name == "wav" else b""
        if audio.size:
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio, dtype=np.float32)[None, :],
                                               format="flt", layout="mono")
            frame.sample_rate = self._rate
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        return head + self._drain()

    def finish(self) -> bytes:
        head = self.encode(np.zeros(0, dtype=np.float32)) if not self._started else b""
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        return head + self._drain()
