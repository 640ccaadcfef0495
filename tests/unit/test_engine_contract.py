"""The engine contract, for every engine kind the registry loads (Piper, tiny VITS, tiny Pocket TTS, tiny VibeVoice,
tiny Kokoro, an upstream played by a plain listener on loopback), one parameter each (EXAMPLES: a new kind is its
module in tts_core/engines/kinds and its example here, and nothing else):
its spec is read without loading any weights, the engine that loads is the one described (voices and capabilities),
what its capabilities declare holds (word timings, cloning, frames, the most it runs at once), and a stream served
through its engine loop joins into the same audio as the whole file."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from bench.random_kokoro import save_random_kokoro
from bench.random_vits import TINY, save_random_vits
from tests.listener import Listener
from tests.pocket_models import build_tiny_pocket, registry_spec
from tests.vibevoice_models import build_tiny_vibevoice
from tts_core.engines import ModelSpec
from tts_core.engines.contract import CLONE_HOOKS, AudioPieces, EngineInput
from tts_core.engines.kinds import KINDS
from tts_core.engines.piper import bundled_voice_path
from tts_core.ops.metrics import Metrics
from tts_core.request.dispatch import pieces_of
from tts_core.scheduler.queue import RequestQueue
from tts_core.scheduler.records import QueuedItem
from tts_core.scheduler.strategies import make_engine_loop
from tts_core.text.chunks import words

_listeners: list[Listener] = []


def upstream_voices() -> dict:
    """An upstream voice on a listener started for the module (its url is known once it listens)."""
    _listeners[:] = _listeners or [Listener()]
    return {"far": {"url": _listeners[0].url, "upstream_voice": "alloy"}}


@dataclass(frozen=True)
class Example:
    """A model of a kind for the contract: how to make one in a folder, its registry voices (or what makes them), and
    what it samples with (owner, attribute), set to 0 so that the same input makes the same audio."""

    make: Callable[[Path], object]
    voices: dict | Callable[[], dict]
    noise: Callable[[object], list] = lambda engine: []


EXAMPLES = {  # every registered engine kind, by name
    "piper": Example(lambda folder: bundled_voice_path(), {"joe": {}},
                     lambda engine: [(engine, "noise_scale"), (engine, "noise_w")]),
    "vits": Example(lambda folder: save_random_vits(folder / "tiny-vits", **TINY), {"tiny": {"language": "en"}},
                    lambda engine: [(engine.model, "noise_scale"), (engine.model, "noise_scale_duration")]),
    "pocket_tts": Example(build_tiny_pocket, {"tiny": {"fixed_length": True, "max_running": 3}},
                          lambda engine: [(engine, "temperature")]),
    "vibevoice": Example(build_tiny_vibevoice, {"tiny": {"fixed_length": True}},
                         lambda engine: [(engine, "temperature")]),
    # its vocoder's noise is seeded from each input
    "kokoro": Example(lambda folder: save_random_kokoro(folder / "tiny-kokoro", tiny=True), {"*": {}}),
    # the listener speaks the same tone every time
    "upstream": Example(lambda folder: "far-model", upstream_voices),
}


def test_every_registered_kind_has_its_example():
    assert sorted(EXAMPLES) == sorted(KINDS)


# tiny VibeVoice's loop takes a while to warm up, and tiny Kokoro's vocoder generates for tens of seconds on two
# cores: the full run holds them to the contract, the fast tier the others
SLOW_KINDS = {"vibevoice", "kokoro"}


@pytest.fixture(scope="module", params=[pytest.param(kind, marks=pytest.mark.slow) if kind in SLOW_KINDS else kind
                                        for kind in EXAMPLES])
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def described(kind, tmp_path_factory) -> ModelSpec:
    folder = tmp_path_factory.mktemp(kind)
    example = EXAMPLES[kind]
    voices = example.voices() if callable(example.voices) else example.voices
    return registry_spec(example.make(folder), voices, folder, engine=kind)


@pytest.fixture(scope="module")
def loaded(described):
    return described.load()


def test_the_spec_describes_what_loads(described, loaded):
    assert loaded.voices() == described.voices
    assert loaded.capabilities == described.capabilities


def test_word_timings_are_there_where_declared(described, loaded):
    voice = described.voices[0].name
    text = "Two words, then three more."
    if not described.capabilities.times_words:
        with pytest.raises(NotImplementedError):
            loaded.tokenize_words(text, voice)
        return
    inputs = loaded.tokenize_words(text, voice)
    assert [tokens.tolist() for tokens, _ in inputs] == [tokens.tolist() for tokens in loaded.tokenize(text, voice)]
    said = {int(index) for _, word_ids in inputs for index in word_ids if index >= 0}
    assert said == set(range(len(words(text))))


def test_cloning_frames_and_running_are_as_declared(described, loaded):
    capabilities = described.capabilities
    if capabilities.clones:
        assert all(callable(getattr(loaded, hook, None)) for hook in CLONE_HOOKS)
    assert capabilities.max_running == getattr(loaded, "max_running", None)
    if capabilities.clones:
        clip = np.sin(np.linspace(0, 2000, 3 * loaded.sample_rate)).astype(np.float32) * 0.3
        assert np.asarray(loaded.voice_prompt_from_audio(clip, loaded.sample_rate)).size


def test_a_streams_pieces_join_into_the_whole_file(kind, described, loaded, monkeypatch):
    """The same input through the engine's loop twice: as a stream (its pieces as they are made, where the engine makes
    frames) and as a whole file. Joined, the pieces are the file."""
    for owner, name in EXAMPLES[kind].noise(loaded):
        monkeypatch.setattr(owner, name, 0.0)
    loop = make_engine_loop(loaded, RequestQueue(8), Metrics(), calibration_sizes=(1,))
    loop.start()
    try:
        assert loop.calibrated.wait(120)
        voice = described.voices[0].name
        tokens = loaded.tokenize("A sentence long enough to be spoken in several pieces of audio.", voice)[0]

        def queued(streamed: bool) -> QueuedItem:
            item = QueuedItem(EngineInput(tokens, voice), key=loaded.batch_key(voice, 1.0), deadline=math.inf)
            item.pieces = AudioPieces() if streamed and loop.hands_out_pieces else None  # as the scheduler sets it
            loop.submit([item])
            return item

        async def audio(item: QueuedItem) -> list[np.ndarray]:
            return [output.audio async for output in pieces_of(item, run_allowance_s=120)]

        pieces = asyncio.run(audio(queued(streamed=True)))
        [whole] = asyncio.run(audio(queued(streamed=False)))
    finally:
        loop.stop()
    assert len(pieces) > 1 if described.capabilities.makes_frames else len(pieces) == 1
    joined = np.concatenate(pieces)
    assert joined.shape == whole.shape and np.abs(joined - whole).max() <= 1e-4 * max(1e-3, np.abs(whole).max())
