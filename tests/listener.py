"""A plain HTTP/1.1 listener on 127.0.0.1 playing an upstream speech server, for the upstream engine's tests:
it records every request it reads and answers as its `answer` says (audio, an error, silence, a cut stream), and
its voice list as `voices` says.
Real sockets, real HTTP: the engine under test cannot tell it from a server that behaves that way."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field

import numpy as np

# a second of a 220 Hz tone at 24 kHz, as 16-bit PCM: what the listener speaks
TONE = (np.sin(2 * np.pi * 220 * np.arange(24000) / 24000) * 12000).astype("<i2").tobytes()


@dataclass
class Answer:
    """What the listener answers: `kind` is "audio" (chunked PCM in `chunks` pieces of odd sizes, so samples are
    split between reads; `pause_s` before each piece but the first: a slow upstream), "status" (`status` with
    `body` and `headers`), "json200" (a 200 that is JSON, not audio), "hang" (reads the request, answers nothing),
    or "cut" (the audio's first chunk, then the connection closes)."""

    kind: str = "audio"
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    chunks: int = 5
    audio: bytes = TONE
    pause_s: float = 0.0


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: dict


class Listener:
    def __init__(self, answer: Answer | None = None, one_at_a_time: bool = False, voices: object = None):
        self.answer = answer or Answer()
        self.voices = voices  # what GET /v1/audio/voices answers (JSON); None: 404
        self.one_at_a_time = one_at_a_time  # audio answers wait for each other (a server that runs one at a time)
        self.requests: list[Received] = []
        self.hanging = 0  # requests it is not answering (kind "hang") whose client has not yet gone
        self._loop = asyncio.new_event_loop()
        self._turn: asyncio.Lock | None = None  # made on its loop
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._started.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._turn = asyncio.Lock()
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._started.set()
        self._loop.run_forever()

    def close(self) -> None:
        """Stop listening and end every connection (their handlers finish before the loop stops); once."""
        if self._loop.is_closed():
            return

        async def shut() -> None:
            self._server.close()
            handlers = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in handlers:
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """One request and its answer; False when the connection is to close."""
        line = await reader.readline()
        if not line:
            return False
        method, path, _ = line.decode().split(" ", 2)
        headers = {}
        while (header := await reader.readline()) not in (b"\r\n", b""):
            name, value = header.decode().split(":", 1)
            headers[name.strip().lower()] = value.strip()
        raw = await reader.readexactly(int(headers.get("content-length", 0)))
        self.requests.append(Received(method, path, headers, json.loads(raw) if raw else {}))
        if method == "GET" and path == "/v1/audio/voices":
            if self.voices is None:
                return await _json(writer, 404, b'{"detail": "Not Found"}')
            return await _json(writer, 200, json.dumps(self.voices).encode())
        answer = self.answer
        if answer.kind == "hang":
            self.hanging += 1
            try:
                await reader.read()  # until the client goes
            finally:
                self.hanging -= 1
            return False
        if answer.kind == "status":
            return await _json(writer, answer.status, answer.body, answer.headers)
        if answer.kind == "json200":
            return await _json(writer, 200, b'{"ok": true}')
        if self.one_at_a_time:
            async with self._turn:
                return await self._audio(answer, writer)
        return await self._audio(answer, writer)

    async def _audio(self, answer: Answer, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: audio/pcm\r\ntransfer-encoding: chunked\r\n\r\n")
        size = len(answer.audio) // answer.chunks | 1  # odd: a sample split between chunks
        pieces = [answer.audio[start:start + size] for start in range(0, len(answer.audio), size)]
        for number, piece in enumerate(pieces[:1] if answer.kind == "cut" else pieces):
            if number and answer.pause_s:
                await asyncio.sleep(answer.pause_s)  # the upstream making its audio
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        if answer.kind == "cut":
            return False  # closed with no last chunk: the stream is cut
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


async def _json(writer: asyncio.StreamWriter, status: int, body: bytes, headers: dict[str, str] | None = None) -> bool:
    """An answer of `status` whose body is JSON (with any `headers` more); the connection stays open."""
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
                 f"{extra}\r\n".encode() + body)
    await writer.drain()
    return True
