"""Device memory readings through NVML. No NVML or no GPU is a normal state: readings are None."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)

_lock = threading.Lock()
_state: dict[str, object] = {}


def _nvml():
    """The initialised pynvml module, or None where there is no NVML (cached after the first try)."""
    with _lock:
        if "module" not in _state:
            try:
                import pynvml

                pynvml.nvmlInit()
                _state["module"] = pynvml if pynvml.nvmlDeviceGetCount() > 0 else None
            except Exception as error:  # no library, no driver, no device: all mean "no GPU"
                log.info("no NVIDIA GPU visible (%s); GPU readings are null", error)
                _state["module"] = None
        return _state["module"]


def readings() -> dict | None:
    """Memory and utilisation of the GPU with the most free memory, or None without a GPU."""
    pynvml = _nvml()
    if pynvml is None:
        return None
    try:
        best = None
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            if best is None or memory.free > best[1].free:
                best = (handle, memory)
        handle, memory = best
        utilization = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
    except Exception as error:
        log.warning("NVML reading failed: %s", error)
        return None
    return {"free_mb": round(memory.free / 2**20, 1), "total_mb": round(memory.total / 2**20, 1),
            "used_fraction": round(memory.used / memory.total, 4) if memory.total else None,
            "utilization_pct": utilization}


def free_memory_mb() -> float | None:
    reading = readings()
    return reading["free_mb"] if reading else None
