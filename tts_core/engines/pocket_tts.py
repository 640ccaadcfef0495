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
from dataclasses import dataclass
from functools import partial
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
from .static_step import CHECK_STEPS, StepRunner, StepState, bucket_of, buckets
from .stepped_torch import SlotCache, TorchSteppedEngine, generation_values, prompted_voices, voice_files
from .torch_support import loading_model, model_folder

MODEL_KIND = "pocket_tts"
MODEL_LANGUAGE = "en"  # Pocket TTS speaks English
PROMPT_KEY = "audio_prompt_latents"  # the tensor a voice file holds: (frames, latent_dim)
# The released checkpoints' generation values (generation_pocket_tts.py), where a model's config sets none.
GENERATION_DEFAULTS = {"num_flow_steps": 1, "eos_threshold": -4.0, "min_frames_before_eos": 6}
STEP_CONTEXT = 512  # cache positions per row the compiled steps are made for (a longer request: eager)
DESCRIBE_FILES = ["*.json", "voices/*", "codec/*.json"]  # what describing a hub model reads


# --- where a model and its voices are -------------------------------------------------------------


def _sample_rate(folder: Path) -> int:
    if (folder / "codec").is_dir():
        return int(PocketTTSAudioTokenizerConfig.from_pretrained(folder / "codec").sampling_rate)
    return int(PocketTTSFeatureExtractor.from_pretrained(folder).sampling_rate)


