"""VibeVoice's pieces beside the backbone: the noise scheduler of its diffusion head, the streaming caches
of its acoustic decoder and semantic encoder kept per running request, and voice prompts from audio.

The scheduler is diffusers' `DPMSolverMultistepScheduler` as VibeVoice configures it (DPM-Solver++ of
order 2, midpoint, v-prediction, the cosine "squaredcos_cap_v2" betas, linspace timesteps, a final sigma
of zero), written out here (about 40 lines) so that the engine, and a bare GPU machine, need no
diffusers; tests/unit/test_vibevoice_engine.py checks it against diffusers where diffusers is installed.
It has the interface `generate(noise_scheduler=...)` takes: set_timesteps, timesteps, step.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import torch
from transformers.models.vibevoice_acoustic_tokenizer.modeling_vibevoice_acoustic_tokenizer import (
    VibeVoiceAcousticTokenizerConv1dPaddingCache,
)

from .pocket_codec import resample

# What the scheduler supports of a model's `noise_scheduler_config` (the values VibeVoice's generate uses);
# keys not named here do not change these settings.
SCHEDULER_SETTINGS = {"beta_schedule": ("squaredcos_cap_v2", "cosine"), "prediction_type": ("v_prediction",),
                      "algorithm_type": ("dpmsolver++",), "solver_order": (2,), "solver_type": ("midpoint",),
                      "final_sigmas_type": ("zero",), "timestep_spacing": ("linspace",)}


class DPMSolver:
    """DPM-Solver++(2M) for a v-prediction model: the first and the last step are first order, the others
    second order from the previous step's data prediction. Every row is independent of the others."""

    def __init__(self, num_train_timesteps: int = 1000):
        def alpha_bar(t: float) -> float:
            return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

        steps = num_train_timesteps
        betas = torch.tensor([min(1 - alpha_bar((i + 1) / steps) / alpha_bar(i / steps), 0.999) for i in range(steps)],
                             dtype=torch.float32)
        self.alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
        self.num_train_timesteps = steps
        self.set_timesteps(10)

    @staticmethod
    def from_config(config: dict | None) -> DPMSolver:
        """The scheduler a model's generation config names; ValueError for settings it does not support."""
        config = dict(config or {})
        for key, supported in SCHEDULER_SETTINGS.items():
            if key in config and config[key] not in supported:
                raise ValueError(f"noise scheduler {key}={config[key]!r} is not supported (only {supported})")
        return DPMSolver(int(config.get("num_train_timesteps", 1000)))

    def set_timesteps(self, num_inference_steps: int, device: str | torch.device | None = None) -> None:
        steps = np.linspace(0, self.num_train_timesteps - 1, num_inference_steps + 1).round()[::-1][:-1]
        steps = steps.copy().astype(np.int64)
        sigmas = np.array(((1 - self.alphas_cumprod) / self.alphas_cumprod) ** 0.5)
        sigmas = np.concatenate([np.interp(steps, np.arange(len(sigmas)), sigmas), [0.0]]).astype(np.float32)
        self.sigmas = torch.from_numpy(sigmas)  # on the CPU: 0-dim factors mix with any device's tensors
        self.timesteps = torch.from_numpy(steps).to(device=device)
        self._index, self._previous = 0, None

    def _alpha_sigma(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """alpha_t, sigma_t and lambda_t at step `index`."""
        sigma = self.sigmas[index]
        alpha = 1 / ((sigma**2 + 1) ** 0.5)
        sigma = sigma * alpha
        return alpha, sigma, torch.log(alpha) - torch.log(sigma)

    def step(self, model_output: torch.Tensor, timestep, sample: torch.Tensor) -> SimpleNamespace:
        index = self._index
        alpha_s, sigma_s, lambda_s = self._alpha_sigma(index)
        data = alpha_s * sample - sigma_s * model_output  # the data prediction, from the velocity
        sample = sample.to(torch.float32)
        if index == len(self.timesteps) - 1:  # to sigma 0: the first-order step lands on the prediction
            previous = data.to(torch.float32)
        else:
            alpha_t, sigma_t, lambda_t = self._alpha_sigma(index + 1)
            h = lambda_t - lambda_s
            previous = (sigma_t / sigma_s) * sample - (alpha_t * (torch.exp(-h) - 1.0)) * data
            if self._previous is not None:  # second order: the midpoint correction
                _, _, lambda_r = self._alpha_sigma(index - 1)
                slope = (1.0 / ((lambda_s - lambda_r) / h)) * (data - self._previous)
                previous = previous - 0.5 * (alpha_t * (torch.exp(-h) - 1.0)) * slope
        self._index, self._previous = index + 1, data
        return SimpleNamespace(prev_sample=previous.to(model_output.dtype))


class StreamCaches:
    """The acoustic decoder's and the semantic encoder's streaming caches (transformers' padding caches,
    which keep each causal convolution's last inputs), one row per running request in the engine's row
    order: a joiner's rows go after the others, a leaver's row takes the last one. Every step decodes
    all rows at once, so each request's audio is one seamless stream."""

    def __init__(self) -> None:
        self.decoder = VibeVoiceAcousticTokenizerConv1dPaddingCache()
        self.encoder = VibeVoiceAcousticTokenizerConv1dPaddingCache()

    def _layers(self):
        return [*self.decoder.layers.values(), *self.encoder.layers.values()]

    def extend(self, joiners: StreamCaches) -> None:
        """Append the joiners' rows (a cache of theirs alone, used once already)."""
        for mine, theirs in ((self.decoder, joiners.decoder), (self.encoder, joiners.encoder)):
            for key, layer in theirs.layers.items():
                if key in mine.layers:
                    mine.layers[key].cache = torch.cat([mine.layers[key].cache, layer.cache])
                else:
                    mine.layers[key] = layer

    def remove(self, row: int) -> None:
        for layer in self._layers():
            last = layer.cache.shape[0] - 1
            if row != last:
                layer.cache[row] = layer.cache[last]
            layer.cache = layer.cache[:last]


@torch.inference_mode()
def encode_voice(model, feature_extractor, audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """A voice clip -> its voice prompt: the acoustic encoder's latents (frames, latent_dim) as float32,
    one frame per hop of the clip, as `get_audio_features` makes them before scaling, without the
    σ-VAE's sampling noise (so a clone is deterministic)."""
    audio = resample(audio, sample_rate, feature_extractor.sampling_rate)
    if not audio.size:
        raise ValueError("the voice clip is empty")
    features = feature_extractor(audio, sampling_rate=feature_extractor.sampling_rate)
    tower = model.model.audio_tower
    latents = tower.encode(features["input_values"].to(tower.device, tower.dtype), sample=False).latents[0]
    frames = math.ceil(audio.size / model.config.audio_config.hop_length)
    return latents[:frames].float().contiguous().cpu().numpy()
