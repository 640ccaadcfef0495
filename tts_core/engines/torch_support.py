"""What every torch engine (VITS, Kokoro, Pocket TTS, VibeVoice) shares: where a model is and how a failure to
read it is told, the device and precisions it runs at, and a one-shot engine's device memory."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .base import EngineUnavailable
from .contract import EngineInput

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE is set: models come from the local cache alone."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


@contextmanager
def loading_model(source: str) -> Iterator[None]:
    """Any failure to read a model becomes one clear error that names it."""
    try:
        yield
    except Exception as error:  # missing files, a wrong folder, a hub id not in the cache when offline
        hint = " (HF_HUB_OFFLINE is set: only the local cache is searched)" if hub_offline() else ""
        raise EngineUnavailable(f"model {source!r} could not be loaded{hint}: {error}") from None


def model_folder(source: str, patterns: list[str] | None = None) -> Path:
    """A local folder as is; a hub id from the local cache (or the hub, unless HF_HUB_OFFLINE)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.is_absolute() or source.startswith((".", "~")):
        raise FileNotFoundError(f"no folder {source}")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(source, allow_patterns=patterns, local_files_only=hub_offline()))


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise EngineUnavailable("TTS_DEVICE=cuda, but CUDA is not available on this machine")
    return device


class DeviceMemory:
    """Device memory of a torch one-shot engine (VITS, Kokoro) with `device`, `model`, `_voices` and `synthesize`:
    on CUDA a memory model (peak bytes per padded token, measured at warm-up) that the batcher asks for a token
    budget."""

    out_of_memory_errors = (MemoryError, torch.cuda.OutOfMemoryError)
    device: str
    model: nn.Module
    bytes_per_padded_token: float | None = None

    def measure_memory(self, tokens: np.ndarray, sizes: Sequence[int] = (1, 4)) -> None:
        """Peak bytes per padded token over a few batch sizes (CUDA only): the memory model."""
        if self.device != "cuda":
            return
        per_token = []
        for size in sizes:
            items = [EngineInput(tokens, self._voices[0].name) for _ in range(size)]
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            self.synthesize(items)
            torch.cuda.synchronize()
            per_token.append((torch.cuda.max_memory_allocated() - before) / (size * tokens.size))
        self.bytes_per_padded_token = max(per_token)

    def free_memory_bytes(self) -> int | None:
        if self.device != "cuda":
            return None
        free, _ = torch.cuda.mem_get_info()
        return free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()  # the cache is ours to reuse

    def release_memory(self) -> None:
        if self.device == "cuda":
            torch.cuda.empty_cache()

    def memory_bytes(self) -> int:
        tensors = [*self.model.parameters(), *self.model.buffers()]
        return sum(tensor.numel() * tensor.element_size() for tensor in tensors)
