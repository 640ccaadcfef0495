"""Model families behind the one `Engine` interface, and what is configured to load."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .base import DEFAULT_MAX_RUNNING, Capabilities, Engine, EngineUnavailable, Voice, VoiceSpec, capabilities_of

if TYPE_CHECKING:  # engines load without the settings package (bench/gpu_check runs on bare machines)
    from ..config import Settings

log = logging.getLogger(__name__)


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
                         capabilities=capabilities_of(engine))


def model_specs(settings: Settings) -> list[ModelSpec]:
    """The bundled Piper voice and the voices folder (loaded now, always kept), then the registry's
    models (TTS_VOICES_FILE), read but loaded only when pinned or first asked for. A registry model
    that is not there stops the start with a message that names it."""
    from .piper import load_piper_engines

    folder = load_piper_engines(settings.voices_path, **_piper_options(settings))
    return [ModelSpec.loaded(engine) for engine in folder] + registry_specs(settings, {e.name for e in folder})


def load_voice_engine(settings: Settings, voice: str) -> Engine:
    """The configured model that speaks `voice`, loaded on its own (no server: the benchmarks)."""
    specs = model_specs(settings)
    for spec in specs:
        if voice in {known.name for known in spec.voices}:
            return spec.load()
    known = sorted(known.name for spec in specs for known in spec.voices)
    raise EngineUnavailable(f"no configured model speaks the voice {voice!r}; configured: {', '.join(known)}")


def _piper_kind(model: str, voices: list[VoiceSpec], name: str, settings: Settings) -> Described:
    from .piper import PiperEngine, describe_piper

    described, capabilities = describe_piper(model, voices, name)
    return described, capabilities, lambda: PiperEngine(model, named_voices=voices, name=name,
                                                        **_piper_options(settings))


def _vits_kind(model: str, voices: list[VoiceSpec], name: str, settings: Settings) -> Described:
    from .vits import VitsEngine, describe_vits

    return describe_vits(model, voices), capabilities_of(VitsEngine), _torch_loader(
        settings, lambda: VitsEngine(model, voices, settings.device, settings.dtype, name=name))


def _stepped_options(voices: list[VoiceSpec]) -> dict:
    """A stepped model's model-level options: any voice of the model may set them."""
    options: dict = dict(fixed_length=any(voice.fixed_length for voice in voices))
    max_running = [voice.max_running for voice in voices if voice.max_running]
    options["max_running"] = max(max_running) if max_running else DEFAULT_MAX_RUNNING
    return options


def _pocket_kind(model: str, voices: list[VoiceSpec], name: str, settings: Settings) -> Described:
    from .pocket_tts import PocketTTSEngine, describe_pocket_tts

    options = _stepped_options(voices)
    return describe_pocket_tts(model, voices), capabilities_of(PocketTTSEngine, options["max_running"]), \
        _torch_loader(settings, lambda: PocketTTSEngine(model, voices, settings.device, settings.dtype, name=name,
                                                        **options))


def _vibevoice_kind(model: str, voices: list[VoiceSpec], name: str, settings: Settings) -> Described:
    from .vibevoice import VibeVoiceEngine, describe_vibevoice

    options = _stepped_options(voices)
    return describe_vibevoice(model, voices), capabilities_of(VibeVoiceEngine, options["max_running"]), \
        _torch_loader(settings, lambda: VibeVoiceEngine(model, voices, settings.device, settings.dtype, name=name,
                                                        **options))


def _kokoro_kind(model: str, voices: list[VoiceSpec], name: str, settings: Settings) -> Described:
    from .kokoro import KokoroEngine, describe_kokoro

    for package in ("kokoro", "misaki"):  # (imported when the model loads: kokoro's import reads spaCy, seconds)
        if importlib.util.find_spec(package) is None:
            raise ModuleNotFoundError(name=package)

    return describe_kokoro(model, voices), capabilities_of(KokoroEngine), _torch_loader(
        settings, lambda: KokoroEngine(model, voices, settings.device, name=name))  # (fp32 whatever TTS_DTYPE says)


def _upstream_kind(model: str, voices: list[VoiceSpec], name: str, settings: Settings) -> Described:
    from .upstream import UpstreamEngine, describe_upstream

    options = next(voice.upstream for voice in voices if voice.upstream)  # (the registry requires a url)
    described, capabilities = describe_upstream(model, voices, name, options)
    return described, capabilities, lambda: UpstreamEngine(model, voices, name, options)


