"""A VibeVoice with random weights, saved as a folder the registry loads (no download):

    python -m bench.random_model vibevoice DIR [--tiny] [--size 1.5b]

--size 1.5b (the default) is the released VibeVoice-1.5B's layout: a Qwen2.5-1.5B backbone (hidden 1536,
28 layers, 12 heads / 2 key-value heads, intermediate 8960, vocabulary 151,936, tied embeddings), the
acoustic tokenizer (64-dim latents, 3200 samples a frame: 7.5 frames/s at 24 kHz), the semantic encoder
(128-dim) and the diffusion head at VibeVoiceConfig's sizes: 2.7 B parameters in all. (VibeVoiceConfig()
alone is a 13.6 B model: its text config is Qwen2Config's defaults.) --tiny is 4 M parameters, for tests.

The tokenizer is made here: byte-level, with Qwen's four special tokens at ids 0..3 (end of text, and the
processor's audio BOS, audio EOS and audio placeholder) and the config's special ids pointing there; for
--tiny every byte is one token, for 1.5b a 16,000-id byte-level BPE trained on the installed transformers'
docstrings (about 20 s, once: kept in ~/.cache/chorus). The folder holds the model, the processor, and one
shipped voice, DIR/voices/default.safetensors: the acoustic latents of about 3 s of the bundled Piper
voice. Register such a model with `fixed_length: true` (random weights never end speech usefully).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    VibeVoiceAcousticTokenizerFeatureExtractor,
    VibeVoiceConfig,
    VibeVoiceForConditionalGeneration,
    VibeVoiceProcessor,
)
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from bench.random_model import cached_tokenizer, piper_speech, prose

SPECIALS = ["<|endoftext|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>"]  # ids 0..3
SPECIAL_IDS = dict(pad_token_id=0, eos_token_id=0, audio_bos_token_id=1, audio_eos_token_id=2, audio_token_id=3)
BPE_VOCABULARY = 16000
QWEN25_1_5B = dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, num_hidden_layers=28,
                   num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960,
                   max_position_embeddings=65536, rope_theta=1000000.0, tie_word_embeddings=True)
TINY_CODEC = dict(hidden_size=16, num_filters=4, depths=[1, 1, 1, 1, 1, 1, 1])
SIZES = {
    "1.5b": dict(text_config=QWEN25_1_5B),
    "tiny": dict(text_config=dict(model_type="qwen2", vocab_size=len(SPECIALS) + 256, hidden_size=64,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  intermediate_size=128, tie_word_embeddings=True),
                 diffusion_head_config=dict(num_hidden_layers=2, intermediate_size=96),
                 audio_config=TINY_CODEC, semantic_model_config=TINY_CODEC),
}
GENERATION = {"guidance_scale": 1.3, "num_diffusion_steps": 10}  # the original VibeVoice's demo settings


def _byte_level(core: Tokenizer) -> TokenizersBackend:
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIALS)
    if [core.token_to_id(token) for token in SPECIALS] != [0, 1, 2, 3]:
        raise RuntimeError("the special tokens did not land at ids 0..3")
    return TokenizersBackend(tokenizer_object=core, eos_token=SPECIALS[0], pad_token=SPECIALS[0], padding_side="left")


def tokenizer(size: str) -> TokenizersBackend:
    if size == "tiny":  # every byte one token: instant to build, any text in
        vocab = {token: index for index, token in enumerate(SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet()))}
        return _byte_level(Tokenizer(models.BPE(vocab=vocab, merges=[])))

    def train() -> Tokenizer:
        core = Tokenizer(models.BPE())
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=BPE_VOCABULARY, special_tokens=SPECIALS, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        core.train_from_iterator(prose(), trainer)
        return core

    return _byte_level(cached_tokenizer(f"vibevoice-bpe-{BPE_VOCABULARY}", train))


def random_vibevoice(size: str = "1.5b", seed: int = 0, device: str = "cpu") -> VibeVoiceForConditionalGeneration:
    """The model alone, its weights made on `device` (a GPU makes the 1.5b's in seconds)."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = VibeVoiceForConditionalGeneration(VibeVoiceConfig(**SIZES[size], **SPECIAL_IDS)).eval()
        # latent scale and bias away from (1, 0), so that a missing one shows
        model.model.latent_scaling_factor.data.fill_(1.5)
        model.model.latent_bias_factor.data.fill_(-0.2)
    for key, value in GENERATION.items():
        setattr(model.generation_config, key, value)
    return model


def save_random_vibevoice(folder: Path, size: str = "1.5b", seed: int = 0, device: str = "cpu",
                          dtype: torch.dtype = torch.float32, clip: np.ndarray | None = None) -> Path:
    """Write a random VibeVoice (model in `dtype`, processor, voices/default.safetensors) to folder; the
    voice from `clip` (float mono at 24 kHz) where given, else from the bundled Piper voice."""
    from tts_core.engines.vibevoice_parts import encode_voice

    folder = Path(folder)
    model = random_vibevoice(size, seed, device)
    features = VibeVoiceAcousticTokenizerFeatureExtractor()
    clip = piper_speech(features.sampling_rate) if clip is None else clip
    voice = encode_voice(model, features, clip, features.sampling_rate)
    model.to(dtype).save_pretrained(folder)
    VibeVoiceProcessor(features, tokenizer(size)).save_pretrained(folder)
    (folder / "voices").mkdir(exist_ok=True)
    save_file({"acoustic_latents": torch.from_numpy(voice)}, str(folder / "voices" / "default.safetensors"))
    return folder


def parameters_m(folder: Path) -> dict[str, float]:
    """Millions of parameters per part, from the saved config (on the meta device: no memory)."""
    config = VibeVoiceConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = VibeVoiceForConditionalGeneration(config)
    parts = {name: sum(p.numel() for p in module.parameters()) / 1e6 for name, module in model.model.named_children()}
    parts["total"] = sum(p.numel() for p in model.parameters()) / 1e6  # the tied LM head counted once
    return {name: round(value, 1) for name, value in parts.items()}

