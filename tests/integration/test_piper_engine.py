"""The real bundled voice through the engine alone: batched output equals solo output."""

import math

import numpy as np
import pytest

from tts_core.engines.piper import PiperEngine, bundled_voice_path, load_piper_engines
from tts_core.request import SynthesisRequest

TEXTS = ["Hi.", "This sentence is quite a bit longer than the first one.", "A middle one, here."]


@pytest.fixture(scope="module")
def engine():
    return PiperEngine(bundled_voice_path(), noise_scale=0.0, noise_w=0.0)


def items(engine, texts, speed=1.0):
    return [SynthesisRequest(tokens=engine.tokenize(text, engine.name)[0], voice=engine.name, speed=speed,
                             key=engine.batch_key(engine.name, speed), deadline=math.inf) for text in texts]


def test_batched_items_equal_solo_items_and_have_no_padded_tail(engine):
    batch = items(engine, TEXTS)
    together = engine.synthesize(batch)
    for item, audio in zip(batch, together):
        alone = engine.synthesize([item])[0]
        assert audio.shape == alone.shape  # trimmed to its own length: no padded tail
        assert np.max(np.abs(audio - alone)) < 2e-3
    assert together[0].size < together[2].size < together[1].size
    # The short item's end is as quiet as it is alone, not decoder noise from padding.
    tail = int(0.02 * engine.sample_rate)
    assert np.sqrt(np.mean(together[0][-tail:] ** 2)) < 0.05


def test_output_is_peak_normalised_float32(engine):
    audio = engine.synthesize(items(engine, ["Normalised audio."]))[0]
    assert audio.dtype == np.float32 and np.max(np.abs(audio)) == pytest.approx(1.0)


def test_speed_is_part_of_the_batch_key(engine):
    assert engine.batch_key(engine.name, 1.0) != engine.batch_key(engine.name, 1.5)
    with pytest.raises(ValueError):
        engine.synthesize(items(engine, TEXTS[:1]) + items(engine, TEXTS[1:2], speed=1.5))


def test_voices_folder_adds_voices_and_skips_broken_ones(tmp_path, caplog):
    source = bundled_voice_path()
    (tmp_path / "en_US-copy-medium.onnx").symlink_to(source)
    (tmp_path / "en_US-copy-medium.onnx.json").write_bytes(source.with_name(source.name + ".json").read_bytes())
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    (tmp_path / "broken.onnx.json").write_text("{}")
    (tmp_path / "lonely.onnx").write_bytes(b"no json beside me")
    names = [engine.name for engine in load_piper_engines(tmp_path)]
    assert names == ["en_US-joe-medium", "en_US-copy-medium"]
    assert "broken" in caplog.text
