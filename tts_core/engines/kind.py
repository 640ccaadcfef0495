"""What an engine kind declares: the kind a registry entry names (`engine: vits`), its entry's options (a pydantic
model whose `engine` is the kind's name), and how a model of it is described (its voices and capabilities, without
loading it) and loaded. Each kind is one module of tts_core.engines.kinds, which collects them; the registry file's
entry (tts_core.voices.registry) is the union of their options, told apart by `engine`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from .base import DEFAULT_MAX_RUNNING, Engine, Voice, VoiceSpec
from .contract import Capabilities

if TYPE_CHECKING:  # engines load without the settings package (bench/gpu_check runs on bare machines)
    from ..config import Settings

Loader = Callable[[], Engine]
Described = tuple[list[Voice], Capabilities, Loader]

# how to install what a model kind needs, by the package found missing (the bundled Piper voice needs none of it)
TORCH_HINT = "pip install torch==2.13.0; the README says how to get the CPU or the CUDA build"


class VoiceOptions(BaseModel):
    """A registry voice: what every kind's entry may say. A kind's own options subclass it, with `engine` its name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: str
    model: str = Field(min_length=1, description="hub id or local path")
    language: str | None = Field(None, description="language code; default: the model's own")
    speaker: int | None = Field(None, ge=0, description="speaker id of a multi-speaker model")
    speed: float = Field(1.0, ge=0.25, le=4.0, description="default speed")
    pinned: bool = Field(False, description="load and warm at start-up and never unload")
    language_default: bool = Field(False, description="the voice of its language: what a request naming that "
                                   "language and no voice gets (TTS_LANGUAGE_VOICES overrides it)")
    # a name with a star stands for one voice for each name the kind lists (EngineKind.lists): the field the listed
    # name sets, and how (its format); None where the kind lists none
    listed_as: ClassVar[tuple[str, str] | None] = None

    @property
    def server(self) -> str | None:
        """Where the model runs, where that is another server (voices of one model and server share an engine)."""
        return None

    def voice_spec(self, name: str) -> VoiceSpec:
        return VoiceSpec(name, self.language, self.speaker, self.speed)


class PromptedVoiceOptions(VoiceOptions):
    """A voice made from a prompt file (Kokoro's voice packs, the stepped models' voice prompts)."""

    prompt: str | None = Field(None, min_length=1, description="voice prompt: .safetensors latents or an audio "
                               "clip (pocket_tts, vibevoice), a voice pack .pt (kokoro); relative to the model "
                               "folder")

    def voice_spec(self, name: str) -> VoiceSpec:
        return replace(super().voice_spec(name), prompt=self.prompt)


class SteppedVoiceOptions(PromptedVoiceOptions):
    """A stepped model's voice; its model-level options (any of the model's voices may set them)."""

    fixed_length: bool = Field(False, description="every request makes its whole frame budget (random-weight "
                               "benchmark models)")
    max_running: int | None = Field(None, ge=1, le=1024, description="the most requests running at once")
    step_mode: Literal["auto", "eager", "compiled"] | None = Field(
        None, description="the step: eager, compiled per running-set bucket at load (checked against eager, "
        "eager if it fails), or auto (compiled on CUDA, eager on the CPU); default auto")

    def voice_spec(self, name: str) -> VoiceSpec:
        return replace(super().voice_spec(name), fixed_length=self.fixed_length, max_running=self.max_running,
                       step_mode=self.step_mode)


@dataclass(frozen=True)
class EngineKind:
    """One kind of engine, as its module declares it. describe(model, its entries by voice name, a unique name,
    settings) -> the voices described, what the model can do, and a loader: nothing is loaded, and what a kind
    imports to load its model it imports in the loader (kokoro's import reads spaCy, seconds)."""

    options: type[VoiceOptions]
    describe: Callable[[str, dict[str, Any], str, Settings], Described]
    lists: Callable[[str, dict[str, Any]], list[str]] | None = None  # the names a star stands for (asked at once)
    install_hints: Mapping[str, str] = field(default_factory=dict)  # by missing package; else TORCH_HINT

    @property
    def name(self) -> str:
        """What a registry entry writes as `engine:` (its options' Literal)."""
        return get_args(self.options.model_fields["engine"].annotation)[0]

    def install_hint(self, package: str | None) -> str:
        return self.install_hints.get(package or "", TORCH_HINT)


def voice_specs(entries: dict[str, VoiceOptions]) -> list[VoiceSpec]:
    return [entry.voice_spec(name) for name, entry in entries.items()]


def stepped_options(voices: list[VoiceSpec]) -> dict:
    """A stepped model's model-level options: any voice of the model may set them."""
    options: dict = dict(fixed_length=any(voice.fixed_length for voice in voices))
    max_running = [voice.max_running for voice in voices if voice.max_running]
    options["max_running"] = max(max_running) if max_running else DEFAULT_MAX_RUNNING
    options["step_mode"] = next((voice.step_mode for voice in voices if voice.step_mode), "auto")
    return options


def stepped_torch_kind(engine_module: Callable[[], tuple[type, Callable]]) -> Callable[..., Described]:
    """The description of a stepped transformers model (Pocket TTS, VibeVoice): `engine_module()` imports its
    engine class and the function describing its voices (torch and transformers: only once the registry names
    the kind)."""
    def describe(model: str, entries: dict[str, SteppedVoiceOptions], name: str, settings: Settings
                 ) -> Described:
        engine, describe_voices = engine_module()
        voices = voice_specs(entries)
        options = stepped_options(voices)
        capabilities = replace(engine.kind_capabilities, max_running=options["max_running"])
        return describe_voices(model, voices), capabilities, torch_loader(
            settings, lambda: engine(model, voices, settings.device, settings.dtype, name=name, **options))

    return describe


def torch_loader(settings: Settings, load: Loader) -> Loader:
    """load, with torch's CPU threads set first where TTS_TORCH_THREADS says (process-wide, as torch has
    it); else torch's own, one a core (a Pocket TTS server served more with a thread a core than with one
    thread, even with the load generator on the same cores: docs/configuration.md)."""
    def loaded() -> Engine:
        if settings.torch_threads:
            import torch

            torch.set_num_threads(settings.torch_threads)
        return load()

    return loaded
