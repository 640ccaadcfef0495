"""A VITS model with random weights, saved as a Hugging Face folder that `from_pretrained` loads.

Tests use a tiny one; bench/gpu_check uses one at MMS-TTS size (VitsConfig's defaults are the
MMS architecture). Weights are random, so the audio is noise of the right length: enough to
measure speed, memory and batching, nothing to listen to. No download is needed.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from transformers import VitsConfig, VitsModel, VitsTokenizer

CHARACTERS = list("_ abcdefghijklmnopqrstuvwxyz'-.,?!")  # "_" (id 0) is also the pad token

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, ffn_dim=64, flow_size=32,
            spectrogram_bins=33, upsample_initial_channel=32, upsample_rates=[8, 8, 4],
            upsample_kernel_sizes=[16, 16, 8], resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3]],
            prior_encoder_num_flows=2, prior_encoder_num_wavenet_layers=2, duration_predictor_filter_channels=32,
            duration_predictor_num_flows=2, sampling_rate=16000)


def save_random_vits(folder: Path, seed: int = 0, **config) -> Path:
    """Write tokenizer and model files to folder; config overrides VitsConfig (MMS size by default)."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        vocab_path = Path(scratch) / "vocab.json"
        vocab_path.write_text(json.dumps({char: index for index, char in enumerate(CHARACTERS)}))
        tokenizer = VitsTokenizer(str(vocab_path), pad_token="_", unk_token="_", add_blank=True, normalize=True,
                                  phonemize=False, language="eng")
        tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    model = VitsModel(VitsConfig(vocab_size=len(CHARACTERS), **config))
    model.save_pretrained(folder)
    return folder
