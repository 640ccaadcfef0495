"""The engine contract: the records an engine reads and returns, what a model declares it can do, and a protocol per
shape, which the scheduler's strategies program against.

`EngineInput` is what an engine reads of one piece of text (its input ids, voice and speed) and `EngineOutput` what it
returns (the audio, and the samples each token spans where it times words). A stepped engine also hands its audio out
piece by piece as frames are made, on an `AudioPieces` (a chain of futures, safe to fill from the engine's thread and to
read from the event loop). Engines never see what the queue orders (tts_core.scheduler's records).

The shapes (shared/DESIGN.md): a one-shot engine synthesizes a whole batch per call (Piper, VITS, Kokoro); a stepped
engine keeps requests running across calls, one frame per step (Pocket TTS, VibeVoice); an upstream engine is a server
that batches on its own, and takes requests in flight. A model declares its shape in its `Capabilities`, and its
engine loop holds the strategy for that shape (tts_core.scheduler.strategies).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..errors import SynthesisError

if TYPE_CHECKING:
    import httpx

_input_ids = itertools.count()
CAST_SEPARATOR = "\x1f"  # between a cast's voice names (VibeVoice's): no voice name has a control character


@dataclass(frozen=True, eq=False)
class EngineInput:
    """What an engine reads of one piece: its model input ids, voice (or a conversation's cast of voices, joined
    by CAST_SEPARATOR) and speaking rate. A stepped engine keeps a running input's state under its `id`."""

    tokens: np.ndarray  # int64 model input ids
    voice: str
    speed: float = 1.0
    instructions: str | None = None  # how to speak, for a model that takes them
    id: int = field(default_factory=lambda: next(_input_ids))

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def voices(self) -> list[str]:
        """The voices it speaks in: its voice, or each of its cast."""
        return self.voice.split(CAST_SEPARATOR)


@dataclass(frozen=True, eq=False)
class EngineOutput:
    """What an engine returns for one input: float32 mono audio in [-1, 1], and (an engine that times words)
    the audio samples each token spans, summing to the audio's length."""

    audio: np.ndarray
    token_samples: np.ndarray | None = None


class AudioPieces:
    """Audio pieces of one item in order, as the engine makes them: `head` resolves to (piece, next
    future), and (None, None) after the last. Written by the engine's thread only."""

    def __init__(self) -> None:
        self.head: Future = Future()
        self._tail = self.head

    def push(self, audio: np.ndarray) -> None:
        """The next piece; a piece that is not audio (audio_fault) ends the pieces with its error instead."""
        if (fault := audio_fault(audio)) is not None:
            self.end(UnsoundAudio(fault))
            return
        following: Future = Future()
        try:
            self._tail.set_result((audio, following))
        except InvalidStateError:  # the reader gave up waiting (cancelled): no one reads on
            return
        self._tail = following

    def end(self, error: BaseException | None = None) -> None:
        if self._tail.done():  # already ended
            return
        if error is None:
            self._tail.set_result((None, None))
        else:
            self._tail.set_exception(error)


# Louder than this (in full scale, 1.0) is not a voice but a broken model or answer: NaN scales, +1e30 (24 dB over
# full scale: a voice peaking past 1.0 is clipped as it is encoded; one at 16 is no voice)
MOST_AMPLITUDE = 16.0


def audio_fault(audio: np.ndarray) -> str | None:
    """What makes an engine's audio unfit to send or cache (None: nothing): a sample that is not finite, or far
    out of range. The one check every engine shape's audio passes (QueuedItem.resolve, AudioPieces.push)."""
    if not audio.size:
        return None
    peak = float(np.max(np.abs(audio)))
    if not np.isfinite(peak):
        return f"{int(np.count_nonzero(~np.isfinite(audio)))} of its {audio.size} samples are not finite"
    if peak > MOST_AMPLITUDE:
        return f"its samples reach {peak:.3g}, past any voice's (full scale is 1)"
    return None


class UnsoundAudio(SynthesisError):
    """An engine made audio that is not audio (audio_fault): a 500 synthesis_failed to retry, never played."""

    def __init__(self, fault: str, model: str = ""):
        where = f" in model {model}" if model else ""
        super().__init__(f"synthesis failed{where}: the audio made is not playable ({fault}); retry, or report it "
                         "if it repeats")


class Shape(Enum):
    """How an engine is driven: which strategy its loop holds."""

    ONE_SHOT = "one-shot"  # a batch in, its audio out
    STEPPED = "stepped"  # requests join and leave between steps, one frame each a step
    UPSTREAM = "upstream"  # another server batches: requests in flight there


@dataclass(frozen=True)
class FrontEnd:
    """What of Chorus's text front end runs before a model reads the text: all of it, unless the model (an upstream
    that reads text its own way) says otherwise."""

    normalize: bool = True  # markdown, numbers, symbols said as words (off: the text as written)
    lexicon: bool = True  # the operator's pronunciations
    ssml: bool = True  # SSML read by Chorus (off: an SSML input goes as it is)


