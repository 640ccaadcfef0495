"""The engine contract, for every engine kind the registry loads (Piper, tiny VITS, tiny Pocket TTS, tiny VibeVoice):
its spec is read without loading any weights, the engine that loads is the one described (voices and capabilities),
and what its capabilities declare holds (word timings, cloning, frames, the most it runs at once)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.random_vits import TINY, save_random_vits
from tests.pocket_models import build_tiny_pocket, registry_spec
from tests.vibevoice_models import build_tiny_vibevoice
from tts_core.engines import ModelSpec
from tts_core.engines.base import CLONE_HOOKS, SteppedEngine, capabilities_of
from tts_core.engines.piper import bundled_voice_path
from tts_core.text import words

KINDS = {  # engine kind -> (how to make a model in a folder, its registry voices)
    "piper": (lambda folder: bundled_voice_path(), {"joe": {}}),
    "vits": (lambda folder: save_random_vits(folder / "tiny-vits", **TINY), {"tiny": {"language": "en"}}),
    "pocket_tts": (build_tiny_pocket, {"tiny": {"fixed_length": True, "max_running": 3}}),
    "vibevoice": (build_tiny_vibevoice, {"tiny": {"fixed_length": True}}),
}


@pytest.fixture(scope="module", params=list(KINDS))
def described(request, tmp_path_factory) -> ModelSpec:
    folder = tmp_path_factory.mktemp(request.param)
    make, voices = KINDS[request.param]
    return registry_spec(make(folder), voices, folder, engine=request.param)


@pytest.fixture(scope="module")
def loaded(described):
    return described.load()


def test_the_spec_describes_what_loads(described, loaded):
    assert loaded.voices() == described.voices
    assert capabilities_of(loaded) == described.capabilities


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
    assert capabilities.clones == all(callable(getattr(loaded, hook, None)) for hook in CLONE_HOOKS)
    assert capabilities.makes_frames == isinstance(loaded, SteppedEngine)
    assert capabilities.max_running == (loaded.max_running if isinstance(loaded, SteppedEngine) else None)
    if capabilities.clones:
        clip = np.sin(np.linspace(0, 2000, 3 * loaded.sample_rate)).astype(np.float32) * 0.3
        assert np.asarray(loaded.voice_prompt_from_audio(clip, loaded.sample_rate)).size
