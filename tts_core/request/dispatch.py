"""Scheduling: a text becomes queued pieces on its model's engine loop, and their audio comes back.

A text is cut into sentences, short ones packed together where there are many (its first pieces shorter, so a
stream's first audio comes sooner; a file is cut where its stream is, so the two are the same audio), tokenized,
and queued as `QueuedItem`s with the caller's identity, priority and deadline; a stream's later pieces are due when
their audio will be needed. The queue refuses the whole text at once if its predicted wait is past the operator's target
(or its deadline), or as invalid if it has more pieces than could ever wait at once. A stream's first piece may
be queued ahead of the rest, from its first sentence read alone (`read_ahead`): the rest follows it once the whole
text is read, if it is still the whole text's first piece (else the text is queued anew). Every piece ends:
synthesized, failed, dropped when its caller goes, or timed out here if nothing answers it.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from ..audio.playable import JOIN_PAUSE_S, resample
from ..audio.word_timing import SaidWords, WordTimer
from ..config import Settings
from ..engines.alignment import share_out
from ..engines.base import Engine
from ..engines.contract import AudioPieces, EngineInput, EngineOutput
from ..errors import ChorusError, DeadlineExceeded, ErrorCode, InvalidRequest, Overloaded
from ..ops.metrics import Metrics
from ..request.access import Caller, Tier
from ..request.script import Passage, Script
from ..scheduler.engine_loop import EngineLoop
from ..scheduler.pool import ModelPool
from ..scheduler.queue import QueueClosed, WaitTarget
from ..scheduler.records import QueuedItem
from ..text.chunks import ramp_up, split_chunks
from ..text.chunks import words as text_words

STREAM_DUE_MARGIN = 0.8  # a stream's piece is scheduled as if due at 80% of its estimated play time
SUBMIT_TRIES = 3  # a model unloaded between lookup and queueing is loaded again, this often at most
# A passage's sentences are packed into at most this many pieces (where the queue holds fewer for its caller, that
# many): any text within TTS_MAX_CHARS fits in what one caller may queue (TTS_MAX_QUEUE_PER_CALLER, 128), with
# room for a stream's shorter first pieces; texts of fewer sentences keep a piece each (interleaved with other
# callers' work, batched side by side).
PIECES_PER_PASSAGE = 64
T = TypeVar("T")


class LeadMoved(ChorusError):
    """A stream's piece read ahead from its first sentence is not the whole text's first piece: the whole is queued
    anew (Scheduler.submit does; never a caller's answer). A ChorusError, to cross from an engine replica whole."""


@dataclass
class ReadAhead:
    """A stream's first piece, queued from its first sentence before the rest of its text was read."""

    items: list[QueuedItem]
    played_s: float  # the stream's audio once it has played (estimated low): the rest's due times go on from there
    spoken: str  # what the sentence says: its first piece was cut from this


class Scheduler:
    def __init__(self, settings: Settings, pool: ModelPool, metrics: Metrics):
        self.settings = settings
        self.pool = pool
        self.metrics = metrics
        self.word_timer = WordTimer(metrics.word_timing)  # words of engines that do not time them
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="text-reader")

    async def read(self, function: Callable[..., T], *args) -> T:
        """function(*args) on the text reader, the one thread where texts are read (normalized, parsed, cut,
        tokenized) off the event loop. One thread, not a pool: reading is pure Python, which holds the GIL, and
        each more thread holding it makes the event loop wait longer for its turn."""
        return await asyncio.get_running_loop().run_in_executor(self._reader, functools.partial(function, *args))

    def close(self) -> None:
        self._reader.shutdown(wait=False, cancel_futures=True)

    def loads(self) -> dict[str, EngineLoop]:
        """Where each serving model's load is read (predicted_wait, pressure, queue_length, status): its engine loop
        here; deploy/ray_serve.py reads its engine replicas' reports instead."""
        return self.pool.loaded()

    async def submit(self, script: Script, caller: Caller | None, streaming: bool = False,
                     target: WaitTarget = WaitTarget(), words: bool = False, ahead: ReadAhead | None = None
                     ) -> list[QueuedItem]:
        """Queue a script's passages (loading their models first if need be); the items' futures resolve
        to their audio, in order. Each item knows the pause before it and its audio's sample rate, and
        with `words`, which word of its passage each token says (voices that time words only). With `ahead`
        (a stream's first piece, queued from its first sentence: read_ahead), the rest of the first passage."""
        items: list[QueuedItem] = []
        played_s = 0.0  # a stream's audio before a passage (estimated low), for its pieces' due times
        try:
            for index, passage in enumerate(script.passages):
                if index == 0 and ahead is not None:
                    items, played_s = await self._after_lead(passage, ahead, caller, target, words)
                    continue
                queued, played_s = await self.submit_passage(passage, index, not items, caller, streaming,
                                                              target, played_s, words)
                items += queued
        except BaseException:  # one passage refused: none of the request runs
            for item in [*items, *(ahead.items if ahead else ())]:
                item.abandon()
            raise
        if not items:
            raise InvalidRequest("input has nothing that can be spoken", "input")
        self.metrics.characters.inc(sum(len(passage.spoken.text) for passage in script.passages))
        return items

    async def submit_stream(self, lead: Script | None, whole: Callable[[], Awaitable[Script]], caller: Caller | None,
                            target: WaitTarget, words: bool) -> tuple[Script, list[QueuedItem]]:
        """A stream's pieces queued: the first from its first sentence read alone (`lead`, where there is one) at
        once, then the rest once `whole()` has read the whole text, meanwhile. That reading still decides every
        refusal, before any audio is out: the piece read ahead is dropped on one."""
        ahead = lead and await self.read_ahead(lead, caller, target, words)
        try:
            script = await whole()
        except BaseException:
            for item in ahead.items if ahead else ():
                item.abandon()
            raise
        return script, await self.submit(script, caller, True, target, words, ahead)

    async def read_ahead(self, lead: Script, caller: Caller | None, target: WaitTarget, words: bool
                         ) -> ReadAhead | None:
        """A stream's first piece queued from its first sentence alone (Admission.lead), while the rest of its text
        is read; None if the sentence has nothing its voice says. The queue's refusals are decided on it here."""
        passage = replace(lead.passages[0], first_piece_only=True)
        items, played_s = await self.submit_passage(passage, 0, True, caller, True, target, 0.0, words)
        return ReadAhead(items, played_s, passage.spoken.text) if items else None

    async def _after_lead(self, passage: Passage, ahead: ReadAhead, caller: Caller | None, target: WaitTarget,
                          words: bool) -> tuple[list[QueuedItem], float]:
        """The first passage's items: the piece read ahead, then the rest; or all of them anew where the whole
        text's first piece is another (its first sentence reads otherwise in context, or is packed with more). The
        first piece's wait was checked against the target as it was queued, and the rest's is the text's own doing;
        but in an overload the last piece's wait still counts, as it would have with the text queued at once."""
        behind = WaitTarget(math.inf, min(target.usual_s, target.overload_s))
        try:
            queued, played_s = await self.submit_passage(replace(passage, after_lead_of=ahead.spoken), 0, True,
                                                          caller, True, behind, ahead.played_s, words)
            return [*ahead.items, *queued], played_s
        except LeadMoved:
            for item in ahead.items:
                item.abandon()
            ahead.items = []
            return await self.submit_passage(passage, 0, True, caller, True, target, 0.0, words)

    def timeout_s(self, caller: Caller | None) -> float:
        """How long a caller's request may take: the server's limit, or its tier's where that is lower."""
        return min(self.settings.request_timeout_s, (caller.tier if caller else Tier()).request_timeout_s)

    async def submit_passage(self, passage: Passage, index: int, first: bool, caller: Caller | None,
                             streaming: bool, target: WaitTarget, played_s: float, words: bool
                             ) -> tuple[list[QueuedItem], float]:
        """The passage's items, queued on its model's engine loop here (none if the voice finds nothing to say in
        it: "." alone), and the stream's audio once they have played. The one place a passage meets its
        engine: deploy/ray_serve.py places it on an engine replica elsewhere instead."""
        tier = caller.tier if caller else Tier()
        identity = caller.identity if caller else ""
        timeout_s = self.timeout_s(caller)
        voice, model_name = passage.voice, passage.model
        loop = await self.pool.loop(model_name)
        speed = passage.speed * voice.speed  # the voice's default speed, times the request's
        share = loop.tier_limit(tier.max_queue_share)
        most = loop.most_per_text(identity, share)
        # the first passage's opening pieces, whole or streamed: a voice lengthens the clause ends where a stream's
        # first pieces are cut, so a file cut elsewhere is other audio (Piper, noise off: up to 3.3% apart)
        ramped = first and not loop.engine.capabilities.makes_frames
        chunks, cuts, first_word = await self._chunks(passage, most, ramped, words)
        tier_name = caller.tier_name if caller else ""
        loop.check(len(chunks), tier_name, identity, tier.priority, share, target, timeout_s)
        engine = loop.engine
        tokenized = await self.read(_tokenized, engine, chunks, cuts, voice.name, words, first_word)
        tokenized = [each for each in tokenized if each[0].size]
        if not tokenized:
            return [], played_s
        deadline = time.monotonic() + timeout_s
        key = engine.batch_key(voice.name, speed)
        items = [QueuedItem(EngineInput(tokens, voice.name, speed, passage.instructions), key=key, deadline=deadline,
                            priority=tier.priority, tier=tier_name, caller=identity, sample_rate=engine.sample_rate,
                            pause_s=0.0 if cut else JOIN_PAUSE_S, cut=cut, passage=index, word_ids=word_ids,
                            said=None if said is None else SaidWords(*said, voice.language, self.word_timer))
                 for tokens, word_ids, cut, said in tokenized]
        first_pause = passage.pause_before_s
        if passage.after_lead_of is None:  # (else its first item follows the piece read ahead: its pause stands)
            items[0].pause_s = (0.0 if first else JOIN_PAUSE_S) if first_pause is None else first_pause
        if streaming:
            played_s = _set_due_times(items, loop, speed, played_s)
            for item in items if loop.hands_out_pieces else ():  # its audio streams out as it is made
                item.pieces = AudioPieces()
        await self._queue(items, loop, model_name, share, target)
        return items, played_s

    async def _chunks(self, passage: Passage, most: int, ramped: bool, words: bool
                      ) -> tuple[list[str], list[bool], int]:
        """The passage's chunks to queue, whether each continues the one before, and the number of the passage's
        words before the first (those of a piece read ahead: Passage.after_lead_of)."""
        if passage.whole:
            return [passage.spoken.text], [False], 0
        chunks, cuts = await self.read(self._pieces, passage.spoken.text, most, ramped)
        if passage.first_piece_only:
            return chunks[:1], cuts[:1], 0
        if passage.after_lead_of is None:
            return chunks, cuts, 0
        lead, _ = await self.read(self._pieces, passage.after_lead_of, most, ramped)
        if lead[:1] != chunks[:1]:
            raise LeadMoved(f"the text's first piece is not its first sentence's: {chunks[:1]} {lead[:1]}")
        return chunks[1:], cuts[1:], len(text_words(chunks[0])) if words else 0

    def _pieces(self, text: str, most: int, ramped: bool) -> tuple[list[str], list[bool]]:
        """The text's chunks, at most `most`, and whether each continues a chunk cut before it (where `ramped`,
        a request's first passage, whole or streamed, the first sentence is cut into short pieces where they fit)."""
        chunks = split_chunks(text, self.settings.max_chunk_chars, min(PIECES_PER_PASSAGE, most))
        if ramped and self.settings.stream_first_chunk_chars:
            pieces = ramp_up(chunks, self.settings.stream_first_chunk_chars, self.settings.max_chunk_chars)
            if len(pieces) <= most:  # a short first piece only where it fits
                return [chunk for chunk, _ in pieces], [cut for _, cut in pieces]
        return chunks, [False] * len(chunks)

    async def _queue(self, items: list[QueuedItem], loop: EngineLoop, model_name: str, share: int | None,
                     target: WaitTarget) -> None:
        for _ in range(SUBMIT_TRIES):
            try:
                loop.submit(items, share, target)
                return
            except QueueClosed:  # unloaded just now: load it again
                loop = await self.pool.loop(model_name)
        raise Overloaded(f"model {model_name} is being reloaded; retry", 1, ErrorCode.MODEL_RELOADING)

    async def collect(self, items: list[QueuedItem], sample_rate: int | None) -> list[EngineOutput]:
        """Every item's output, its audio at sample_rate (None: as its engine made it), in order. If one fails or the
        caller goes, nothing else runs for it."""
        try:
            outputs = await asyncio.gather(*(output_of(item, self.settings.request_timeout_s) for item in items))
            if sample_rate is None:
                return outputs
            return await asyncio.to_thread(lambda: [replace(output, audio=resample(output.audio, item.sample_rate,
                                                                                   sample_rate))
                                                    for item, output in zip(items, outputs, strict=True)])
        except BaseException:  # caller gone, deadline or engine error
            for item in items:
                item.abandon()
            raise


