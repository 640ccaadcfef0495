"""What the torch stepped engines (Pocket TTS, VibeVoice) share: where their voice prompts are,
the slot cache of their backbones, their voice tables, their noise generator, and device memory."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import GenerationConfig

from ..errors import voice_deleted
from .base import EngineUnavailable, SteppedEngine, Voice, VoiceSpec
from .contract import Capabilities, EngineInput, Shape, WholeBatch
from .pocket_codec import read_clip
from .static_step import StepRunner
from .torch_support import DTYPES, resolve_device

DEFAULT_VOICE = "default"  # the shipped voice a registry voice without a prompt speaks with


# --- where a model's voices are -------------------------------------------------------------------


def voice_files(folder: Path, specs: Sequence[VoiceSpec]) -> dict[str, Path]:
    """Voice name -> the file of its prompt: a registry voice's `prompt` (relative to the model folder),
    else the shipped voice of its name (`<folder>/voices/NAME.safetensors`), else the shipped default; a
    voice with no prompt also lists every shipped voice under its file's name."""
    shipped = {path.stem: path for path in sorted((folder / "voices").glob("*.safetensors"))}
    files: dict[str, Path] = {}
    lists_shipped = not specs
    for spec in specs:
        if spec.prompt:
            files[spec.name] = folder / Path(spec.prompt).expanduser()  # an absolute prompt stays as it is
        elif spec.name in shipped:
            files[spec.name] = shipped[spec.name]
        elif shipped:
            files[spec.name] = shipped.get(DEFAULT_VOICE, next(iter(shipped.values())))
            lists_shipped = True
        else:
            raise FileNotFoundError(f"voice {spec.name!r} has no prompt and the model ships no voices/*.safetensors")
    for name, path in shipped.items() if lists_shipped else ():
        files.setdefault(name, path)
    missing = sorted(str(path) for path in files.values() if not path.is_file())
    if missing:
        raise FileNotFoundError(f"no voice prompt file {', '.join(missing)}")
    return files


def prompted_voices(kind: str, language: str, names: Sequence[str], specs: Sequence[VoiceSpec],
                    sample_rate: int) -> list[Voice]:
    """Voice-prompted models have no speaking-rate input. A voice speaks the model's language unless the
    registry names another (the text front end reads numbers and dates for it)."""
    languages = {spec.name: spec.language for spec in specs}
    return [Voice(name, kind, languages.get(name) or language, sample_rate, speed_control=False) for name in names]


def generation_values(model, defaults: dict) -> dict:
    """The model's generation config's values for these keys, the defaults where it sets none."""
    generation = model.generation_config or GenerationConfig()
    return {key: default if getattr(generation, key, None) is None else getattr(generation, key)
            for key, default in defaults.items()}


# --- the cache ------------------------------------------------------------------------------------


