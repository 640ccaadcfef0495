"""Model families behind the engine contract (tts_core.engines.contract), one kind each (tts_core.engines.kinds),
and what a configured model is before it loads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .base import Engine, EngineUnavailable, Voice, VoiceSpec
from .contract import Capabilities


@dataclass(eq=False)
class ModelSpec:
    """A configured model: its name, the voices it speaks and what it can do (known before it is loaded), how to
    load it, and whether it stays loaded (pinned) or loads when first asked for."""

    name: str
    voices: list[Voice]
    load: Callable[[], Engine]
    pinned: bool = True
    source: tuple = field(default=())  # what it was configured from: equal sources, same model
    registry: bool = False  # from the registry file (reloadable), not the voices folder
    language_defaults: tuple[str, ...] = ()  # its voices that are their language's voice (the registry says)
    capabilities: Capabilities = Capabilities()

    @staticmethod
    def loaded(engine: Engine) -> ModelSpec:
        return ModelSpec(engine.name, engine.voices(), lambda: engine, pinned=True, source=(id(engine),),
                         capabilities=engine.capabilities)


__all__ = ["Capabilities", "Engine", "EngineUnavailable", "ModelSpec", "Voice", "VoiceSpec"]