def _torch_loader(settings: Settings, load: Callable[[], Engine]) -> Callable[[], Engine]:
    """load, with torch's CPU threads set first where TTS_TORCH_THREADS says (process-wide, as torch has
    it); else torch's own, one a core (a Pocket TTS server served more with a thread a core than with one
    thread, even with the load generator on the same cores: docs/configuration.md)."""
    def loaded() -> Engine:
        if settings.torch_threads:
            import torch

            torch.set_num_threads(settings.torch_threads)
        return load()

    return loaded


# how to install what a model kind needs (the bundled Piper voice needs none of it)
INSTALL_HINTS = {"torch": "pip install torch==2.13.0; the README says how to get the CPU or the CUDA build",
                 "kokoro": "pip install -r requirements-kokoro.txt, after torch (README)",
                 "misaki": "pip install -r requirements-kokoro.txt, after torch (README)"}
Loader = Callable[[], Engine]
Described = tuple[list[Voice], Capabilities, Loader]
# The registry's `engine:` kinds: (model, its voices, a unique name, settings) -> (the voices described, what the
# model can do, a loader), all without loading it
ENGINE_KINDS: dict[str, Callable[[str, list[VoiceSpec], str, Settings], Described]] = {
    "piper": _piper_kind,
    "vits": _vits_kind,
    "pocket_tts": _pocket_kind,
    "vibevoice": _vibevoice_kind,
    "kokoro": _kokoro_kind,
    "upstream": _upstream_kind,
}


def registry_specs(settings: Settings, taken: set[str]) -> list[ModelSpec]:
    from ..voices.registry import read_registry, upstream_options, with_listed
    from .upstream import listed_voices

    specs, names = [], set(taken)
    for (kind, model, _), entries in read_registry(settings.voices_file).by_model().items():
        upstream = upstream_options(list(entries.values()))
        name = _unique(model.rstrip("/").rsplit("/", 1)[-1].removesuffix(".onnx"), names)
        names.add(name)
        try:
            if upstream is not None:
                entries = with_listed(entries, lambda: listed_voices(upstream, model))  # noqa: B023 (asked at once)
            elif kind == "kokoro":
                entries = with_listed(entries, lambda: _kokoro_packs(model))  # noqa: B023 (asked at once)
            voices = [VoiceSpec(voice, entry.language, entry.speaker, entry.speed, entry.prompt, entry.fixed_length,
                                entry.max_running, entry.upstream_voice, upstream) for voice, entry in entries.items()]
            described, capabilities, load = ENGINE_KINDS[kind](model, voices, name, settings)
        except ImportError as missing:  # torch (or kokoro) is not installed: the bundled Piper voice needs none of it
            raise EngineUnavailable(
                f"the {kind} model {model!r} needs the Python package {missing.name!r}, which is not installed "
                f"({INSTALL_HINTS.get(missing.name or '', INSTALL_HINTS['torch'])})") from None
        pinned = any(entry.pinned for entry in entries.values())
        defaults = tuple(name for name, entry in entries.items() if entry.language_default)
        specs.append(ModelSpec(name, described, load, pinned, (kind, model, tuple(entries.items())), registry=True,
                               language_defaults=defaults, capabilities=capabilities))
    return specs


def _kokoro_packs(model: str) -> list[str]:
    from .kokoro import pack_names

    return pack_names(model)


def _piper_options(settings: Settings) -> dict:
    return dict(intra_op_threads=settings.onnx_intra_op_threads, inter_op_threads=settings.onnx_inter_op_threads,
                spinning=settings.onnx_spinning, noise_scale=settings.piper_noise_scale,
                noise_w=settings.piper_noise_w)


def _unique(name: str, taken: set[str]) -> str:
    candidate, number = name, 2
    while candidate in taken:
        candidate, number = f"{name}-{number}", number + 1
    return candidate


__all__ = ["ENGINE_KINDS", "Capabilities", "Engine", "EngineUnavailable", "ModelSpec", "Voice", "VoiceSpec",
           "load_voice_engine", "model_specs", "registry_specs"]
