"""Degrade mode's lower precision on the transformers VITS engine, on a tiny random model saved and loaded back as the
server loads one, in the dtypes a GPU runs (fp16, bf16) on the CPU: only the parts that may run lower do, and the
lowered engine's audio is finite, as long as at full precision, and close to it."""

import numpy as np
import pytest
import torch

from bench.random_vits import TINY, save_random_vits
from tts_core.engines.base import VoiceSpec
from tts_core.engines.contract import EngineInput
from tts_core.engines.vits import LOWER_PARTS, VitsEngine

TEXTS = ["hello there.", "a much longer sentence with many words in it, to pad the others.", "hi"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_vits(tmp_path_factory.mktemp("vits") / "tiny-vits", **TINY)


def engine_at(model_dir, low_dtype: str) -> VitsEngine:
    return VitsEngine(str(model_dir), [VoiceSpec("tiny", "en")], device="cpu", noise_scale=0.0,
                      noise_scale_duration=0.0, low_dtype=low_dtype)


def parts_dtypes(engine: VitsEngine) -> dict[str, set[torch.dtype]]:
    """Each top-level part's weight dtypes, the lowered parts by their own path."""
    model = engine.model
    lowered = {path: {p.dtype for p in model.get_submodule(path).parameters()} for path in LOWER_PARTS}
    kept = {name: {p.dtype for p in module.parameters()} for name, module in model.named_children()
            if name not in ("decoder",)}
    return {**kept, **lowered}


@pytest.mark.parametrize("low_dtype, torch_dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_the_lowered_parts_run_lower_and_the_audio_stays_close_finite_and_as_long(model_dir, low_dtype, torch_dtype):
    engine = engine_at(model_dir, low_dtype)
    batch = [EngineInput(engine.tokenize(text, "tiny")[0], "tiny") for text in TEXTS]
    full = engine.synthesize(batch)
    assert engine.set_low_precision(True)
    low = engine.synthesize(batch)
    dtypes = parts_dtypes(engine)
    assert dtypes["decoder"] == dtypes["text_encoder.encoder"] == {torch_dtype}
    # the duration predictor and the flows (and the text's embedding and projection) stay at fp32
    assert dtypes["duration_predictor"] == dtypes["flow"] == {torch.float32}
    assert engine.model.text_encoder.embed_tokens.weight.dtype == engine.model.text_encoder.project.weight.dtype \
        == torch.float32
    for at_full, lowered in zip(full, low):
        assert np.isfinite(lowered.audio).all() and lowered.audio.dtype == np.float32
        # durations at fp32: every token as long as at full precision, so the item's speech is too
        assert np.array_equal(lowered.token_samples, at_full.token_samples)
        assert lowered.audio.size == at_full.audio.size == int(at_full.token_samples.sum())
        error = np.linalg.norm(lowered.audio - at_full.audio) / np.linalg.norm(at_full.audio)
        assert error < 0.05, f"{low_dtype}: relative error {error:.4f}"
    assert engine.set_low_precision(False)
    again = engine.synthesize(batch)  # back at full: the very weights it had, not the lower ones widened
    assert all(np.array_equal(a.audio, b.audio) for a, b in zip(full, again))
    assert parts_dtypes(engine)["decoder"] == {torch.float32}


def test_a_cpu_offers_no_lower_precision_unless_asked(model_dir):
    engine = VitsEngine(str(model_dir), [VoiceSpec("tiny", "en")], device="cpu")
    assert engine.low_dtype is None and engine.set_low_precision(True) is False
    assert engine.lower_precision_parts == LOWER_PARTS


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_fp16_is_the_lower_precision_and_batches_pipeline(model_dir):
    engine = VitsEngine(str(model_dir), [VoiceSpec("tiny", "en")], device="cuda", noise_scale=0.0,
                        noise_scale_duration=0.0)
    assert engine.pipelines and engine.low_dtype == torch.float16
    batch = [EngineInput(engine.tokenize(text, "tiny")[0], "tiny") for text in TEXTS]
    full = engine.synthesize(batch)
    started = [engine.run(engine.prepare(batch[:2])), engine.run(engine.prepare(batch[2:]))]  # back to back
    landed = engine.finish(started[0]) + engine.finish(started[1])
    assert all(a.audio.size == b.audio.size and np.abs(a.audio - b.audio).max() < 1e-3 for a, b in zip(full, landed))
    assert engine.set_low_precision(True)
    for at_full, lowered in zip(full, engine.synthesize(batch)):
        assert np.isfinite(lowered.audio).all() and lowered.audio.size == at_full.audio.size
        assert np.linalg.norm(lowered.audio - at_full.audio) / np.linalg.norm(at_full.audio) < 0.05
