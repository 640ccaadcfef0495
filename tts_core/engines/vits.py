"""Hugging Face VITS models (the MMS-TTS family: facebook/mms-tts-*) through transformers.

Batches are padded with the tokenizer's pad id and an attention mask; the model reports each
item's length in samples (`sequence_lengths`), so every item is trimmed to its own audio. The
model masks padding everywhere but in its vocoder, whose convolutions would let the padded
frames leak into the last ~20 ms of a shorter item; `_VocoderMask` zeroes them before every
convolution, so a batched item decodes exactly as it does alone.
The model's duration predictor is hooked to keep each token's duration, so every item also gets
its `token_samples` (for word timestamps) and is trimmed by exactly those.
`speaking_rate` is one number per forward call and the speaker one id, so both are part of the
batch key. On CUDA the engine keeps a memory model (peak bytes per padded token, measured at
warm-up) that the batcher asks for a token budget, and pipelines: its loop pads the next batch into pinned memory
and starts it while the device still runs this one, whose audio comes back by a copy that waits for nothing
(`prepare`, `run`, `finish`: tts_core.engines.base).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from transformers import VitsConfig, VitsModel, VitsTokenizer

from ..text.chunks import words
from ..text.pronunciation import as_text
from .alignment import unit_words
from .base import EngineUnavailable, OneShotEngine, Voice, VoiceSpec, peak_normalize
from .contract import Capabilities, EngineInput, EngineOutput
from .torch_support import DTYPES, DeviceMemory, hub_offline, loading_model, resolve_device

log = logging.getLogger(__name__)

LOW_PRECISION = {"cuda": "fp16"}  # what the degrade mode's precision action switches to, by device (none on a CPU)
# The parts that run at a lower precision (TTS_DTYPE, or degrade mode's action); the rest stays at fp32. In fp16 the
# duration predictor's spline flow raised "Discriminant has negative values" on an H200, and a duration rounded
# differently changes an item's length: the duration predictor, the flow and the speaker embedding stay at fp32.
LOWER_PARTS = ("text_encoder.encoder", "decoder")


def _vits_voices(specs: Sequence[VoiceSpec], sample_rate: int) -> list[Voice]:
    return [Voice(spec.name, "vits", spec.language or "und", sample_rate,
                  None if spec.speaker is None else str(spec.speaker), spec.speed) for spec in specs]


def describe_vits(source: str, specs: Sequence[VoiceSpec]) -> list[Voice]:
    """A model's voices from its config alone (no weights loaded): this also checks, at start-up,
    that every configured model is there."""
    with loading_model(source):
        config = VitsConfig.from_pretrained(source, local_files_only=hub_offline())
    return _vits_voices(specs, int(config.sampling_rate))


class _VocoderMask:
    """Before each convolution of the vocoder, zero the activations past each item's last frame,
    as a lone item's zero padding would be (the spectrogram is already zero there: the model
    masks it, which is also how its lengths are read here)."""

    def __init__(self, vocoder: nn.Module):
        self.lengths: torch.Tensor | None = None
        self.frames = 0
        vocoder.register_forward_pre_hook(self._start)
        for module in vocoder.modules():
            if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)):
                module.register_forward_pre_hook(self._mask)

    def _start(self, _module: nn.Module, args: tuple) -> None:
        spectrogram = args[0]
        self.frames = spectrogram.shape[-1]
        if spectrogram.shape[0] == 1:
            self.lengths = None
            return
        voiced = spectrogram.abs().sum(dim=1) > 0
        positions = torch.arange(1, self.frames + 1, device=spectrogram.device)
        self.lengths = (voiced * positions).amax(dim=1)

    def _mask(self, _module: nn.Module, args: tuple) -> tuple | None:
        hidden = args[0]
        steps = hidden.shape[-1]
        if self.lengths is None or steps < self.frames or steps % self.frames:
            return None  # alone, or not on the time axis (the speaker conditioning)
        keep = torch.arange(steps, device=hidden.device)[None, :] < (self.lengths * (steps // self.frames))[:, None]
        return (hidden * keep[:, None, :].to(hidden.dtype), *args[1:])


def _cast(value, dtype: torch.dtype):
    """Floating tensors in value (a tensor, a tuple or list, a model output) as dtype; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(item, dtype) for item in value)
    if isinstance(value, dict):  # a transformers ModelOutput: set in place (it keeps its keys and attributes)
        for key, item in value.items():
            value[key] = _cast(item, dtype)
    return value


