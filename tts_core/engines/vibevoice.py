"""Microsoft's VibeVoice through transformers, as a stepped engine (continuous batching).

A request is one speaker's one line of VibeVoice's script, the original processor's format:
`system prompt, " Voice input:\\n Speaker 0:" [audio BOS, voice x N, audio EOS] "\\n Text input:\\n",
" Speaker 0: TEXT\\n", " Speech output:\\n" [audio BOS]`; the voice is N acoustic latents, scaled and
projected into the N voice positions, so any voices run together (the batch key is the engine alone).

Each request has two sequences in the backbone's cache (`SlotCache`, two rows a request): the positive
one (its prompt, then its frames) and classifier-free guidance's negative one (an audio BOS alone, then
the same frames). Admission prefills the joiners' prompts as one right-padded batch, and their negative
BOS as another. A step is what `generate` does for each request, for all of them at once:
- one forward of the 2n rows, one position each (the previous frame's embedding);
- the positive rows' logits, limited to {audio BOS, audio EOS, audio placeholder, end of text}, pick
  the next token (argmax): anything but the placeholder is the request's end of speech;
- the diffusion head makes each frame's latent from noise in `num_diffusion_steps` DPM-Solver++ steps,
  guided by the positive and negative hidden states (`guidance_scale`);
- the acoustic decoder turns the latents into audio, a frame (3200 samples) each, and the semantic
  encoder reads that audio back: both as streams, with caches kept per request (`StreamCaches`), so a
  request's pieces join seamlessly; the next input embedding is the projected latent plus the
  projected semantic features.
So audio is decoded as it is made, and `decode` only hands it out (no codec stage).

Frame budget (VibeVoice has none of its own but `max_new_tokens`): Pocket TTS's rule on the request's
script line, `ceil((line tokens / 3 + 2) * 7.5)` frames: about 3 tokens a second of speech, plus 2 s.
Random weights never end speech usefully: `fixed_length` forces the placeholder token (as a logits
processor would) so that every request makes its whole budget.

A conversation (a dialogue's turns, tts_core.request.dialogue) is one request too, in VibeVoice's multi-speaker
layout: its voice is a cast (`cast_voice`: up to MAX_SPEAKERS voices, Speaker 0, 1, ...), every voice's prompt in
the one context (`" Speaker 0:" [BOS, voice 0, EOS] "\n Speaker 1:" [BOS, voice 1, EOS] ...`), its text lines of
`Speaker k: text` (`conversation_text`), written as the script's lines; the model speaks them as one recording.

Voices: a registry voice's `prompt` (a `.safetensors` file holding `acoustic_latents`, (frames, 64), or
an audio clip encoded at load), else the shipped voice of its name (`<folder>/voices/NAME.safetensors`),
else the shipped default; no speaking-rate control.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import (
    VibeVoiceAcousticTokenizerFeatureExtractor,
    VibeVoiceConfig,
    VibeVoiceForConditionalGeneration,
    VibeVoiceProcessor,
)

from ..errors import voice_deleted
from ..text.pronunciation import as_text
from .base import DEFAULT_MAX_RUNNING, Voice, VoiceSpec
from .contract import CAST_SEPARATOR, EngineInput
from .static_step import StepRunner
from .stepped_torch import SlotCache, TorchSteppedEngine, generation_values, prompted_voices, voice_files
from .torch_support import loading_model, model_folder
from .vibevoice_parts import DPMSolver, StreamCaches, encode_voice

MODEL_KIND = "vibevoice"
MODEL_LANGUAGE = "en"  # VibeVoice speaks English and Chinese; English unless the registry says zh
PROMPT_KEY = "acoustic_latents"  # the tensor a voice file holds: (frames, latent_dim)
SYSTEM_PROMPT = (" Transform the text provided by various speakers into speech output, utilizing the distinct "
                 "voice of each respective speaker.\n")
# Where a model's generation config sets none: the original VibeVoice's cfg_scale (generate's own fallback,
# 1.0, turns guidance off) and generate's diffusion steps.
GENERATION_DEFAULTS = {"guidance_scale": 1.3, "num_diffusion_steps": 10}
DESCRIBE_FILES = ["*.json", "voices/*"]  # what describing a hub model reads
MAX_SPEAKERS = 4  # the original VibeVoice's conversations: up to four speakers in one context
CONVERSATION_LINE = re.compile(r"^Speaker (\d+): (.*)$")


def cast_voice(voices: Sequence[str]) -> str:
    """The voice of a conversation among these voices (Speaker 0, 1, ... in this order)."""
    return CAST_SEPARATOR.join(voices)


def conversation_text(lines: Sequence[tuple[int, str]]) -> str:
    """A conversation's text for a cast voice: each (speaker's index in the cast, what they say) a line."""
    return "\n".join(f"Speaker {speaker}: {' '.join(text.split())}" for speaker, text in lines)


def describe_vibevoice(source: str, specs: Sequence[VoiceSpec]) -> list[Voice]:
    """A model's voices from its configs and voice files alone (no weights loaded): this also checks,
    at start-up, that the model and every voice prompt are there."""
    with loading_model(source):
        folder = model_folder(source, DESCRIBE_FILES)
        VibeVoiceConfig.from_pretrained(folder)
        rate = VibeVoiceAcousticTokenizerFeatureExtractor.from_pretrained(folder).sampling_rate
        return prompted_voices(MODEL_KIND, MODEL_LANGUAGE, list(voice_files(folder, specs)), specs, int(rate))


@dataclass(eq=False)
class _Running:
    item: EngineInput
    prompt: list[int]
    voices: list[torch.Tensor]  # each speaker's voice prompt, acoustic latents (frames, latent_dim)
    budget: int  # the most frames it makes
    length: int = 0  # positions written in its positive row (the longer of its two)
    negative: int = 0  # positions written in its negative row
    embedding: torch.Tensor | None = None  # the next position's input, (1, hidden)
    latents: list[torch.Tensor] = field(default_factory=list)  # its frames' latents, (1, latent_dim) each
    audio: list[torch.Tensor] = field(default_factory=list)  # its frames' audio, (frame_size,) each
    taken: int = 0  # frames whose audio was handed out
    done: bool = False


class VibeVoiceEngine(TorchSteppedEngine):
    model_kind, model_language, prompt_key = MODEL_KIND, MODEL_LANGUAGE, PROMPT_KEY

    def __init__(self, source: str, voices: Sequence[VoiceSpec], device: str = "auto", dtype: str = "fp32",
                 name: str | None = None, max_running: int = DEFAULT_MAX_RUNNING, fixed_length: bool = False,
                 temperature: float = 1.0, seed: int | None = None, step_mode: str = "auto"):
        """source: a hub id or a local folder; voices: the registry's voices on this model (none: the
        shipped ones); fixed_length: every request makes its whole frame budget (random weights);
        temperature: the variance of the diffusion's starting noise (1: the model's own; 0: none, a
        deterministic run); step_mode: VibeVoice's step runs eager whatever is asked (its static step is
        not built yet; `step_status` says so)."""
        self._place(source, device, dtype, name, seed)
        self._runner = StepRunner(self.step, self.device, step_mode)
        if self._runner.mode == "compiled":
            self._runner.mode, self._runner.reason = "eager", "VibeVoice's step has no compiled form yet"
        self.max_running, self.fixed_length, self.temperature = max_running, fixed_length, temperature
        with loading_model(source):
            folder = model_folder(source)
            files = voice_files(folder, voices)
            self.processor = VibeVoiceProcessor.from_pretrained(folder, local_files_only=True)
            self.model = VibeVoiceForConditionalGeneration.from_pretrained(folder, dtype=self.dtype,
                                                                           local_files_only=True)
            self.model.to(self.device).eval()
            self._read_settings()
            self._specs = list(voices)
            for voice_name, path in files.items():
                self.add_voice(voice_name, self._read_prompt(path))
        self._cache = SlotCache(self.model.config.text_config, 2 * max_running, self.dtype, self.device)
        self.kv_bytes_per_token = float(self._cache.bytes_per_token)
        self._streams = StreamCaches()  # the running requests' decoder and encoder states, by row

    def _read_settings(self) -> None:
        """Rates, the script's fixed parts, the tokens the LM may pick, the generation values."""
        config, self.tokenizer = self.model.config, self.processor.tokenizer
        self.sample_rate = int(self.processor.feature_extractor.sampling_rate)
        self.frame_size = int(config.audio_config.hop_length)
        self.frame_rate = self.sample_rate / self.frame_size
        self._head = [*self._encode(SYSTEM_PROMPT + " Voice input:\n Speaker 0:"), config.audio_bos_token_id]
        # between one speaker's voice and the next's (the processor tokenizes the text between special tokens alone)
        self._next_speaker = [[config.audio_eos_token_id, *self._encode(f"\n Speaker {index}:"),
                               config.audio_bos_token_id] for index in range(1, MAX_SPEAKERS)]
        self._middle = [config.audio_eos_token_id, *self._encode("\n Text input:\n")]
        self._tail = [*self._encode(" Speech output:\n"), config.audio_bos_token_id]
        allowed = sorted({config.audio_bos_token_id, config.audio_eos_token_id, config.audio_token_id,
                          config.eos_token_id})
        self._allowed = torch.tensor(allowed, device=self.device)
        for key, value in generation_values(self.model, GENERATION_DEFAULTS).items():
            setattr(self, key, value)
        scheduler = getattr(self.model.generation_config, "noise_scheduler_config", None)
        self._scheduler = DPMSolver.from_config(scheduler)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _weights(self) -> list[torch.nn.Module]:
        return [self.model]

    # --- voices ---------------------------------------------------------------------------------

    def voice_prompt_from_audio(self, audio: np.ndarray, sample_rate: int) -> np.ndarray:
        """A voice clip (float mono at any rate) -> its voice prompt, acoustic latents (frames, latent_dim),
        to pass to `add_voice` or to save as `acoustic_latents` in a .safetensors file."""
        return encode_voice(self.model, self.processor.feature_extractor, audio, sample_rate)

    def _prompt_width(self) -> int:
        return int(self.model.config.audio_config.hidden_size)

    # --- text and budgets -----------------------------------------------------------------------

    def tokenize(self, text: str, voice: str) -> list[np.ndarray]:
        """The ids of the text's script line (one line: its own line breaks become spaces); for a cast voice, of
        the conversation's lines (`conversation_text`), one input."""
        if CAST_SEPARATOR in voice:
            lines = [self._conversation_line(line, voice) for line in text.splitlines() if line.strip()]
            script = "".join(f" Speaker {speaker}: {words}\n" for speaker, words in lines if words)
            return [np.asarray(self._encode(script), dtype=np.int64)] if script else []
        words = " ".join(as_text(text).split())  # a pronunciation: its respelling, else its word
        return [np.asarray(self._encode(f" Speaker 0: {words}\n"), dtype=np.int64)] if words else []

    @staticmethod
    def _conversation_line(line: str, voice: str) -> tuple[int, str]:
        found = CONVERSATION_LINE.match(line.strip())
        speakers = voice.count(CAST_SEPARATOR) + 1
        if found is None or int(found.group(1)) >= speakers:
            raise ValueError(f"{line!r} is not `Speaker k: text`, k one of the cast's {speakers}")
        return int(found.group(1)), " ".join(as_text(found.group(2)).split())

    def frames_needed(self, item: EngineInput) -> int:
        return math.ceil((item.length / 3 + 2) * self.frame_rate)

    def _cast(self, item: EngineInput) -> list[torch.Tensor]:
        """The voice prompts of the input's speakers: its voice's, or each of a cast's."""
        names = item.voices
        if len(names) > MAX_SPEAKERS:
            raise ValueError(f"{self.name}: a conversation of {len(names)} voices; VibeVoice takes {MAX_SPEAKERS}")
        known = self._prompts  # one table: add_voice swaps it whole
        missing = [name for name in names if name not in known]
        if missing:
            raise voice_deleted(self.name, missing[0])
        return [known[name] for name in names]

    def _voice_layout(self, voices: list[torch.Tensor]) -> tuple[list[int], list[int]]:
        """The prompt's voice input, every speaker's voice placeholders after their name, and where each voice
        starts in it."""
        ids, starts, placeholder = [*self._head], [], self.model.config.audio_token_id
        for index, voice in enumerate(voices):
            ids += self._next_speaker[index - 1] if index else []
            starts.append(len(ids))
            ids += [placeholder] * len(voice)
        return ids, starts

    def _prompt_ids(self, item: EngineInput) -> list[int]:
        voices, _ = self._voice_layout(self._cast(item))
        return [*voices, *self._middle, *item.tokens.tolist(), *self._tail]

    def context_tokens(self, item: EngineInput) -> int:
        """Both rows: the prompt and a BOS, then every frame in each."""
        return len(self._prompt_ids(item)) + 1 + 2 * self.frames_needed(item)

    def latents(self, item_id: int) -> torch.Tensor:
        """The latents a running item has made, as the diffusion head makes them (frames, latent_dim)."""
        run = self._running[item_id]
        return torch.cat(run.latents) if run.latents else torch.zeros(0, self.model.config.audio_config.hidden_size)

    # --- running --------------------------------------------------------------------------------

    @torch.inference_mode()
    def admit(self, items: Sequence[EngineInput]) -> list[int]:
        if not items:
            return []
        if len(self._rows) + len(items) > self.max_running:
            raise ValueError(f"{self.name}: {len(items)} joiners do not fit in {self.max_running} rows")
        joiners = [_Running(item, self._prompt_ids(item), self._cast(item), self.frames_needed(item)) for item in items]
        self._cache.reserve(max(len(run.prompt) + run.budget for run in self._rows + joiners), 2 * len(self._rows))
        first = 2 * len(self._rows)  # a request's rows: 2i positive, 2i + 1 negative
        positive = self._prefill([run.prompt for run in joiners], [run.voices for run in joiners], first)
        negative = self._prefill([[self.model.config.audio_bos_token_id]] * len(joiners), None, first + 1)
        streams = StreamCaches()
        finished = self._advance(joiners, positive, negative, streams)
        for run in joiners:  # only now: a failure (out of memory) leaves the running set as it was
            run.length, run.negative = len(run.prompt), 1
            self._rows.append(run)
            self._running[run.item.id] = run
        self._streams.extend(streams)
        return finished

    def _prefill(self, prompts: list[list[int]], voices: list[list[torch.Tensor]] | None, first_row: int
                 ) -> torch.Tensor:
        """Prompts as one batch into rows first_row, first_row + 2, ..., right-padded so each row's
        positions start at 0 (causal attention never sees the padding after a prompt); each row's voices'
        latents go into their placeholders. Returns the hidden state of each prompt's last position."""
        count, longest = len(prompts), max(map(len, prompts))
        ids = torch.full((count, longest), self.model.config.pad_token_id, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, : len(prompt)] = torch.tensor(prompt)
        embeddings = self.model.get_input_embeddings()(ids.to(self.device))
        for row, cast in enumerate(voices or []):
            for start, voice in zip(self._voice_layout(cast)[1], cast, strict=True):
                embeddings[row, start: start + len(voice)] = self._voice_embeddings(voice)
        causal = torch.ones(longest, longest, dtype=torch.bool, device=self.device).tril()
        positions = torch.arange(longest, device=self.device)[None].expand(count, -1)
        self._cache.start_prefill(first_row, count, stride=2)
        hidden = self._backbone(embeddings, positions, causal[None, None].expand(count, 1, -1, -1))
        last = torch.tensor([len(prompt) - 1 for prompt in prompts], device=self.device)
        return hidden[torch.arange(count, device=self.device), last]

    def _voice_embeddings(self, latents: torch.Tensor) -> torch.Tensor:
        """As the model embeds a voice clip's acoustic latents: scaled, then projected."""
        model = self.model.model
        scaled = (latents.to(self.dtype) + model.latent_bias_factor) * model.latent_scaling_factor
        return model.multi_modal_projector(scaled)

    def _backbone(self, embeddings: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model.model.language_model(inputs_embeds=embeddings, position_ids=positions, attention_mask=mask,
                                               past_key_values=self._cache, use_cache=True).last_hidden_state

    @torch.inference_mode()
    def step(self) -> list[int]:
        if not self._rows:
            return []
        positions = torch.tensor([at for run in self._rows for at in (run.length, run.negative)], device=self.device)
        read = max(run.length for run in self._rows) + 1  # a positive row is the longer of a request's two
        mask = torch.arange(read, device=self.device)[None, :] <= positions[:, None]
        # a row that ended before its first frame (end of speech at once) has no input: it is never read
        nothing = torch.zeros(1, self.model.config.text_config.hidden_size, dtype=self.dtype, device=self.device)
        inputs = [nothing if run.embedding is None else run.embedding for run in self._rows]
        embeddings = torch.cat(inputs).repeat_interleave(2, dim=0)  # both rows of a request take its frame
        self._cache.start_step(positions, read)
        hidden = self._backbone(embeddings[:, None], positions[:, None], mask[:, None, None, :])[:, -1]
        for run in self._rows:
            if not run.done:  # a finished row not yet released rewrites one unused position
                run.length, run.negative = run.length + 1, run.negative + 1
        return self._advance(self._rows, hidden[0::2], hidden[1::2], self._streams)

    def _advance(self, rows: list[_Running], positive: torch.Tensor, negative: torch.Tensor,
                 streams: StreamCaches) -> list[int]:
        """Each row's next token; a frame for each row that goes on; the audio of every row (zeros where
        it makes none, as generate decodes); returns the rows that end, by end of speech or budget."""
        tokens = self._tokens(rows, positive)
        speaking = self.model.config.audio_token_id
        making = [index for index, run in enumerate(rows) if not run.done and tokens[index] == speaking]
        ended = [run for index, run in enumerate(rows) if not run.done and tokens[index] != speaking]
        for run in ended:  # its end of speech
            run.done = True
        finished = [run.item.id for run in ended]
        latents = positive.new_zeros(len(rows), self.model.config.audio_config.hidden_size)
        if making:
            chosen = torch.tensor(making, device=self.device)
            latents[chosen] = self._diffuse(positive[chosen], negative[chosen])
        audio, embeddings = self._decode(latents, streams)
        for index in making:
            run = rows[index]
            run.latents.append(latents[index: index + 1])
            run.audio.append(audio[index])
            run.embedding = embeddings[index: index + 1]
            if len(run.latents) >= run.budget:
                run.done = True
                finished.append(run.item.id)
        return finished

    def _tokens(self, rows: list[_Running], positive: torch.Tensor) -> list[int]:
        """The rows' next tokens, generate's choice: the argmax of the logits among the tokens VibeVoice
        may emit. Under `fixed_length` always the audio placeholder (and no device sync)."""
        if self.fixed_length:
            return [self.model.config.audio_token_id] * len(rows)
        logits = torch.nn.functional.linear(positive, self.model.lm_head.weight[self._allowed])
        return self._allowed[logits.argmax(dim=-1)].tolist()

    def _diffuse(self, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        """The diffusion head's latents, from noise, guided by the positive and negative conditions."""
        count, width = len(positive), self.model.config.audio_config.hidden_size
        condition = torch.cat([positive, negative])
        noise = torch.zeros(count, width, device=self.device)
        if self.temperature > 0:
            noise.normal_(generator=self._generator).mul_(math.sqrt(self.temperature))
        latents = noise.to(condition.dtype)
        scheduler = self._scheduler
        scheduler.set_timesteps(self.num_diffusion_steps)
        for timestep in scheduler.timesteps:
            both = torch.cat([latents, latents])
            velocity = self.model.model.diffusion_head(both, timestep.repeat(2 * count).to(both), condition=condition)
            conditional, unconditional = velocity.split(count)
            guided = unconditional + self.guidance_scale * (conditional - unconditional)
            latents = scheduler.step(guided, timestep, latents).prev_sample
        return latents

    def _decode(self, latents: torch.Tensor, streams: StreamCaches) -> tuple[torch.Tensor, torch.Tensor]:
        """Latents -> a frame of audio each (streamed), and the next input embedding: the projected latent
        plus the projected semantic features of that audio (also streamed)."""
        model = self.model.model
        scaled = latents / model.latent_scaling_factor - model.latent_bias_factor
        audio = model.audio_tower.decode(scaled[:, None], padding_cache=streams.decoder, use_cache=True).audio
        semantic = model.semantic_tokenizer_encoder(audio, padding_cache=streams.encoder, use_cache=True).latents
        embeddings = model.multi_modal_projector(latents) + model.semantic_connector(semantic[:, 0])
        return audio[:, 0], embeddings

    def take_frames(self, item_id: int, final: bool = False) -> list[torch.Tensor] | None:
        """Audio is decoded as it is made (the semantic encoder needs it), so its frames are already audio,
        and `final` has nothing to flush."""
        run = self._running.get(item_id)
        if run is None or not run.audio:
            return None
        pieces, run.audio = run.audio, []
        return pieces

    @torch.inference_mode()
    def decode(self, frames: list[torch.Tensor]) -> np.ndarray:
        return np.clip(torch.cat(frames).float().cpu().numpy(), -1.0, 1.0)

    @torch.inference_mode()  # the cache rows are inference tensors
    def release(self, item_id: int) -> None:
        run = self._running.pop(item_id, None)
        if run is None:
            return
        row = self._rows.index(run)
        last = self._rows.pop()
        self._streams.remove(row)
        if last is not run:  # the last request's rows fill the hole: rows stay 0..2n-1
            count = len(self._rows)
            self._cache.move(2 * count, 2 * row, last.length)
            self._cache.move(2 * count + 1, 2 * row + 1, last.negative)
            self._rows[row] = last