def _tokenized(engine: Engine, chunks: list[str], cuts: list[bool], voice: str, words: bool, first: int = 0
               ) -> list[tuple[np.ndarray, np.ndarray | None, bool, tuple[int, tuple[str, ...]] | None]]:
    """Each sentence's model input (an engine may read a chunk as several), with `words` the word of the passage
    each token says (the chunks' words, in order, are the passage's from its `first` on), and whether it
    continues a chunk cut before it (its chunk's first input only). With `words` from an engine that does not
    time them: the words each input says instead (the number of its first, and the words), to be timed in its
    audio (a chunk read as several inputs shares its words out by their lengths)."""
    tokenized = []
    native = words and engine.capabilities.times_words
    for chunk, cut in zip(chunks, cuts, strict=True):
        inputs = engine.tokenize_words(chunk, voice) if native else [(tokens, None)
                                                                      for tokens in engine.tokenize(chunk, voice)]
        said = _said(text_words(chunk), [tokens.size for tokens, _ in inputs], first) if words and not native else None
        tokenized += [(tokens, None if word_ids is None else np.where(word_ids >= 0, word_ids + first, -1),
                       cut and index == 0, said[index] if said else None)
                      for index, (tokens, word_ids) in enumerate(inputs)]
        first += len(text_words(chunk)) if words else 0
    return tokenized