def describe_pocket_tts(source: str, specs: Sequence[VoiceSpec]) -> list[Voice]:
    """A model's voices from its configs and voice files alone (no weights loaded): this also checks,
    at start-up, that the model and every voice prompt are there."""
    with loading_model(source):
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
    made: int = 0  # frames made (they are in the state's frames buffer, its row's)
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
                 temperature: float = 0.7, seed: int | None = None, step_mode: str = "auto",
                 step_context: int = STEP_CONTEXT, step_backend: str = "inductor",
                 step_buckets: Sequence[int] | None = None):
        """source: a hub id or a local folder; voices: the registry's voices on this model (none: the
        shipped ones); fixed_length: every request makes its whole frame budget (random weights);
        temperature: of the flow head's noise (0: greedy); step_mode: auto, eager or compiled (static_step.py);
        step_context: the cache positions per row the compiled steps are made for; step_backend: torch.compile's;
        step_buckets: the buckets compiled (None: all; the others step eager; a benchmark's)."""
        self._place(source, device, dtype, name, seed)
        self._runner = StepRunner(self._step_body, self.device, step_mode, step_backend)
        self.step_context, self._compiled_buckets = step_context, step_buckets
        self._prefixes: dict[str, tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]] = {}  # _prefix
        self.max_running, self.fixed_length, self.temperature = max_running, fixed_length, temperature
        with loading_model(source):
            folder = model_folder(source)
            files = voice_files(folder, voices)
            self._load_models(folder)
            self._specs = list(voices)
            for voice_name, path in files.items():
                self.add_voice(voice_name, self._read_prompt(path))
        self._cache = SlotCache(self.model.config, max_running, self.dtype, self.device)
        self.kv_bytes_per_token = float(self._cache.bytes_per_token)
        self._state, self._sizes = self._new_state(), buckets(max_running)
        self._latent_ids = torch.full((max_running, 1), self.model.config.audio_latent_token_id, device=self.device)
        self._compile_steps()

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
            if self._runner.mode == "eager":  # (a compiled step cannot trace oneDNN's modules: inductor packs its own)
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
        frames = self._state["frames"][self._rows.index(run), : run.made]
        return self.model.denormalize_latents(frames).cpu()

    @torch.inference_mode()
    def admit(self, items: Sequence[EngineInput]) -> list[int]:
        if not items:
            return []
        if len(self._rows) + len(items) > self.max_running:
            raise ValueError(f"{self.name}: {len(items)} joiners do not fit in {self.max_running} rows")
        joiners = [_Running(item, self._prompt_ids(item), self._voice_prompt(item), self.frames_needed(item),
                            self._frames_after_eos(item), self._decoder.new_state()) for item in items]
        self._reserve(max(len(run.prompt) + run.budget for run in self._rows + joiners))
        first = len(self._rows)
        hidden, eos_logits = self._prefill(joiners, first_row=first)
        rows = slice(first, first + len(joiners))
        for name, values in (("positions", [len(run.prompt) for run in joiners]), ("made", [0] * len(joiners)),
                             ("budget", [run.budget for run in joiners]), ("countdown", [-1] * len(joiners)),
                             ("tail", [run.frames_after_eos for run in joiners]), ("done", [False] * len(joiners))):
            self._state[name][rows] = torch.tensor(values, device=self.device)
        for run in joiners:  # only now: a prefill that fails (out of memory) leaves the running set as it was
            run.length = len(run.prompt)
            self._rows.append(run)
            self._running[run.item.id] = run
        _, ended = self._record(rows, hidden, eos_logits, self._noise(len(joiners), len(joiners)))
        return self._finished(joiners, ended)

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

    # --- the step over static state (static_step.py) --------------------------------------------------

    def _new_state(self) -> StepState:
        width = int(self.model.config.latent_dim)
        long, flag = torch.long, torch.bool
        return StepState(self.max_running, self.device, {
            "positions": ((), long, 0), "made": ((), long, 0), "budget": ((), long, 0), "countdown": ((), long, -1),
            "tail": ((), long, 0), "done": ((), flag, True),  # padding rows are done: never reported
            "last": ((width,), torch.float32, 0.0),  # each row's previous frame (normalised)
            "frames": ((0, width), torch.float32, 0.0)})  # each row's frames, as long as the cache

    def _reserve(self, length: int) -> None:
        """Cache room for `length` positions per row (at least `step_context` when compiled, so that the
        compiled graphs' capacity holds), and the frames buffer as long."""
        self._cache.reserve(max(length, self.step_context if self._runner.mode == "compiled" else 0), len(self._rows))
        if self._state["frames"].shape[1] != self._cache.capacity:
            self._state.grow("frames", (self._cache.capacity, int(self.model.config.latent_dim)), len(self._rows))

    def _step_body(self, count: int, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of the first `count` rows (running and padding) from the state alone: the backbone over the
        whole cache (its capacity; later positions masked), the flow head, the stop rule. Returns the frames
        and which rows ended at this step."""
        state, capacity = self._state, self._cache.capacity
        positions = state["positions"][:count]
        mask = torch.arange(capacity, device=self.device)[None, :] <= positions[:, None]
        self._cache.start_step(positions, capacity)
        out = self.model(input_ids=self._latent_ids[:count], audio_latents=state["last"][:count, None].to(self.dtype),
                         position_ids=positions[:, None], attention_mask=mask[:, None, None, :],
                         past_key_values=self._cache, use_cache=True)
        state["positions"][:count] += (~state["done"][:count]).long()  # a done row rewrites one unused position
        return self._record(slice(0, count), out.last_hidden_state[:, -1], out.logits[:, -1, 0], noise)

    def _record(self, rows: slice, hidden: torch.Tensor, eos_logits: torch.Tensor, noise: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The flow head turns these rows' hidden states into their next frames, written to the frames buffer;
        then generate's stopping rule on the device: the budget, or the end of speech plus a short tail."""
        state = self._state
        frames = self.model.sample_latent(hidden, noise.to(hidden.dtype), self.num_flow_steps).float()
        done, made = state["done"][rows], state["made"][rows]
        active = ~done
        at = torch.arange(rows.start, rows.stop, device=self.device)
        state["frames"][at, made.clamp(max=state["frames"].shape[1] - 1)] = frames  # (a done row: past its frames)
        state["last"][rows] = torch.where(active[:, None], frames, state["last"][rows])
        made = made + active.long()
        state["made"][rows] = made
        ended = made >= state["budget"][rows]
        if not self.fixed_length:
            countdown = state["countdown"][rows]
            seen = (countdown < 0) & (made > self.min_frames_before_eos) & (eos_logits.float() > self.eos_threshold)
            countdown = torch.where(seen, state["tail"][rows], countdown)
            ended = ended | (countdown == 0)
            countdown = torch.where(countdown > 0, countdown - 1, countdown)
            state["countdown"][rows] = torch.where(active, countdown, state["countdown"][rows])
        ended = ended & active
        state["done"][rows] = done | ended
        return frames, ended

    @torch.inference_mode()
    def _compile_steps(self) -> None:
        """Compiled mode, at load: the step compiled for every bucket at `step_context` positions, each checked
        against eager (static_step.py); any failure leaves the model eager, its reason in `step_status`."""
        if self._runner.mode != "compiled":
            return
        self._reserve(self.step_context)
        for count in self._compiled_buckets or self._sizes:
            if not self._runner.prepare((count, self._cache.capacity), partial(self._check, count)):
                break
        self._state.reset(slice(0, self.max_running))

    def _check(self, count: int, eager, compiled) -> float:
        """The largest difference between the frames of `CHECK_STEPS` steps of `count` running rows, eager and
        compiled, each from the same state (zero cache, rows at different positions, random last frames) and noise."""
        width = int(self.model.config.latent_dim)
        checking = torch.Generator(device=self.device).manual_seed(0)
        last = torch.randn(count, width, generator=checking, device=self.device)
        noises = [torch.randn(count, width, generator=checking, device=self.device) for _ in range(CHECK_STEPS)]
        made = []
        for step in (eager, compiled):
            for tensor in self._cache.keys + self._cache.values:
                tensor.zero_()
            self._state.reset(slice(0, count))
            for name, value in (("positions", torch.arange(count) * 3 + 1), ("last", last), ("done", False),
                                ("budget", self._cache.capacity - 1)):
                self._state[name][:count] = value if not torch.is_tensor(value) else value.to(self.device)
            made.append(torch.stack([step(count, noise)[0].clone() for noise in noises]))
        for tensor in self._cache.keys + self._cache.values:
            tensor.zero_()
        return float((made[0] - made[1]).abs().max())

    def _noise(self, rows: int, count: int) -> torch.Tensor:
        """The flow head's noise for `count` rows, drawn before the step for the `rows` running (as many
        draws as the unpadded step made: a seed gives the same frames padded or not)."""
        noise = torch.zeros(count, self.model.config.latent_dim, device=self.device)
        if self.temperature > 0:
            noise[:rows].normal_(generator=self._generator).mul_(math.sqrt(self.temperature))
        return noise

    @torch.inference_mode()
    def step(self) -> list[int]:
        if not self._rows:
            return []
        count = bucket_of(len(self._rows), self._sizes)
        key = (count, self._cache.capacity)
        _, ended = self._runner.run(key, count, self._noise(len(self._rows), count))
        for run in self._rows:
            if not run.done:
                run.length += 1
        return self._finished(self._rows, ended)

    def _finished(self, rows: list[_Running], ended: torch.Tensor) -> list[int]:
        """The one host read a step: which rows ended."""
        finished = []
        for run, flag in zip(rows, ended.tolist()):
            if run.done:
                continue
            run.made += 1
            if flag:
                run.done = True
                finished.append(run.item.id)
        return finished

    @torch.inference_mode()
    def take_frames(self, item_id: int, final: bool = False) -> _Piece | None:
        """Nothing is held back by the streaming decoder, so `final` needs no flush."""
        run = self._running.get(item_id)
        if run is None or run.taken == run.made:
            return None
        row = self._rows.index(run)  # (a copy: the row may be reused before the codec decodes it)
        piece = _Piece(self._state["frames"][row, run.taken: run.made].clone(), run.decoder, first=run.taken == 0)
        run.taken = run.made
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
            self._state.move(len(self._rows), row)
            self._rows[row] = last
        self._state.reset(slice(len(self._rows), len(self._rows) + 1))  # padding again

    def release_memory(self) -> None:
        super().release_memory()
        if not self._rows:  # the frames buffer too
            self._state.grow("frames", (0, int(self.model.config.latent_dim)), 0)

    def _weights(self) -> list[torch.nn.Module]:
        return [self.model, self.codec]
