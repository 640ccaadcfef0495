"""The engine kinds the registry file names, one module each in this package: each module's KIND (an EngineKind,
tts_core.engines.kind) says its registry options, how a model of it is described and how it loads. A new kind is a
new module here (and its entry in the engine contract test's kinds); nothing else names it.

The modules are light: what loads a model (torch, transformers, kokoro) is imported when one is described or loaded,
so the registry file is read, and its faults named, on a machine that has none of it.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..kind import EngineKind


def _collected() -> dict[str, EngineKind]:
    kinds = [importlib.import_module(f"{__name__}.{module.name}").KIND for module in pkgutil.iter_modules(__path__)]
    return {kind.name: kind for kind in kinds}


KINDS: dict[str, EngineKind] = _collected()  # by name, in the modules' order

__all__ = ["KINDS", "EngineKind"]