def _said(chunk_words: list[str], lengths: list[int], first: int) -> list[tuple[int, tuple[str, ...]]]:
    """The words each of a chunk's inputs says: all of them where it is one; else shared out by the inputs'
    lengths, in order."""
    if len(lengths) == 1:
        return [(first, tuple(chunk_words))]
    owners = share_out(lengths, len(chunk_words)) if len(chunk_words) >= len(lengths) else np.arange(len(chunk_words))
    return [(first + int(np.searchsorted(owners, index)),
             tuple(word for word, owner in zip(chunk_words, owners, strict=True) if owner == index))
            for index in range(len(lengths))]


async def output_of(item: QueuedItem, run_allowance_s: float) -> EngineOutput:
    """The item's output. The engine loop ends every item it is given; this bound (its deadline, plus the
    longest it may take to run) is what keeps a caller from waiting for ever if something is wrong."""
    return await _bounded(item, item.future, run_allowance_s)


async def pieces_of(item: QueuedItem, run_allowance_s: float) -> AsyncIterator[EngineOutput]:
    """The item's output as the engine hands it out: audio piece by piece from a stepped engine, else whole."""
    if item.pieces is None:
        yield await output_of(item, run_allowance_s)
        return
    link = item.pieces.head
    while True:
        audio, link = await _bounded(item, link, run_allowance_s)
        if audio is None:
            return
        yield EngineOutput(audio)


async def _bounded(item: QueuedItem, future, run_allowance_s: float):
    patience = max(0.0, item.deadline - time.monotonic()) + run_allowance_s
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), patience)
    except TimeoutError:
        item.abandon()
        raise DeadlineExceeded(f"request timed out: no audio within {patience:.0f} s") from None


def _set_due_times(items: list[QueuedItem], loop: EngineLoop, speed: float, played_s: float) -> float:
    """Each piece of a stream is needed once the ones before it have played (estimated low): returns the
    audio the stream has once these have played."""
    for item in items:
        played_s += item.pause_s
        item.due_s = STREAM_DUE_MARGIN * played_s
        item.deadline += item.due_s
        played_s += item.length * loop.audio_s_per_token / speed
    return played_s
