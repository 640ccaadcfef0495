"""The transformers VITS engine, on a tiny random model the test saves and loads back through
the same from_pretrained path the server uses."""


import numpy as np
import pytest

from bench.random_vits import TINY, save_random_vits
from tts_core.engines.base import EngineUnavailable, VoiceSpec
from tts_core.engines.contract import EngineInput
from tts_core.engines.vits import VitsEngine

TEXTS = ["hello there.", "a much longer sentence with many words in it, to pad the others.", "hi"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_vits(tmp_path_factory.mktemp("vits") / "tiny-vits", **TINY)


@pytest.fixture(scope="module")
def engine(model_dir):
    return VitsEngine(str(model_dir), [VoiceSpec("tiny", "en"), VoiceSpec("tiny-fast", "en", speed=1.5)],
                      device="cpu", noise_scale=0.0, noise_scale_duration=0.0)


def items(engine, texts, speed=1.0, voice="tiny"):
    return [EngineInput(engine.tokenize(text, voice)[0], voice, speed) for text in texts]


def test_loads_from_a_folder_with_voices_language_and_rate(engine):
    assert engine.sample_rate == 16000 and engine.name == "tiny-vits"
    assert [(voice.name, voice.model, voice.language, voice.speed) for voice in engine.voices()] == [
        ("tiny", "vits", "en", 1.0), ("tiny-fast", "vits", "en", 1.5)]


def test_batched_items_equal_the_same_items_alone(engine):
    batch = items(engine, TEXTS)
    together = [output.audio for output in engine.synthesize(batch)]
    alone = [engine.synthesize([item])[0].audio for item in batch]
    assert len({audio.size for audio in together}) == 3  # each trimmed to its own length
    for batched, single in zip(together, alone):
        assert batched.dtype == np.float32 and batched.size == single.size
        assert np.abs(batched - single).max() < 1e-4
        assert np.abs(batched).max() <= 1.0


def test_speed_is_part_of_the_batch_key_and_shortens_the_audio(engine):
    slow, fast = items(engine, TEXTS[:1]), items(engine, TEXTS[:1], speed=2.0)
    assert engine.batch_key("tiny", 1.0) != engine.batch_key("tiny", 2.0)
    assert engine.synthesize(fast)[0].audio.size < engine.synthesize(slow)[0].audio.size


def test_cpu_has_no_lower_precision_and_no_device_memory(engine):
    assert engine.set_low_precision(True) is False
    assert engine.free_memory_bytes() is None and engine.bytes_per_padded_token is None


def test_a_model_that_is_not_there_gives_a_clear_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EngineUnavailable) as raised:
        VitsEngine("facebook/mms-tts-xyz", [VoiceSpec("x")], device="cpu")
    assert "facebook/mms-tts-xyz" in str(raised.value) and "HF_HUB_OFFLINE" in str(raised.value)
    with pytest.raises(EngineUnavailable, match="needs CUDA"):
        VitsEngine(str(tmp_path), [VoiceSpec("x")], device="cpu", dtype="fp16")
