"""A model's calibration kept across restarts: what it is keyed by, and where it is kept.

The calibration sweep (tts_core.scheduler.one_shot) times batches of several sizes at two lengths; the batch
policy's cost model is seeded by those rows. They hold for one model, run with the settings its timings depend on
(its precision, the batch policy and its bounds, the copies of the model), on one machine (its platform, the cores
it may use, the threads its runtimes use, the device). A kept calibration under the same key is reused at the next
start, so the server is ready in about the time its model takes to load; the sweep then runs again in the
background, while the engine is idle, and what it measures replaces what was kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from typing import Protocol

Row = tuple[int, int, float]  # batch size, padded tokens, seconds


class CalibrationStore(Protocol):
    """Where calibrations are kept (storage.calibrations.Calibrations): both calls may raise; the loop logs it and
    goes on as if nothing were kept."""

    def load(self, key: str) -> list[Row] | None: ...

    def save(self, key: str, described: dict, rows: list[Row]) -> None: ...


def machine() -> dict:
    """The machine, as the timings depend on it."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    described = {"platform": platform.platform(), "processor": platform.machine(), "cpu_count": os.cpu_count(),
                 "usable_cores": cores, "python": platform.python_version()}
    torch = sys.modules.get("torch")  # only where an engine uses it (then it is imported already)
    if torch is not None:
        described["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            described["cuda_device"] = torch.cuda.get_device_name()
    onnxruntime = sys.modules.get("onnxruntime")
    if onnxruntime is not None:
        described["onnxruntime"] = onnxruntime.__version__
    return described


def calibration_key(model: str, settings: dict) -> tuple[str, dict]:
    """The key a model's calibration is kept under, and what it is the key of (kept beside it, for people)."""
    described = {"model": model, "settings": settings, "machine": machine()}
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest(), described
