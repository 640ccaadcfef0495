"""A hostile upstream speech server on 127.0.0.1: the plain listener (tests/listener.py) with the answers a
misbehaving server gives, for the upstream engine's tests and the fault replay (tests/faults/test_upstream_faults.py).

Beside the listener's answers: "endless" (200 raw PCM that never ends, at loopback speed), "endless_error" (`status`
with a body that never ends) and "body" (`status` with exactly `body` and `headers`: a 1-byte answer, a WAV). It
counts the bytes of its endless answers (`sent`) and those still being sent (`streaming`)."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import soundfile

from tests.listener import TONE, Answer, Listener

PIECE = TONE[:65536]  # what an endless answer writes, again and again


def wav_of(audio: np.ndarray, rate: int, subtype: str = "PCM_16", streamed: bool = True) -> bytes:
    """A WAV of the audio; streamed: with the unknown sizes a server writes when it streams one."""
    file = io.BytesIO()
    soundfile.write(file, audio, rate, format="WAV", subtype=subtype)
    data = bytearray(file.getvalue())
    if streamed:
        data[4:8] = b"\xff\xff\xff\xff"
        data[data.index(b"data") + 4:data.index(b"data") + 8] = b"\xff\xff\xff\xff"
    return bytes(data)


class HostileUpstream(Listener):
    def __init__(self, answer: Answer | None = None, voices: object = None):
        self.sent = 0  # bytes of endless answers written
        self.streaming = 0  # endless answers still being written (their client has not closed)
        super().__init__(answer, voices=voices)

    async def _audio(self, answer: Answer, writer: asyncio.StreamWriter) -> bool:
        if answer.kind == "body":
            head = "".join(f"{name}: {value}\r\n" for name, value in answer.headers.items())
            writer.write(f"HTTP/1.1 {answer.status} X\r\ncontent-length: {len(answer.body)}\r\n{head}\r\n".encode()
                         + answer.body)
            await writer.drain()
            return True
        if answer.kind == "endless":
            return await self._endless(writer, 200, "audio/pcm", PIECE)
        if answer.kind == "endless_error":
            return await self._endless(writer, answer.status, "text/plain", b"x" * len(PIECE))
        return await super()._audio(answer, writer)

    async def _endless(self, writer: asyncio.StreamWriter, status: int, kind: str, piece: bytes) -> bool:
        """Chunks of `piece` until the client closes the connection."""
        writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: {kind}\r\ntransfer-encoding: chunked\r\n\r\n".encode())
        self.streaming += 1
        try:
            while True:
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                self.sent += len(piece)
        finally:
            self.streaming -= 1