class _PartPrecision:
    """A part of the model at a precision of its own: its floating inputs are cast to its weights' dtype, its
    outputs back to fp32, so the parts around it never see the lower precision."""

    def __init__(self, part: nn.Module, full: torch.dtype):
        """full: its precision outside degrade mode (TTS_DTYPE)."""
        self.part, self.full = part, full
        self.dtype = full
        part.to(dtype=full)
        self._full_weights: dict[str, torch.Tensor] | None = None  # its weights at full while it runs lower
        part.register_forward_pre_hook(self._inputs, with_kwargs=True)
        part.register_forward_hook(self._outputs)

    def use(self, dtype: torch.dtype) -> None:
        """Its weights at dtype; back at full, the very weights it had (not the lower ones widened)."""
        if dtype == self.dtype:
            return
        if self._full_weights is None:
            self._full_weights = self.part.state_dict()  # the tensors themselves: `to` swaps new ones in
        self.part.to(dtype=dtype)
        if dtype == self.full:
            self.part.load_state_dict(self._full_weights)
            self._full_weights = None
        self.dtype = dtype

    def _inputs(self, _module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return _cast(args, self.dtype), _cast(kwargs, self.dtype)

    def _outputs(self, _module: nn.Module, _args: tuple, output):
        return _cast(output, torch.float32)


@dataclass(frozen=True)
class _Prepared:
    batch: Sequence[EngineInput]
    input_ids: torch.Tensor  # on the device (its copy may still run)
    attention_mask: torch.Tensor


@dataclass(frozen=True)
class _Running:
    batch: Sequence[EngineInput]
    waveform: torch.Tensor  # on the host (on CUDA, pinned and filled once `done`)
    frames: torch.Tensor  # each token's frames, on the host likewise
    done: torch.cuda.Event | None  # recorded after the copies (CUDA)
    dtype: torch.dtype  # the lowered parts' precision it ran at


class VitsEngine(DeviceMemory, OneShotEngine):
    capabilities = Capabilities(times_words=True)
    lower_precision_parts = LOWER_PARTS

    def __init__(self, source: str, voices: Sequence[VoiceSpec], device: str = "auto", dtype: str = "fp32",
                 noise_scale: float | None = None, noise_scale_duration: float | None = None,
                 name: str | None = None, low_dtype: str | None = None):
        """source: a hub id or a local folder; voices: the registry's voices on this model. dtype: LOWER_PARTS'
        precision (the rest runs at fp32); low_dtype: theirs in degrade mode's lower precision (None: the device's
        LOW_PRECISION; on a CPU, where half-precision convolutions run slower, none unless asked, as tests do)."""
        self.source = source
        self.name = name or source.rstrip("/").rsplit("/", 1)[-1]
        self.device = resolve_device(device)
        self.dtype = DTYPES[dtype]
        if self.dtype != torch.float32 and self.device == "cpu":
            raise EngineUnavailable(f"{self.name}: {dtype} needs CUDA; use fp32 on the CPU")
        low_dtype = low_dtype or LOW_PRECISION.get(self.device)
        self.low_dtype = DTYPES[low_dtype] if low_dtype and DTYPES[low_dtype] != self.dtype else None
        with loading_model(source):
            self.tokenizer = VitsTokenizer.from_pretrained(source, local_files_only=hub_offline())
            self.model = VitsModel.from_pretrained(source, local_files_only=hub_offline())
        self.model.to(self.device).eval()
        _VocoderMask(self.model.decoder)
        self._parts = [_PartPrecision(self.model.get_submodule(path), self.dtype) for path in LOWER_PARTS]
        self._wanted_dtype = self.dtype
        self._log_durations: tuple[torch.Tensor, torch.Tensor] | None = None  # the last call's, with its mask
        self.model.duration_predictor.register_forward_hook(self._keep_log_durations)
        self.hop_length = int(np.prod(self.model.config.upsample_rates))
        if noise_scale is not None:
            self.model.noise_scale = noise_scale
        if noise_scale_duration is not None:
            self.model.noise_scale_duration = noise_scale_duration
        self.sample_rate = int(self.model.config.sampling_rate)
        self.pad_id = int(self.tokenizer.pad_token_id or 0)
        self._speakers = {spec.name: spec.speaker for spec in voices}
        self._voices = _vits_voices(voices, self.sample_rate)

    def voices(self) -> list[Voice]:
        return list(self._voices)

    def tokenize(self, text: str, voice: str) -> list[np.ndarray]:
        ids = self.tokenizer(as_text(text))["input_ids"]  # a pronunciation: its respelling, else its word
        return [np.asarray(ids, dtype=np.int64)] if len(ids) else []

    def _units(self, ids: np.ndarray) -> list[str]:
        """The characters (or phonemes) that ids spell, without the blanks interspersed between them."""
        return self.tokenizer.convert_ids_to_tokens((ids[1::2] if self.tokenizer.add_blank else ids).tolist())

    def tokenize_words(self, text: str, voice: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """Characters map to words by tts_core.engines.alignment.unit_words (the characters between spaces
        are a word). A pronunciation's respelling can be several words: all are its span's one word,
        as unit_words finds by saying each word alone. The blank after a character is its word's; the
        first blank is no word's."""
        tokenized = self.tokenize(text, voice)
        if not tokenized:
            return []
        ids = tokenized[0]
        labels = unit_words(self._units(ids), words(text),
                            lambda word: self._units(np.asarray(self.tokenizer(as_text(word))["input_ids"])))
        owners = np.concatenate([[-1], np.repeat(labels, 2)]) if self.tokenizer.add_blank else labels
        return [(ids, owners.astype(np.int64))]

    def batch_key(self, voice: str, speed: float) -> Hashable:
        return (self.name, self._speakers.get(voice), speed)

    def set_low_precision(self, enabled: bool) -> bool:
        """LOWER_PARTS at low_dtype (or back at dtype) from the next batch on, never under a running one."""
        if self.low_dtype is None:
            return False
        self._wanted_dtype = self.low_dtype if enabled else self.dtype
        return True

    @property
    def pipelines(self) -> bool:
        return self.device == "cuda"  # (on a CPU nothing runs while the host goes on)

    def synthesize(self, batch: Sequence[EngineInput]) -> list[EngineOutput]:
        return self.finish(self.run(self.prepare(batch)))

    def prepare(self, batch: Sequence[EngineInput]) -> _Prepared:
        """Ids padded with the pad id, and the attention mask, in pinned memory on CUDA, their copies started."""
        longest, pinned = max(item.length for item in batch), self.device == "cuda"
        input_ids = torch.full((len(batch), longest), self.pad_id, dtype=torch.long, pin_memory=pinned)
        attention_mask = torch.zeros((len(batch), longest), dtype=torch.long, pin_memory=pinned)
        for row, item in enumerate(batch):
            input_ids[row, : item.length] = torch.from_numpy(item.tokens)
            attention_mask[row, : item.length] = 1
        return _Prepared(batch, input_ids.to(self.device, non_blocking=True),
                         attention_mask.to(self.device, non_blocking=True))

    @torch.inference_mode()
    def run(self, prepared: _Prepared) -> _Running:
        """The model on the batch; its audio and durations copied back without waiting (on CUDA)."""
        for part in self._parts:
            part.use(self._wanted_dtype)
        first = prepared.batch[0]
        output = self.model(input_ids=prepared.input_ids, attention_mask=prepared.attention_mask,
                            speaker_id=self._speakers.get(first.voice), speaking_rate=first.speed)
        waveform, frames = self._to_host(output.waveform.float()), self._to_host(self._frames(first.speed))
        done = torch.cuda.Event() if self.device == "cuda" else None
        if done is not None:
            done.record()
        return _Running(prepared.batch, waveform, frames, done, self._wanted_dtype)

    def finish(self, running: _Running) -> list[EngineOutput]:
        """Each item trimmed to exactly its tokens' samples, and peak-normalized."""
        if running.done is not None:
            running.done.synchronize()
        waveform = running.waveform.numpy()
        if running.dtype != torch.float32 and not np.isfinite(waveform).all():
            raise FloatingPointError(f"{self.name} made audio that is not finite at {running.dtype}")
        durations = running.frames.numpy() * self.hop_length
        spans = [durations[row, : item.length] for row, item in enumerate(running.batch)]
        return [EngineOutput(peak_normalize(waveform[row, : int(samples.sum())]), samples)
                for row, samples in enumerate(spans)]

    def _to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.device != "cuda":
            return tensor
        return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True).copy_(tensor, non_blocking=True)

    def _keep_log_durations(self, _module: nn.Module, args: tuple, log_durations: torch.Tensor) -> None:
        self._log_durations = (log_durations, args[1])

    def _frames(self, speed: float) -> torch.Tensor:
        """Frames of each token of the last batch (times the vocoder's hop: its samples): VitsModel.forward's own
        durations, recomputed from its duration predictor's output with the same operations (so they are equal,
        as are their sums and the model's sequence_lengths)."""
        log_durations, padding_mask = self._log_durations
        frames = torch.ceil(torch.exp(log_durations) * padding_mask * (1.0 / speed))  # as VitsModel.forward
        return frames[:, 0].long()
