"""Kyutai's Pocket TTS through transformers, as a stepped engine (continuous batching).

A request's prompt is `[voice BOS, voice x N, text, audio BOS]`: the voice is N codec latents scattered
into the N voice positions, so any voices run together (the batch key is the engine alone). Admission
prefills the joiners as one right-padded batch straight into their cache rows; the hidden state of
each prompt's last position gives its first frame. Each step then runs every running request one
position (the previous frame's latent) through the backbone, and the flow head turns the hidden
states into the next frames. The model's own rules end a request: its frame budget
`ceil((text tokens / 3 + 2) * frame_rate)`, and before that its end of speech (the end-of-speech
logit over `eos_threshold`, then `frames_after_eos` more frames), which `fixed_length` turns off for
random-weight benchmark models.

The cache (`SlotCache`, stepped_torch.py) has one row per running request, each at its own position,
compacted on release; its length doubles when a longer request joins. Audio comes from an exact streaming
decoder (pocket_codec.py), one state per running request, so pieces join seamlessly.

Voices: a voice named in the registry takes its `prompt` (a `.safetensors` file holding
`audio_prompt_latents`, or an audio clip encoded at load; relative to the model folder), else the
shipped voice of its name (`<folder>/voices/NAME.safetensors`), else the model's default voice; a
voice with no prompt also lists every shipped voice under its file's name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.mkldnn import MkldnnLinear
from transformers import (
    PocketTTSAudioTokenizerConfig,
    PocketTTSAudioTokenizerModel,
    PocketTTSConfig,
    PocketTTSFeatureExtractor,
    PocketTTSForConditionalGeneration,
    PocketTTSProcessor,
)

from ..text.pronunciation import as_text
from .base import DEFAULT_MAX_RUNNING, Voice, VoiceSpec
from .contract import EngineInput
from .pocket_codec import DecoderState, StreamingDecoder, encode_voice
from .stepped_torch import SlotCache, TorchSteppedEngine, generation_values, model_folder, prompted_voices, voice_files
from .vits import _loading

MODEL_KIND = "pocket_tts"
MODEL_LANGUAGE = "en"  # Pocket TTS speaks English
PROMPT_KEY = "audio_prompt_latents"  # the tensor a voice file holds: (frames, latent_dim)
# The released checkpoints' generation values (generation_pocket_tts.py), where a model's config sets none.
GENERATION_DEFAULTS = {"num_flow_steps": 1, "eos_threshold": -4.0, "min_frames_before_eos": 6}
DESCRIBE_FILES = ["*.json", "voices/*", "codec/*.json"]  # what describing a hub model reads


# --- where a model and its voices are -------------------------------------------------------------


def _sample_rate(folder: Path) -> int:
    if (folder / "codec").is_dir():
        return int(PocketTTSAudioTokenizerConfig.from_pretrained(folder / "codec").sampling_rate)
    return int(PocketTTSFeatureExtractor.from_pretrained(folder).sampling_rate)


def describe_pocket_tts(source: str, specs: Sequence[VoiceSpec]) -> list[Voice]:
    """A model's voices from its configs and voice files alone (no weights loaded): this also checks,
    at start-up, that the model and every voice prompt are there."""
    with _loading(source):
        folder = model_folder(source, DESCRIBE_FILES)
        PocketTTSConfig.from_pretrained(folder)
        return prompted_voices(MODEL_KIND, MODEL_LANGUAGE, list(voice_files(folder, specs)), specs,
                               _sample_rate(folder))


# --- the engine -----------------------------------------------------------------------------------


@torch.no_grad()  # (with autograd on, each converted tensor would keep its dense original alive)
def prepack_linears(module: torch.nn.Module) -> None:
    """Every Linear as oneDNN's (torch.utils.mkldnn: its weights held in oneDNN's format, the matrix
    products by oneDNN rather than by MKL): laid out once at load instead of repacked at each call, so
    the steps, the prefill and the codec cost less on a CPU, and the frames and the audio stay the same
    to within rounding (measured in docs/voices.md#autoregressive-voices)."""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, MkldnnLinear(child, torch.float32))
        else:
            prepack_linears(child)


@dataclass(eq=False)
class _Running:
    item: EngineInput
    prompt: list[int]
    voice: torch.Tensor  # its voice's prompt as it was admitted with (kept if the voice is deleted meanwhile)
    budget: int  # the most frames it makes
    frames_after_eos: int
    decoder: DecoderState
    length: int = 0  # cache positions written
    latents: list[torch.Tensor] = field(default_factory=list)  # its frames, normalised, (1, latent_dim) each
    taken: int = 0  # frames already turned into audio
    countdown: int = -1  # frames still to make after its end of speech; -1 until that is seen
    done: bool = False


@dataclass(eq=False)
class _Piece:
    """Frames taken from a running request, for `decode`: its latents (normalised) and its decoder's state."""

    latents: torch.Tensor  # (frames, latent_dim)
    decoder: DecoderState
    first: bool  # its stream's first piece: it fades in


class PocketTTSEngine(TorchSteppedEngine):
    model_kind, model_language, prompt_key = MODEL_KIND, MODEL_LANGUAGE, PROMPT_KEY
    decodes_apart = True

    def __init__(self, source: str, voices: Sequence[VoiceSpec], device: str = "auto", dtype: str = "fp32",
                 name: str | None = None, max_running: int = DEFAULT_MAX_RUNNING, fixed_length: bool = False,
                 temperature: float = 0.7, seed: int | None = None):
        """source: a hub id or a local folder; voices: the registry's voices on this model (none: the
        shipped ones); fixed_length: every request makes its whole frame budget (random weights);
        temperature: of the flow head's noise (0: greedy)."""
        self._place(source, device, dtype, name, seed)
        self._prefixes: dict[str, tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]] = {}  # _prefix
        self.max_running, self.fixed_length, self.temperature = max_running, fixed_length, temperature
        with _loading(source):
            folder = model_folder(source)
            files = voice_files(folder, voices)
            self._load_models(folder)
            self._specs = list(voices)
            for voice_name, path in files.items():
                self.add_voice(voice_name, self._read_prompt(path))
        self._cache = SlotCache(self.model.config, max_running, self.dtype, self.device)
        self.kv_bytes_per_token = float(self._cache.bytes_per_token)

    def _load_models(self, folder: Path) -> None:
        """The codec from <folder>/codec when there is one: a processor saved with its codec records
        the codec's absolute path, and would load it from there even after the folder moved."""
        codec = None
        if (folder / "codec").is_dir():
            codec = PocketTTSAudioTokenizerModel.from_pretrained(folder / "codec", local_files_only=True)
        extra = {"audio_tokenizer": codec} if codec is not None else {}
        self.processor = PocketTTSProcessor.from_pretrained(folder, local_files_only=True, **extra)
        self.codec = self.processor.audio_tokenizer
        if self.codec is None:
            raise FileNotFoundError(f"no codec: neither {folder / 'codec'} nor one named by the processor")
        self.codec.to(self.device).eval()  # the codec stays in fp32: it is small, and the audio exact
        self.model = PocketTTSForConditionalGeneration.from_pretrained(folder, dtype=self.dtype,
                                                                       local_files_only=True)
        self.model.to(self.device).eval()
        if self.device == "cpu" and torch.backends.mkldnn.is_available():  # (fp32: the only precision on a CPU)
            prepack_linears(self.model)
            prepack_linears(self.codec)
        self._read_settings()

    def _read_settings(self) -> None:
        """Rates, the processor's fade-in and end-of-speech tails, the model's generation values."""
        self.tokenizer = self.processor.tokenizer
        self.sample_rate = int(self.codec.config.sampling_rate)
        self.frame_size = int(self.codec.config.frame_size)
        self.frame_rate = float(self.model.config.frame_rate)
        self._decoder = StreamingDecoder(self.codec)
        fade = int(self.processor.fade_in_duration * self.sample_rate)
        self._fade_in = np.linspace(0.0, 1.0, fade, dtype=np.float32)  # the processor's, on the first piece
        for key, value in generation_values(self.model, GENERATION_DEFAULTS).items():
            setattr(self, key, value)
        config = self.model.config
        has_voice_bos = self.processor.audio_prompt_bos_token is not None
        self._voice_bos = [config.audio_prompt_bos_token_id] if has_voice_bos else []

    # --- voices ---------------------------------------------------------------------------------

    def voice_prompt_from_audio(self, audio: np.ndarray, sample_rate: int) -> np.ndarray:
        """A voice clip (float mono at any rate) -> its voice prompt, latents (frames, latent_dim), to
        pass to `add_voice` or to save as `audio_prompt_latents` in a .safetensors file."""
        return encode_voice(self.codec, self.processor.feature_extractor, audio, sample_rate)

    def _prompt_width(self) -> int:
        return int(self.model.config.latent_dim)

    # --- text and budgets -----------------------------------------------------------------------

    def tokenize(self, text: str, voice: str) -> list[np.ndarray]:
        """The text's ids, as the processor's chat template and tokenizer prepare it (no placeholders:
        admission builds the prompt)."""
        text = as_text(text)  # a pronunciation: its respelling, else its word
        prepared = text
        if self.processor.chat_template is not None:
            message = {"role": "user", "content": [{"type": "text", "text": text}]}
            prepared = self.processor.apply_chat_template([message])
            for token in self.processor.placeholder_tokens:
                prepared = prepared.replace(token, "")
        ids = self.tokenizer.encode(prepared, add_special_tokens=False)
        return [np.asarray(ids, dtype=np.int64)] if ids else []

    def frames_needed(self, item: EngineInput) -> int:
        return math.ceil((item.length / 3 + 2) * self.frame_rate)  # generate's budget, per request

    def _prompt_ids(self, item: EngineInput) -> list[int]:
        config = self.model.config
        voice = [config.audio_prompt_token_id] * len(self._voice_prompt(item))
        return [*self._voice_bos, *voice, *item.tokens.tolist(), config.audio_bos_token_id]

    def context_tokens(self, item: EngineInput) -> int:
        return len(self._prompt_ids(item)) + self.frames_needed(item)

    def _frames_after_eos(self, item: EngineInput) -> int:
        """The processor's rule: short texts get a longer tail after their end of speech."""
        words = len(self.tokenizer.decode(item.tokens.tolist(), skip_special_tokens=True).split())
        short = words <= self.processor.short_text_max_words
        return self.processor.frames_after_eos_short_text if short else self.processor.frames_after_eos

    # --- running --------------------------------------------------------------------------------

    def latents(self, item_id: int) -> torch.Tensor:
        """The frames a running item has made, in the codec's space (frames, latent_dim)."""
        run = self._running[item_id]
        if not run.latents:
            return torch.zeros(0, self.model.config.latent_dim)
        return self.model.denormalize_latents(torch.cat(run.latents))

    @torch.inference_mode()
    def admit(self, items: Sequence[EngineInput]) -> list[int]:
        if not items:
            return []
        if len(self._rows) + len(items) > self.max_running:
            raise ValueError(f"{self.name}: {len(items)} joiners do not fit in {self.max_running} rows")
        joiners = [_Running(item, self._prompt_ids(item), self._voice_prompt(item), self.frames_needed(item),
                            self._frames_after_eos(item), self._decoder.new_state()) for item in items]
        self._cache.reserve(max(len(run.prompt) + run.budget for run in self._rows + joiners), len(self._rows))
        hidden, eos_logits = self._prefill(joiners, first_row=len(self._rows))
        for run in joiners:  # only now: a prefill that fails (out of memory) leaves the running set as it was
            run.length = len(run.prompt)
            self._rows.append(run)
            self._running[run.item.id] = run
        return self._advance(joiners, hidden, eos_logits)

    def _prefill(self, joiners: list[_Running], first_row: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each joiner's cache row starts from its voice's cached prefix (`_prefix`); the rest of the prompts
        (text and audio BOS) run as one right-padded batch, each row at the positions after its voice
        (causal attention never sees the padding after a prompt). Returns the hidden state and end-of-speech
        logit of each prompt's last position."""
        starts = []
        for row, run in enumerate(joiners):
            keys, values = self._prefix(run.item.voice, run.voice)
            self._cache.put_prefix(first_row + row, keys, values)
            starts.append(keys[0].shape[1])
        rests = [run.prompt[start:] for run, start in zip(joiners, starts, strict=True)]
        count, longest = len(joiners), max(map(len, rests))
        ids = torch.full((count, longest), self.model.config.pad_token_id, dtype=torch.long)
        for row, rest in enumerate(rests):
            ids[row, : len(rest)] = torch.tensor(rest)
        first = torch.tensor(starts, device=self.device)
        positions = first[:, None] + torch.arange(longest, device=self.device)[None]
        visible = torch.arange(int(first.max()) + longest, device=self.device)[None, None] <= positions[:, :, None]
        self._cache.start_prefill(first_row, count, starts=first)
        out = self.model(input_ids=ids.to(self.device), position_ids=positions, attention_mask=visible[:, None],
                         past_key_values=self._cache, use_cache=True)
        rows = torch.arange(count, device=self.device)
        last = torch.tensor([len(rest) - 1 for rest in rests], device=self.device)
        return out.last_hidden_state[rows, last], out.logits[rows, last, 0]

    def _prefix(self, voice: str, prompt: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The keys and values of the voice's part of a prompt, `[voice BOS, voice x N]`, the same for every
        request in the voice: made once per voice prompt, then copied into each joiner's row (a prefix cache:
        a prefill computes only the text). Kept for the voices offered now."""
        cached = self._prefixes.get(voice)
        if cached is not None and cached[0] is prompt:  # (a voice given a new prompt is made again)
            return cached[1], cached[2]
        ids = [*self._voice_bos, *[self.model.config.audio_prompt_token_id] * len(prompt)]
        cache = SlotCache(self.model.config, 1, self.dtype, self.device)
        cache.reserve(len(ids), 0)
        cache.start_prefill(0, 1)
        causal = torch.ones(len(ids), len(ids), dtype=torch.bool, device=self.device).tril()
        self.model(input_ids=torch.tensor([ids], device=self.device), audio_prompt_latents=prompt[None],
                   position_ids=torch.arange(len(ids), device=self.device)[None], attention_mask=causal[None, None],
                   past_key_values=cache, use_cache=True)
        keys, values = cache.prefix(0, len(ids))
        kept = {voice: entry for voice, entry in self._prefixes.items() if voice in self._prompts}
        self._prefixes = {**kept, voice: (prompt, keys, values)}
        return keys, values

    @torch.inference_mode()
    def step(self) -> list[int]:
        if not self._rows:
            return []
        count = len(self._rows)
        positions = torch.tensor([run.length for run in self._rows], device=self.device)
        read = max(run.length for run in self._rows) + 1
        mask = torch.arange(read, device=self.device)[None, :] <= positions[:, None]
        previous = torch.cat([run.latents[-1] for run in self._rows]).to(self.dtype)
        ids = torch.full((count, 1), self.model.config.audio_latent_token_id, device=self.device)
        self._cache.start_step(positions, read)
        out = self.model(input_ids=ids, audio_latents=previous[:, None, :], position_ids=positions[:, None],
                         attention_mask=mask[:, None, None, :], past_key_values=self._cache, use_cache=True)
        for run in self._rows:
            if not run.done:  # a finished row not yet released rewrites one unused position
                run.length += 1
        return self._advance(self._rows, out.last_hidden_state[:, -1], out.logits[:, -1, 0])

    def _advance(self, rows: list[_Running], hidden: torch.Tensor, eos_logits: torch.Tensor) -> list[int]:
        """The flow head turns each row's hidden state into its next frame; returns the rows that end."""
        noise = torch.zeros(len(rows), self.model.config.latent_dim, device=self.device)
        if self.temperature > 0:
            noise.normal_(generator=self._generator).mul_(math.sqrt(self.temperature))
        frames = self.model.sample_latent(hidden, noise.to(hidden.dtype), self.num_flow_steps).float()
        finished = []
        for row, (run, eos_logit) in enumerate(zip(rows, eos_logits.float().tolist())):
            if run.done:
                continue
            run.latents.append(frames[row: row + 1])
            run.done = self._ends(run, eos_logit)
            if run.done:
                finished.append(run.item.id)
        return finished

    def _ends(self, run: _Running, eos_logit: float) -> bool:
        """generate's stopping rule for one row: its budget, or its end of speech plus a short tail."""
        made = len(run.latents)
        if made >= run.budget:
            return True
        if self.fixed_length:
            return False
        if run.countdown < 0 and made > self.min_frames_before_eos and eos_logit > self.eos_threshold:
            run.countdown = run.frames_after_eos
        if run.countdown == 0:
            return True
        if run.countdown > 0:
            run.countdown -= 1
        return False

    @torch.inference_mode()
    def take_frames(self, item_id: int, final: bool = False) -> _Piece | None:
        """Nothing is held back by the streaming decoder, so `final` needs no flush."""
        run = self._running.get(item_id)
        if run is None or run.taken == len(run.latents):
            return None
        piece = _Piece(torch.cat(run.latents[run.taken:]), run.decoder, first=run.taken == 0)
        run.taken = len(run.latents)
        return piece

    @torch.inference_mode()
    def decode(self, frames: _Piece) -> np.ndarray:
        latents = self.model.denormalize_latents(frames.latents)
        audio = self._decoder.decode(latents[None].to(self.codec.dtype), frames.decoder)[0].float().cpu().numpy()
        if frames.first:
            audio[: self._fade_in.size] *= self._fade_in[: audio.size]
        return np.clip(audio, -1.0, 1.0)

    @torch.inference_mode()  # the cache rows are inference tensors
    def release(self, item_id: int) -> None:
        run = self._running.pop(item_id, None)
        if run is None:
            return
        row = self._rows.index(run)
        last = self._rows.pop()
        if last is not run:  # the last row fills the hole: rows stay 0..n-1
            self._cache.move(len(self._rows), row, last.length)
            self._rows[row] = last

    def _weights(self) -> list[torch.nn.Module]:
        return [self.model, self.codec]