class SlotCache:
    """The backbone's key/value cache, one row per running sequence, each at its own position: given to
    the model as `past_key_values`, whose attention calls `update` once per layer. Running sequences
    hold rows 0..n-1 (a release moves the last row into the freed one), so a step attends over the
    view `[:n, :, :longest]`, never a gather. The length dimension doubles when a longer request joins."""

    def __init__(self, config, rows: int, dtype: torch.dtype, device: str):
        self.layers, self.rows, self.dtype, self.device = config.num_hidden_layers, rows, dtype, device
        self.heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.bytes_per_token = 2 * self.layers * self.heads * self.head_dim * torch.finfo(dtype).bits // 8
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.capacity = 0
        self._prefill_rows = slice(0, 0)  # a prefill: the joiners' rows
        self._starts: torch.Tensor | None = None  # a prefill after cached prefixes: where each row's input starts
        self._positions: torch.Tensor | None = None  # a step: where each row writes; None: a prefill
        self._read = 0  # a step: the positions attended (the longest row's, plus the new one)

    def reserve(self, length: int, rows_in_use: int) -> None:
        """Room for `length` positions per row, keeping the rows in use."""
        if length <= self.capacity:
            return
        capacity = 1 << max(6, (length - 1).bit_length())
        shape = (self.rows, self.heads, capacity, self.head_dim)
        keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.layers)]
        values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.layers)]
        for new, old in zip(keys + values, self.keys + self.values):
            new[:rows_in_use, :, : self.capacity] = old[:rows_in_use]
        self.keys, self.values, self.capacity = keys, values, capacity

    def clear(self) -> None:
        self.keys, self.values, self.capacity = [], [], 0

    def start_prefill(self, first_row: int, count: int, stride: int = 1, starts: torch.Tensor | None = None) -> None:
        """The next forward prefills `count` sequences into rows first_row, first_row + stride, ..., each from
        position 0, or each from its `starts` (the positions its row already holds: put_prefix)."""
        self._prefill_rows = slice(first_row, first_row + count * stride, stride)
        self._positions, self._starts = None, starts

    def put_prefix(self, row: int, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """A cached prefix (per layer: heads x length x dim, as `prefix` gives it) into a row's first positions."""
        length = keys[0].shape[1]
        for layer, (key, value) in enumerate(zip(keys, values, strict=True)):
            self.keys[layer][row, :, :length] = key
            self.values[layer][row, :, :length] = value

    def prefix(self, row: int, length: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """A copy of a row's first `length` positions, per layer."""
        return ([key[row, :, :length].clone() for key in self.keys],
                [value[row, :, :length].clone() for value in self.values])

    def start_step(self, positions: torch.Tensor, read: int) -> None:
        self._positions, self._read = positions, read

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if self._positions is None and self._starts is None:  # prefill (right-padded) from position 0
            keys[self._prefill_rows, :, : key_states.shape[2]] = key_states
            values[self._prefill_rows, :, : value_states.shape[2]] = value_states
            return key_states, value_states
        if self._positions is None:  # prefill (right-padded) after each row's cached prefix
            rows, length = self._prefill_rows, key_states.shape[2]
            indices = torch.arange(rows.start, rows.stop, rows.step, device=keys.device)[:, None]
            at = self._starts[:, None] + torch.arange(length, device=keys.device)[None]
            keys[indices, :, at] = key_states.transpose(1, 2)
            values[indices, :, at] = value_states.transpose(1, 2)
            read = int(self._starts.max()) + length
            return keys[rows, :, :read], values[rows, :, :read]
        count = key_states.shape[0]
        rows = torch.arange(count, device=keys.device)
        keys[rows, :, self._positions] = key_states[:, :, 0]
        values[rows, :, self._positions] = value_states[:, :, 0]
        return keys[:count, :, : self._read], values[:count, :, : self._read]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._read

    def move(self, source: int, target: int, length: int) -> None:
        for tensor in self.keys + self.values:
            tensor[target, :, :length] = tensor[source, :, :length]


# --- the engine -----------------------------------------------------------------------------------


class TorchSteppedEngine(SteppedEngine):
    """A stepped engine on torch with voice prompts. Subclasses keep `_rows` (running inputs by cache
    row, each with its `length` and the `voice` prompt it was admitted with), `_running` (the same, by input id,
    in the order they joined) and
    `_cache` (a SlotCache); they say which modules hold their weights (`_weights`), how wide a voice
    prompt's latents are (`_prompt_width`) and how a clip becomes a prompt (`voice_prompt_from_audio`)."""

    kind_capabilities = Capabilities(shape=Shape.STEPPED, clones=True)  # its voices are prompts: a clip makes one
    out_of_memory_errors = (MemoryError, torch.cuda.OutOfMemoryError)
    model_kind: str  # what its voices name as their model
    model_language: str  # what its voices speak unless the registry says otherwise
    prompt_key: str  # the tensor a voice file holds: (frames, width)
    _cache: SlotCache
    _runner: StepRunner  # runs the step: eager, or compiled per bucket (static_step.py)

    def _place(self, source: str, device: str, dtype: str, name: str | None, seed: int | None) -> None:
        """Name, device, precision, the noise generator (the engine's own: the global one stays as it is)."""
        self.source, self.name = source, name or source.rstrip("/").rsplit("/", 1)[-1]
        self.device, self.dtype = resolve_device(device), DTYPES[dtype]
        if self.dtype != torch.float32 and self.device == "cpu":
            raise EngineUnavailable(f"{self.name}: {dtype} needs CUDA; use fp32 on the CPU")
        self._generator = torch.Generator(device=self.device)
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)
        self._specs: list[VoiceSpec] = []
        self._prompts: dict[str, torch.Tensor] = {}
        self._voices: list[Voice] = []
        self._rows: list = []
        self._running: dict[int, object] = {}

    def _weights(self) -> list[torch.nn.Module]:
        raise NotImplementedError

    def _prompt_width(self) -> int:
        raise NotImplementedError

    def voice_prompt_from_audio(self, audio: np.ndarray, sample_rate: int) -> np.ndarray:
        raise NotImplementedError

    # --- voices ---------------------------------------------------------------------------------

    def voices(self) -> list[Voice]:
        return list(self._voices)

    def batch_key(self, voice: str, speed: float) -> Hashable:
        return self.name  # any voices run together, and there is no speaking rate

    def _read_prompt(self, path: Path) -> np.ndarray:
        """A voice file: .safetensors latents, else an audio clip (encoded now)."""
        if path.suffix == ".safetensors":
            return load_file(str(path))[self.prompt_key].float().numpy()
        return self.voice_prompt_from_audio(read_clip(path, self.sample_rate), self.sample_rate)

    def add_voice(self, name: str, latents: np.ndarray, transcript: str | None = None) -> Voice:
        """Offer (or replace) a voice with this prompt, latents (frames, width); the clip's transcript is not
        needed. Any thread may call it (and remove_voice): the tables are swapped whole, and requests already
        running keep their voice."""
        prompt = torch.as_tensor(np.asarray(latents, dtype=np.float32))
        width = self._prompt_width()
        if prompt.ndim != 2 or prompt.shape[0] == 0 or prompt.shape[1] != width:
            raise ValueError(f"a voice prompt is (frames, {width}), not {tuple(prompt.shape)}")
        voice = prompted_voices(self.model_kind, self.model_language, [name], self._specs, self.sample_rate)[0]
        self._prompts = {**self._prompts, name: prompt.to(self.device)}
        self._voices = [known for known in self._voices if known.name != name] + [voice]
        return voice

    def remove_voice(self, name: str) -> None:
        self._prompts = {known: prompt for known, prompt in self._prompts.items() if known != name}
        self._voices = [known for known in self._voices if known.name != name]

    def _voice_prompt(self, item: EngineInput) -> torch.Tensor:
        """A running item's voice prompt is the one it was admitted with (a voice deleted or given a new prompt
        meanwhile: it goes on as it began); another's is its voice's now, and a voice no longer offered (deleted
        while the item waited) refuses it alone, with a 400 voice_not_found."""
        run = self._running.get(item.id)
        if run is not None:
            return run.voice
        prompt = self._prompts.get(item.voice)
        if prompt is None:
            raise voice_deleted(self.name, item.voice)
        return prompt

    # --- running --------------------------------------------------------------------------------

    def running(self) -> list[int]:
        return list(self._running)

    def step_status(self) -> dict:
        """How the step runs (eager or compiled, and why), and what compiling took, by bucket@capacity."""
        return self._runner.describe()

    def context_length(self, item_id: int) -> int:
        return self._running[item_id].length

    # --- device memory --------------------------------------------------------------------------

    def measure_memory(self, tokens, run: WholeBatch, sizes: Sequence[int] = (1, 4)) -> None:
        """CUDA only: the peak bytes a batch takes beyond the cache (whose bytes are kv_bytes_per_token),
        per context position, each batch run whole by `run` (the stepped strategy's)."""
        if self.device != "cuda":
            return
        voice = self._voices[0].name
        batches = [[EngineInput(tokens, voice) for _ in range(size)] for size in sizes]
        run(batches[-1])  # the cache grows to these lengths first
        per_token = []
        for batch in batches:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            run(batch)
            torch.cuda.synchronize()
            per_token.append((torch.cuda.max_memory_allocated() - before) / sum(map(self.context_tokens, batch)))
        self.bytes_per_padded_token = max(per_token)

    def free_memory_bytes(self) -> int | None:
        if self.device != "cuda":
            return None
        free, _ = torch.cuda.mem_get_info()
        return free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()

    def release_memory(self) -> None:
        """With nothing running, the cache goes too (the next admission makes one to its size)."""
        if not self._rows:
            self._cache.clear()
        if self.device == "cuda":
            torch.cuda.empty_cache()

    def memory_bytes(self) -> int:
        tensors = [tensor for module in self._weights() for tensor in [*module.parameters(), *module.buffers()]]
        return sum(tensor.numel() * tensor.element_size() for tensor in tensors)
