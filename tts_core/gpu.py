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


def free_memory_mb() -> float | None:
    """Free memory of the emptiest-used GPU in MiB, or None without a GPU."""
    pynvml = _nvml()
    if pynvml is None:
        return None
    try:
        frees = [
            pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).free
            for index in range(pynvml.nvmlDeviceGetCount())
        ]
    except Exception as error:
        log.warning("NVML reading failed: %s", error)
        return None
    return max(frees) / 2**20
