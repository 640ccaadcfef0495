"""What engines share: `Engine`, the calls of every shape with their defaults; `OneShotEngine`, the one-shot shape's
(a batch in, its audio out: Piper, VITS, Kokoro); and `SteppedEngine`, the stepped shape's (autoregressive: requests
stay running across calls, one frame per step: Pocket TTS, VibeVoice), whose whole batch the stepped strategy runs
(tts_core.scheduler.stepped.synthesize_whole); with the voice records and helpers every engine uses. The shapes'
protocols, what the strategies program against, are in tts_core.engines.contract. Only the engine's loop thread calls
them."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .contract import Capabilities, EngineInput, EngineOutput, FrontEnd, Shape, WholeBatch


class EngineUnavailable(RuntimeError):
    """A configured model cannot be loaded; the message names it and says why."""


# a plain voice name, as callers write it in requests and URLs: a cloned voice's (also its file's name: no
# separators), or one an upstream lists. Matched whole (fullmatch): with re.match, "$" also matches before a
# final newline, and "trail\n" became a voice that no request could name.
VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,47}")


MIX_PART = re.compile(r"\s*([^\s+()]+)\s*(?:\(\s*([0-9]*\.?[0-9]+)\s*\))?\s*")


MIX_WEIGHTS = (0.001, 1000.0)  # a weight is read to three decimals, within these


def voice_mix(name: str) -> list[tuple[str, float]] | None:
    """A mix of voices as Kokoro-FastAPI writes one: "af_bella+af_sky" (equal parts) or "af_bella(2)+af_sky(1)"
    (weighted): its voices and weights; None for a plain name. Raises ValueError naming a part that is not a
    voice with an optional weight from 0.001 to 1000."""
    if "+" not in name and "(" not in name:
        return None
    parts = []
    for part in name.split("+"):
        match = MIX_PART.fullmatch(part)
        weight = round(float(match[2] or 1), 3) if match else 0.0
        if not MIX_WEIGHTS[0] <= weight <= MIX_WEIGHTS[1]:
            raise ValueError(f"{part.strip()!r} is not a voice or a voice with a weight from {MIX_WEIGHTS[0]:g} to "
                             f"{MIX_WEIGHTS[1]:g}, as in af_bella(2)")
        parts.append((match[1], weight))
    return parts


def mix_name(parts: list[tuple[str, float]]) -> str:
    """A mix written one way, which voice_mix reads back as it is: "af_bella(2)+af_sky" for
    "af_bella (2.0) + af_sky(1)"."""
    return "+".join(name if weight == 1 else f"{name}({weight:g})" for name, weight in parts)


@dataclass(frozen=True)
class Voice:
    name: str  # what callers pass as `voice`
    model: str  # the model family serving it, what callers pass as `model` (e.g. "piper")
    language: str
    sample_rate: int
    speaker: str | None = None
    speed: float = 1.0  # this voice's default speed; a request's speed multiplies it
    speed_control: bool = True  # False: the model has no speaking-rate input (only speed 1.0 is accepted)
    gender: str | None = None  # "female" or "male" where the model's voice names say (Kokoro's)


@dataclass(frozen=True)
class UpstreamOptions:
    """How to reach an upstream model (an OpenAI-compatible speech server) and what it declares: model-level,
    any voice of the model may set them (tts_core.voices.registry)."""

    url: str  # its base URL: requests go to {url}/v1/audio/speech
    api_key_env: str | None = None  # the variable holding its API key (sent as a Bearer token), never the key
    sample_rate: int = 24000  # its raw PCM's rate (raw PCM carries none): 24000 for most, 44100 for Fish S2 Pro
    timeout_s: float = 60.0  # the longest wait for its next bytes
    extra_body: str = "{}"  # JSON: fields sent with every request (vLLM-Omni's task_type, language, ...)
    max_in_flight: int = 16  # the most requests in flight at once (the learned number stays within it)
    max_cool_down_s: float = 60.0  # the longest its breaker stays open, and the longest Retry-After it can make
    language: str = "en"  # its voices' language where a voice names none
    clones: bool = False  # it clones per request (vLLM-Omni's ref_audio and ref_text): Chorus's cloned voices go there
    instructions: bool = False  # it takes a request's `instructions` (how to speak): they are passed on
    front_end: FrontEnd = FrontEnd()  # what of Chorus's front end runs before the text is sent


@dataclass(frozen=True)
class VoiceSpec:
    """A voice the registry names on a model: language, speaker id, default speed, voice prompt; and
    the model-level options any of its voices sets."""

    name: str
    language: str | None = None  # None: the model's own
    speaker: int | None = None  # None: the model's default speaker
    speed: float = 1.0
    prompt: str | None = None  # a voice-prompted model's prompt file (relative: to the model folder)
    fixed_length: bool = False  # model-level: every request makes its whole frame budget (random weights)
    max_running: int | None = None  # model-level: the most requests a stepped model runs at once
    step_mode: str | None = None  # model-level: a stepped model's step, auto, eager or compiled (None: auto)
    upstream_voice: str | None = None  # an upstream's: the voice's name there (None: the same name)
    upstream: UpstreamOptions | None = None  # model-level: an upstream model's connection


DEFAULT_MAX_RUNNING = 16  # a stepped model's cache rows, unless its registry entries say otherwise


class Engine(ABC):
    """One loaded model, whatever its shape. Only its engine loop's thread calls the methods that touch the model;
    `tokenize` and `tokenize_words` run on the scheduler's text reader (one call at a time, beside the engine's
    thread), so they read only what loading set."""

    name: str  # unique per loaded model, used in metrics and batch keys
    sample_rate: int
    out_of_memory_errors: tuple[type[BaseException], ...] = (MemoryError,)  # what its model's calls raise when full
    bytes_per_padded_token: float | None = None  # device memory a batch needs per padded token, if measured
    capabilities: Capabilities = Capabilities()  # what it can do, written once (its kind's spec reads the same)
    lower_precision_parts: tuple[str, ...] = ()  # the parts of its model set_low_precision lowers (the rest stays)

    @abstractmethod
    def voices(self) -> list[Voice]: ...

    @abstractmethod
    def tokenize(self, text: str, voice: str) -> list[np.ndarray]:
        """Model input ids for text: one array per sentence the model's front end finds."""

    def tokenize_words(self, text: str, voice: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """tokenize's arrays, each with the word each of its tokens speaks: an int64 array as long as
        the ids, holding the index of a word in tts_core.text.chunks.words(text) (white-space separated; a
        pronunciation's marked span is one word), or -1 for tokens that speak no word (padding,
        sentence start/end, pauses). Indices run on across the arrays of one text. Only engines with
        times_words implement it."""
        raise NotImplementedError

    def batch_key(self, voice: str, speed: float) -> Hashable:
        """Items with equal keys can share one model call."""
        return (self.name, speed)

    def set_low_precision(self, enabled: bool) -> bool:
        """Switch to (or back from) a lower precision (degrade mode's action), from the next batch on; False where the
        engine has none to offer. Only the parts in lower_precision_parts run lower. A batch that raises (or makes
        audio that is not finite) at the lower precision is run again at full, and the model stays there."""
        return False

    def instance_counts(self) -> tuple[int, ...]:
        """How many copies of its model it could run at once, each with its share of the cores
        (tts_core.engines.instances): (1,) where it runs one."""
        return (1,)

    def use_instances(self, count: int) -> None:
        """Run `count` copies of its model from now on (one of instance_counts), made or dropped here. Called on the
        engine's thread, between batches."""
        if count != 1:
            raise ValueError(f"{self.name} runs one copy of its model")

    @property
    def instances(self) -> int:
        """Copies of its model it runs now."""
        return 1

    # Device memory: engines on a device with memory to manage override these.

    def free_memory_bytes(self) -> int | None:
        """Device memory this engine could still use; None where it has none to manage."""
        return None

    def release_memory(self) -> None:
        """Hand cached, unused memory back (device caches, allocator arenas). Called on the engine's
        thread, between batches."""

    def memory_bytes(self) -> int:
        """What the loaded model holds (weights), for the budget of loaded models."""
        return 0


class OneShotEngine(Engine):
    """A batch in, its audio out, in one call (`synthesize`)."""

    @abstractmethod
    def synthesize(self, batch: Sequence[EngineInput]) -> list[EngineOutput]:
        """One output per input: its audio trimmed to its own length (and, where the engine times words, the
        samples each of its tokens spans)."""

    # A one-shot engine whose device runs a batch while the host goes on (CUDA) can split `synthesize` in three, so
    # that its loop prepares and starts the next batch before it waits for this one, and trims and delivers this
    # one while the device runs the next (tts_core.scheduler.one_shot). finish(run(prepare(batch))) is
    # synthesize(batch); only the engine's thread calls them, one batch in flight behind the one being prepared.

    @property
    def pipelines(self) -> bool:
        """The loop runs batches back to back through prepare, run and finish (else through synthesize)."""
        return False

    def prepare(self, batch: Sequence[EngineInput]) -> Any:
        """The batch's model inputs made ready (padded, pinned, copies to the device started): called while
        the device still runs the batch before."""
        return batch

    def run(self, prepared: Any) -> Any:
        """Start the prepared batch on the device, behind the one before (without waiting for it to end)."""
        return self.synthesize(prepared)

    def finish(self, running: Any) -> list[EngineOutput]:
        """Wait for a batch `run` started, and hand its outputs as synthesize does."""
        return running

    def measure_memory(self, tokens: np.ndarray) -> None:
        """At warm-up: measure bytes_per_padded_token with these input ids (engines on a device with memory to
        manage)."""


def peak_normalize(audio: np.ndarray) -> np.ndarray:
    """Scale to peak 1.0, as Piper does for each sentence it synthesizes (every engine does, so
    sentences of one text are equally loud)."""
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak < 1e-8:
        return np.zeros_like(audio, dtype=np.float32)
    return np.clip(audio / peak, -1.0, 1.0).astype(np.float32)


def word_spans(word_ids: np.ndarray, token_samples: np.ndarray) -> dict[int, tuple[int, int]]:
    """For each word index, (first sample, end sample) of its tokens in the item's audio."""
    ends = np.cumsum(token_samples)
    starts = ends - token_samples
    return {int(word): (int(starts[word_ids == word].min()), int(ends[word_ids == word].max()))
            for word in np.unique(word_ids[word_ids >= 0])}


# A request's new frames are decoded every so much audio: a stream's in short pieces, so it plays soon after
# its prefill (4 frames of Pocket TTS, 3 of VibeVoice); a whole file's in longer ones, which the codec decodes
# for less a frame. Not all at the end either: decoding each file whole when it finished served less audio a
# second than decoding it in FILE_PIECE_S pieces as it is made (docs/benchmarks-history.md).
STREAM_PIECE_S = 0.3
FILE_PIECE_S = 1.2


class SteppedEngine(Engine):
    """An autoregressive model. Inputs join the running set (`admit`: their prompts are prefilled
    and each makes its first frame), advance one frame per `step` together, hand out their frames as they
    are made (`take_frames`) to be decoded (`decode`: on a codec stage of its own where the engine
    `decodes_apart`), and leave when done or abandoned (`release`), so nobody waits for
    the longest member of a batch. The engine owns its cache and keeps each running input's state under
    the input's id; its engine loop's strategy decides who runs. A whole batch at once (warm-up, the engine
    ceiling, the request-level peers) runs through the same calls, driven by the stepped strategy's code
    (tts_core.scheduler.stepped.synthesize_whole).
    """

    # what the kind declares; its max_running is the engine's own (its cache rows, set as it is made)
    kind_capabilities: Capabilities = Capabilities(shape=Shape.STEPPED)
    frame_rate: float  # frames per second of audio
    max_running: int  # the most requests that can run at once (cache slots)
    kv_bytes_per_token: float = 0.0  # cache memory one context position of one request takes
    # Its decoding can be a stage of its own: a codec thread decodes beside the steps (Pocket TTS's codec costs
    # about as much per frame as a step; TTS_CODEC_STAGE). False where `decode` only hands out audio the steps made.
    decodes_apart: bool = False
    device: str = "cpu"  # where it runs ("cuda": a GPU)

    @property
    def capabilities(self) -> Capabilities:
        return replace(self.kind_capabilities, max_running=self.max_running)

    @abstractmethod
    def frames_needed(self, item: EngineInput) -> int:
        """The most frames the input will make (it may end sooner, at its end of speech)."""

    @abstractmethod
    def context_tokens(self, item: EngineInput) -> int:
        """Context positions the input holds once it has made all its frames (prompt + frames):
        what the memory budget counts."""

    @abstractmethod
    def admit(self, items: Sequence[EngineInput]) -> list[int]:
        """Prefill the inputs' prompts (as one batch) and make them running, each with its first
        frame; returns the ids of those already finished. Raises an out_of_memory_errors one when they do not fit."""

    @abstractmethod
    def step(self) -> list[int]:
        """Advance every running input one frame; returns the ids of those that finished with this frame."""

    @abstractmethod
    def running(self) -> list[int]:
        """The ids of the inputs running now, in the order they joined."""

    @abstractmethod
    def context_length(self, item_id: int) -> int:
        """Context positions a running input holds now (its step cost grows with the longest)."""

    @abstractmethod
    def take_frames(self, item_id: int, final: bool = False) -> Any:
        """The input's frames not taken yet, as `decode` turns them into audio; None when there is nothing
        new. `final`: its last piece (the decoder flushes what it holds)."""

    @abstractmethod
    def decode(self, frames: Any) -> np.ndarray:
        """Taken frames -> their audio, decoded as a stream (a request's pieces, decoded in the order they
        were taken, join seamlessly). Safe beside `step` and `release`: it reads only what `take_frames`
        gave it. With `decodes_apart`, it runs on a codec thread of its own, one piece at a time."""

    def take_audio(self, item_id: int, final: bool = False) -> np.ndarray:
        """The audio of the input's frames not taken yet; empty when there is nothing new."""
        frames = self.take_frames(item_id, final)
        return np.zeros(0, dtype=np.float32) if frames is None else self.decode(frames)

    @abstractmethod
    def release(self, item_id: int) -> None:
        """The input leaves the running set (finished or abandoned); its place is free at once."""

    def measure_memory(self, tokens: np.ndarray, run: WholeBatch) -> None:
        """At warm-up: measure bytes_per_padded_token with these input ids, running whole batches through `run`
        (the stepped strategy's synthesize_whole; engines on a device with memory to manage)."""
