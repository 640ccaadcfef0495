"""Assembly: a request's queued pieces become its answer, one way for a whole file and for a stream.

`Assembly` places each piece's audio in the answer: at the answer's sample rate, its edges faded, behind the pause
before it, with the words it speaks timed from the answer's start; the script's closing pause ends it. A file is
its pieces joined (`Assembly.whole`); a `SentenceStream` hands the same pieces out as their audio comes, so a
stream and its file are the same audio.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import numpy as np

from ..audio.encoding import StreamEncoder
from ..audio.playable import faded, resample, silence
from ..engines.contract import EngineOutput
from ..ops.metrics import Metrics
from ..scheduler.records import QueuedItem
from .captions import Timed, timed_words
from .dispatch import pieces_of
from .script import Script


class Assembly:
    """The answer's audio, piece by piece in order (`place`), for one script's queued items."""

    def __init__(self, script: Script, items: list[QueuedItem]):
        self.script, self.items, self.sample_rate = script, items, script.voice.sample_rate
        self.placed = 0  # samples of the answer so far
        self._heard: dict[int, tuple[float, list[np.ndarray]]] = {}  # an item handed out in pieces, words untimed

    def place(self, index: int, piece_index: int, output: EngineOutput) -> tuple[np.ndarray, int, list[Timed]]:
        """Piece `piece_index` of item `index`'s audio (a stepped engine hands an item out in pieces; else its one
        piece is the whole) ready to concatenate; how many of its samples are speech (the rest is the pause in
        front); and the words it speaks, timed. A piece a stream's ramp cut from its chunk keeps its edges: the cut
        falls at a clause, where the whole chunk pauses too, about as long as the voice's silence at the two edges
        (trimmed, the stream came out shorter than the file)."""
        item = self.items[index]
        audio = resample(output.audio, item.sample_rate, self.sample_rate)
        # a sentence's first piece fades in after the pause; only a whole one knows its end
        piece = faded(audio, self.sample_rate, fade_in=piece_index == 0, fade_out=item.pieces is None,
                      pause_s=item.pause_s if piece_index == 0 else 0.0)
        speech_at = (self.placed + piece.size - audio.size) / self.sample_rate
        self.placed += piece.size
        if item.said is not None and item.pieces is not None:  # its words are found in its whole audio: `finish`
            self._heard.setdefault(index, (speech_at, []))[1].append(audio)
            return piece, audio.size, []
        return piece, audio.size, timed_words(item, output, speech_at) if piece_index == 0 else []

    def finish(self, index: int) -> list[Timed]:
        """The words of item `index`, handed out in pieces, timed once its last piece is placed (a stepped engine's
        stream: words an engine does not time are found in the sentence's whole audio); else none."""
        if index not in self._heard:
            return []
        speech_at, pieces = self._heard.pop(index)
        return timed_words(self.items[index], EngineOutput(np.concatenate(pieces)), speech_at, self.sample_rate)

    def ending(self) -> np.ndarray:
        """The silence after the last piece (an SSML document's closing pause; else none)."""
        return silence(self.script.pause_after_s, self.sample_rate)

    def whole(self, outputs: list[EngineOutput]) -> tuple[np.ndarray, list[Timed]]:
        """A file: every item's whole output placed, joined; and their words, timed."""
        pieces, timed = [], []
        for index, output in enumerate(outputs):
            piece, _, words = self.place(index, 0, output)
            pieces.append(piece)
            timed += words
        return np.concatenate([*pieces, self.ending()]), timed


class SentenceStream:
    """The audio of one queued text, sentence by sentence, strictly in order, each piece ready to
    concatenate (edges faded, the pause in front). Closing it, or leaving a loop over it early,
    takes the sentences not yet synthesized out of the queue."""

    def __init__(self, script: Script, items: list[QueuedItem], started: float, metrics: Metrics,
                 run_allowance_s: float):
        self.script, self.voice, self.sample_rate, self.items = script, script.voice, script.voice.sample_rate, items
        self._started, self._metrics, self._run_allowance_s = started, metrics, run_allowance_s

    async def __aiter__(self) -> AsyncIterator[np.ndarray]:
        async for piece, _ in self.timed():
            yield piece

    async def timed(self) -> AsyncIterator[tuple[np.ndarray, list[Timed]]]:
        """The pieces, each with the words it speaks timed from the stream's start (when the items were
        queued with their words; else none)."""
        assembly = Assembly(self.script, self.items)
        try:
            for index, item in enumerate(self.items):
                async for piece_index, output in _numbered(pieces_of(item, self._run_allowance_s)):
                    if index == 0 and piece_index == 0:
                        self._metrics.first_audio(time.monotonic() - self._started)
                    piece, speech, words = await asyncio.to_thread(assembly.place, index, piece_index, output)
                    self._metrics.audio_seconds.inc(speech / self.sample_rate)
                    yield piece, words
                if words := await asyncio.to_thread(assembly.finish, index):
                    yield np.zeros(0, dtype=np.float32), words
            if self.script.pause_after_s:
                yield assembly.ending(), []
            self._metrics.chunks_per_request.observe(len(self.items))
        finally:
            self.close()

    def close(self) -> None:
        for item in self.items:
            item.abandon()

    async def encoded(self, response_format: str, sample_rate: int | None = None
                      ) -> AsyncIterator[tuple[bytes, float, list[Timed]]]:
        """The stream encoded as one file in a streamable format (at sample_rate, if asked): (bytes, seconds of
        audio they add, the words they speak); the last one flushes the encoder."""
        async for encoded in encoded_stream(self, response_format, sample_rate):
            yield encoded


async def encoded_stream(stream, response_format: str, sample_rate: int | None = None
                         ) -> AsyncIterator[tuple[bytes, float, list]]:
    """A stream of timed audio (a sentence stream, a dialogue's turns: `timed()`, `sample_rate`, `close()`) encoded
    as one file in a streamable format: (bytes, seconds of audio they add, the words they speak); the last one
    flushes the encoder. The stream is closed at the end, or when its reader stops."""
    encoder = StreamEncoder(response_format, stream.sample_rate, sample_rate)
    try:
        async for audio, words in stream.timed():
            data = await asyncio.to_thread(encoder.encode, audio)
            yield data, audio.size / stream.sample_rate, words
        yield await asyncio.to_thread(encoder.finish), 0.0, []
    finally:
        stream.close()


async def _numbered(pieces: AsyncIterator[EngineOutput]) -> AsyncIterator[tuple[int, EngineOutput]]:
    index = 0
    async for piece in pieces:
        yield index, piece
        index += 1
