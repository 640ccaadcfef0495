"""Models with random weights, saved as folders the registry loads: for tests and benchmarks, no download.

    python -m bench.random_model pocket_tts DIR [--tiny] [--seed N]
    python -m bench.random_model vibevoice DIR [--tiny] [--size 1.5b] [--seed N]
    python -m bench.random_model vits DIR [--tiny] [--seed N]
    python -m bench.random_model kokoro DIR [--tiny] [--seed N]

pocket_tts: Kyutai's Pocket TTS at the released size (89 M parameters + a 20 M codec), or --tiny
(0.3 M + 0.1 M, built in a second or two). DIR holds the model, the processor (saved without its
codec: a processor saved with one records the codec's absolute path), the codec in DIR/codec, and one
shipped voice, DIR/voices/default.safetensors: about 3 s of the bundled Piper voice's speech, encoded
by the codec. The tokenizer is made here: for --tiny a byte-level one (the model's special ids
remapped to a 264-id vocabulary); for the released size a 4000-id BPE trained on the installed
transformers' docstrings (about 15 s, once: it is kept in ~/.cache/chorus). Random weights never
end on their own in any useful way, so register such a model with `fixed_length: true`:

    voices:
      random-pocket: {engine: pocket_tts, model: DIR, fixed_length: true}

vibevoice: Microsoft's VibeVoice at the released 1.5 B layout (2.7 B parameters with its tokenizers), or
--tiny (4 M); the same folder layout, a byte-level Qwen-like tokenizer, one shipped voice
(bench/random_vibevoice.py).

vits: a VITS model at MMS-TTS size, or --tiny (bench/random_vits.py).

kokoro: Kokoro at the released size (82 M), or --tiny (59 M), with a few random voice packs: the folder a
real one downloads as (bench/random_kokoro.py).

The audio of a random model is noise of the right length: enough to measure speed, memory and
batching, nothing to listen to.
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    PocketTTSAudioTokenizerConfig,
    PocketTTSAudioTokenizerModel,
    PocketTTSConfig,
    PocketTTSFeatureExtractor,
    PocketTTSForConditionalGeneration,
    PocketTTSProcessor,
)
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from bench.random_vits import TINY as TINY_VITS
from bench.random_vits import save_random_vits

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3; the config's pad_token_id is 3
PLACEHOLDERS = {  # what the processor reads on the tokenizer -> its token, in the order of their ids
    "audio_prompt_token": "<|voice|>",  # config.audio_prompt_token_id
    "audio_latent_token": "<|latent|>",  # config.audio_latent_token_id
    "audio_prompt_bos_token": "<|voice_bos|>",  # config.audio_prompt_bos_token_id
    "audio_bos_token": "<|audio_bos|>",  # config.audio_bos_token_id
}
BPE_VOCABULARY = 4000  # the released tokenizer's size; the placeholders come after it
BYTE_VOCABULARY = len(SPECIALS) + 256
# Renders voice BOS, one voice placeholder per voice, the text, the audio BOS (what the processor expands).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'audio' -%}<|voice_bos|><|voice|>{%- endif -%}"
    "{%- endfor -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}{{ item['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endfor -%}<|audio_bos|>"
)
TINY_POCKET = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
    flow_head_config=dict(hidden_size=32, num_hidden_layers=2, condition_dim=64, frequency_embedding_size=16),
    vocab_size=BYTE_VOCABULARY + len(PLACEHOLDERS),
    **{f"{name}_id": BYTE_VOCABULARY + index for index, name in enumerate(PLACEHOLDERS)},
)
TINY_CODEC = dict(hidden_size=32, num_filters=4, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
                  num_hidden_layers=1, upsample_groups=32)
VOICE_TEXT = "The quick brown fox jumps over the lazy dog."  # about 3 s in the bundled Piper voice


# --- tokenizers -----------------------------------------------------------------------------------


def _wrapped(core: Tokenizer, vocabulary: int) -> TokenizersBackend:
    """The placeholders at ids vocabulary.., wrapped as what AutoTokenizer gives for pocket_tts."""
    core.add_special_tokens(list(PLACEHOLDERS.values()))
    if core.token_to_id(PLACEHOLDERS["audio_prompt_token"]) != vocabulary:
        raise RuntimeError("the placeholders did not land after the vocabulary")
    return TokenizersBackend(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                             pad_token="<pad>", padding_side="left", extra_special_tokens=dict(PLACEHOLDERS))


def byte_tokenizer() -> TokenizersBackend:
    """Every byte one token: instant to build, any text in."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: index for index, token in enumerate(SPECIALS + alphabet)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    return _wrapped(core, BYTE_VOCABULARY)


@functools.cache  # parsed once a process: every trained tokenizer reads it
def prose(limit_chars: int = 3_000_000) -> list[str]:
    """English docstrings of the installed transformers: a corpus that needs no download."""
    texts, total = [], 0
    for path in sorted(Path(transformers.__file__).parent.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            doc = isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)) and ast.get_docstring(node)
            if doc:  # keep the words: drop code, links and symbols
                texts.append(re.sub(r"`[^`]*`|\[[^\]]*\]|\([^)]*\)|[^A-Za-z ,.;:'!?\n-]", " ", doc))
                total += len(texts[-1])
        if total > limit_chars:
            break
    return texts