@dataclass(frozen=True)
class Capabilities:
    """What a model can do, declared once by its engine (its kind's) and on its ModelSpec with its voices, before it
    loads: admission, the UI, the catalogue and cloning read it, and nothing waits for a load to find out. The engine
    contract tests check that each loaded engine does what it declares."""

    shape: Shape = Shape.ONE_SHOT
    times_words: bool = False  # word timestamps: tokenize_words and token_samples
    clones: bool = False  # voices from a caller's clip: voice_prompt_from_audio, add_voice, remove_voice
    max_running: int | None = None  # the most requests it runs at once (a stepped engine's cache rows, in flight)
    front_end: FrontEnd = FrontEnd()  # what of Chorus's front end runs for it
    mixes_voices: bool = False  # a mix of its voices is a voice: "a+b", "a(2)+b(1)" (voice_mix)

    @property
    def makes_frames(self) -> bool:
        """Its audio comes a few frames at a time (stepped, or an upstream's as it streams): a stream's first audio
        comes soon whatever its first chunk's length (a one-shot engine's once the whole chunk is made)."""
        return self.shape is not Shape.ONE_SHOT


CLONE_HOOKS = ("voice_prompt_from_audio", "add_voice", "remove_voice")  # what an engine that clones implements


class Loaded(Protocol):
    """What every engine a strategy drives answers, whatever its shape (tts_core.engines.base.Engine documents each
    call)."""

    name: str
    sample_rate: int
    capabilities: Capabilities
    out_of_memory_errors: tuple[type[BaseException], ...]

    def voices(self) -> list: ...
    def tokenize(self, text: str, voice: str) -> list[np.ndarray]: ...
    def batch_key(self, voice: str, speed: float) -> Hashable: ...
    def instance_counts(self) -> tuple[int, ...]: ...
    def use_instances(self, count: int) -> None: ...
    @property
    def instances(self) -> int: ...
    def release_memory(self) -> None: ...


class OneShot(Loaded, Protocol):
    """A batch in, its audio out (tts_core.engines.base.OneShotEngine documents each call)."""

    def synthesize(self, batch: Sequence[EngineInput]) -> list[EngineOutput]: ...
    @property
    def pipelines(self) -> bool: ...
    def prepare(self, batch: Sequence[EngineInput]) -> Any: ...
    def run(self, prepared: Any) -> Any: ...
    def finish(self, running: Any) -> list[EngineOutput]: ...
    def measure_memory(self, tokens: np.ndarray) -> None: ...


WholeBatch = Callable[[Sequence[EngineInput]], list[EngineOutput]]  # a whole batch run to its last member's audio


class Stepped(Loaded, Protocol):
    """Requests running across calls: `admit` (prefill), `step` (one frame each), `take_frames` and `decode` (audio
    as it is made), `release` (tts_core.engines.base.SteppedEngine documents each call). It has no whole-batch call of
    its own: the stepped strategy runs a whole batch through these (tts_core.scheduler.stepped.synthesize_whole), for
    the warm-up and the peers that run by request, and hands that run to `measure_memory`."""

    frame_rate: float
    max_running: int
    kv_bytes_per_token: float
    decodes_apart: bool
    device: str

    def frames_needed(self, item: EngineInput) -> int: ...
    def context_tokens(self, item: EngineInput) -> int: ...
    def admit(self, items: Sequence[EngineInput]) -> list[int]: ...
    def step(self) -> list[int]: ...
    def running(self) -> list[int]: ...
    def context_length(self, item_id: int) -> int: ...
    def take_frames(self, item_id: int, final: bool = False) -> Any: ...
    def decode(self, frames: Any) -> np.ndarray: ...
    def take_audio(self, item_id: int, final: bool = False) -> np.ndarray: ...
    def release(self, item_id: int) -> None: ...
    def measure_memory(self, tokens: np.ndarray, run: WholeBatch) -> None: ...


class Upstream(Protocol):
    """A model another server runs: each request goes there and its audio comes back as it is made, on the
    strategy's I/O thread (tts_core.engines.upstream.UpstreamEngine documents each call)."""

    name: str
    sample_rate: int
    capabilities: Capabilities
    options: Any  # its UpstreamOptions: url, timeout_s, max_in_flight

    def voices(self) -> list: ...
    def tokenize(self, text: str, voice: str) -> list[np.ndarray]: ...
    def client(self) -> httpx.AsyncClient: ...
    def audio(self, client: httpx.AsyncClient, item: EngineInput) -> AsyncIterator[np.ndarray]: ...
    async def whole(self, client: httpx.AsyncClient, item: EngineInput) -> EngineOutput: ...
