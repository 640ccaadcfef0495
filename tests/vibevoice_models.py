"""A tiny random VibeVoice for tests, and what transformers' own `generate` makes with it."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from bench.random_vibevoice import save_random_vibevoice
from tts_core.engines.contract import EngineInput
from tts_core.engines.vibevoice import SYSTEM_PROMPT
from tts_core.engines.vibevoice_parts import DPMSolver


def build_tiny_vibevoice(folder: Path) -> Path:
    return save_random_vibevoice(folder, size="tiny", seed=0)


class SpeakOn(LogitsProcessor):
    """generate's random-weight setting: always the audio placeholder (the budget ends generation)."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores):
        forced = torch.full_like(scores, float("-inf"))
        forced[:, self.token] = 0
        return forced


def script(processor, text: str) -> str:
    """VibeVoice's script for one speaker, one voice clip and one line (the original processor's format)."""
    bos, eos, placeholder = processor.audio_bos_token, processor.audio_eos_token, processor.audio_token
    return (f"{SYSTEM_PROMPT} Voice input:\n Speaker 0:{bos}{placeholder}{eos}\n Text input:\n"
            f" Speaker 0: {text}\n Speech output:\n{bos}")


def generate_alone(engine, item: EngineInput, text: str, clip: np.ndarray) -> np.ndarray:
    """What transformers' generate makes for this request alone, with the voice clip encoded by the model
    itself (no sampling noise), as audio. With the engine's temperature 0 the diffusion starts from zeros
    here too (generate draws its noise with torch.randn); the scheduler is the engine's, which the
    scheduler test checks against diffusers'."""
    processor, model = engine.processor, engine.model
    inputs = processor(text=[script(processor, text)], audio=[clip], sampling_rate=engine.sample_rate,
                       return_tensors="pt")
    speak_on = LogitsProcessorList([SpeakOn(model.config.audio_token_id)] if engine.fixed_length else [])
    zeros = mock.patch.object(torch, "randn", lambda *shape, **options: torch.zeros(*shape, **options))
    with torch.inference_mode(), zeros:
        [audio] = model.generate(**inputs, sample=False, noise_scheduler=DPMSolver(), logits_processor=speak_on,
                                 num_diffusion_steps=engine.num_diffusion_steps, guidance_scale=engine.guidance_scale,
                                 max_new_tokens=engine.frames_needed(item))
    return np.zeros(0, np.float32) if audio is None else audio.reshape(-1).float().numpy()