def cached_tokenizer(name: str, train: Callable[[], Tokenizer]) -> Tokenizer:
    """A tokenizer trained once per transformers version (its docstrings are the corpus), then read from
    ~/.cache/chorus."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "chorus"
    path = cache / f"{name}-transformers-{transformers.__version__}.json"
    if path.is_file():
        return Tokenizer.from_file(str(path))
    core = train()
    cache.mkdir(parents=True, exist_ok=True)
    core.save(str(path))
    return core


def bpe_tokenizer() -> TokenizersBackend:
    """A SentencePiece-like BPE of exactly 4000 ids, like the released one."""

    def train() -> Tokenizer:
        core = Tokenizer(models.BPE(unk_token="<unk>"))
        core.normalizer = normalizers.NFKC()
        core.pre_tokenizer = pre_tokenizers.Metaspace()
        core.decoder = decoders.Metaspace()
        core.train_from_iterator(prose(), trainers.BpeTrainer(vocab_size=BPE_VOCABULARY, special_tokens=SPECIALS,
                                                              show_progress=False))
        core.add_special_tokens([f"<unused{i}>" for i in range(BPE_VOCABULARY - core.get_vocab_size())])
        return core

    return _wrapped(cached_tokenizer(f"pocket-bpe-{BPE_VOCABULARY}", train), BPE_VOCABULARY)


# --- Pocket TTS -----------------------------------------------------------------------------------


def piper_speech(sample_rate: int, text: str = VOICE_TEXT) -> np.ndarray:
    """Real speech from the bundled Piper voice, float32 mono at sample_rate."""
    from tts_core.engines.contract import EngineInput
    from tts_core.engines.piper import PiperEngine, bundled_voice_path
    from tts_core.engines.pocket_codec import resample

    piper = PiperEngine(bundled_voice_path())
    voice = piper.voices()[0].name
    outputs = piper.synthesize([EngineInput(tokens, voice) for tokens in piper.tokenize(text, voice)])
    return resample(np.concatenate([output.audio for output in outputs]), piper.sample_rate, sample_rate)


def save_random_pocket(folder: Path, tiny: bool = False, seed: int = 0, clip: np.ndarray | None = None) -> Path:
    """Write a random Pocket TTS (model, codec in folder/codec, processor, voices/default.safetensors); the
    voice from `clip` (float mono at the codec's rate) where given, else from the bundled Piper voice."""
    from tts_core.engines.pocket_codec import encode_voice

    folder = Path(folder)
    torch.manual_seed(seed)
    model = PocketTTSForConditionalGeneration(PocketTTSConfig(**(TINY_POCKET if tiny else {})))
    # latent statistics away from (0, 1), so that a missing denormalisation shows
    model.latent_mean.normal_(0.0, 0.5)
    model.latent_std.uniform_(0.5, 2.0)
    codec = PocketTTSAudioTokenizerModel(PocketTTSAudioTokenizerConfig(**(TINY_CODEC if tiny else {}))).eval()
    model.save_pretrained(folder)
    codec.save_pretrained(folder / "codec")
    frame_size = codec.config.frame_size
    features = PocketTTSFeatureExtractor(sampling_rate=codec.config.sampling_rate, frame_size=frame_size,
                                         pad_to_multiple_of=frame_size)
    tokenizer = byte_tokenizer() if tiny else bpe_tokenizer()
    PocketTTSProcessor(features, tokenizer, chat_template=CHAT_TEMPLATE).save_pretrained(folder)
    clip = piper_speech(features.sampling_rate) if clip is None else clip
    voice = encode_voice(codec, features, clip, features.sampling_rate)
    (folder / "voices").mkdir(exist_ok=True)
    save_file({"audio_prompt_latents": torch.from_numpy(voice)}, str(folder / "voices" / "default.safetensors"))
    return folder


def _parameters(module: torch.nn.Module) -> float:
    return sum(parameter.numel() for parameter in module.parameters()) / 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.random_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["pocket_tts", "vibevoice", "vits", "kokoro"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--tiny", action="store_true", help="a tiny model, for tests")
    parser.add_argument("--size", choices=["1.5b"], default="1.5b", help="vibevoice: the released layout to copy")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.kind == "vits":
        save_random_vits(args.folder, seed=args.seed, **(TINY_VITS if args.tiny else {}))
        print(f"random VITS -> {args.folder}")
        return
    if args.kind == "kokoro":
        from bench.random_kokoro import save_random_kokoro

        save_random_kokoro(args.folder, tiny=args.tiny, seed=args.seed)
        weights = torch.load(args.folder / "kokoro-v1_0.pth", weights_only=True)
        count = sum(tensor.numel() for part in weights.values() for tensor in part.values()) / 1e6
        print(f"random Kokoro: {count:.1f} M parameters -> {args.folder}")
        return
    if args.kind == "vibevoice":
        from bench.random_vibevoice import parameters_m, save_random_vibevoice

        save_random_vibevoice(args.folder, "tiny" if args.tiny else args.size, seed=args.seed)
        print(f"random VibeVoice: {parameters_m(args.folder)} M parameters -> {args.folder} "
              "(register it with fixed_length: true)")
        return
    save_random_pocket(args.folder, tiny=args.tiny, seed=args.seed)
    model = PocketTTSForConditionalGeneration.from_pretrained(args.folder)
    codec = PocketTTSAudioTokenizerModel.from_pretrained(args.folder / "codec")
    print(f"random Pocket TTS: model {_parameters(model):.1f} M + codec {_parameters(codec):.1f} M parameters "
          f"-> {args.folder} (register it with fixed_length: true)")


if __name__ == "__main__":
    main()
