"""The operator's controls on the running service, one door that app.py builds for admin/ and itself: degrade mode's
settings (the cache's size with them), the pronunciation lexicon, the registry's reload, a model's precision reset,
and what the dashboard reads (status, degrade state, the figures, the cache, the cost models). Surfaces never reach
into the service's parts: they ask the service (SpeechService.answer and its read methods), and change it here."""

from __future__ import annotations

from .errors import NotFound
from .request.operating import DegradeState, OperatorSettings
from .service import SpeechService
from .text.lexicon import Lexicon
from .voices.registry import registry_specs


class ServiceControls:
    def __init__(self, service: SpeechService):
        self._service = service

    # --- degrade mode and the cache -------------------------------------------------------------

    def settings(self) -> OperatorSettings:
        """The operator settings in force."""
        return self._service.degrade.settings

    def configure(self, settings: OperatorSettings) -> None:
        """New operator settings, in force at once: degrade mode's, and the cache's size."""
        self._service.degrade.configure(settings)
        self._service.cache.resize(int(settings.cache_max_mb * 2**20))

    def degrade_state(self) -> DegradeState:
        return self._service.degrade_state()  # the one reading, which the replicas' reports use too

    def cache_stats(self) -> dict:
        return self._service.cache.stats()

    # --- the lexicon, the registry, precision ---------------------------------------------------

    def use_lexicon(self, lexicon: Lexicon) -> None:
        """The operator's pronunciations, swapped in whole (one assignment): requests admitted from now read them."""
        self._service.admission.lexicon = lexicon

    def reload_registry(self) -> dict:
        """Read TTS_VOICES_FILE again and offer its models as now configured (SpeechService.reload_registry): the
        summary of what was kept, removed and added, and the voices offered now. Blocking; EngineUnavailable for a
        registry that cannot be read, Conflict for a model still busy."""
        service = self._service
        taken = {name for name, slot in service.pool.slots().items() if not slot.spec.registry}
        summary = service.reload_registry(registry_specs(service.settings, taken))
        return {**summary, "voices": [voice.name for voice in service.catalogue.voice_list()]}

    def reset_precision(self, model: str) -> dict:
        """Let degrade mode lower the model's precision again after a batch failed at the lower one: whether it was
        held at full, and its precision now (None when it is not loaded). NotFound for a model that does not exist."""
        service = self._service
        aliases = service.catalogue.model_aliases  # (a model as /v1/models lists it, or its alias)
        named, model = model, aliases.get(model, model)
        if model not in service.pool.slots():
            known = ", ".join([*sorted(service.pool.slots()), *sorted(aliases)])
            raise NotFound(f"model {named!r} does not exist; the models: {known}", "model")
        loop = service.loops.get(model)
        was_off = loop.reset_precision() if loop else service.degrade.precision_off.pop(model, None) is not None
        return {"model": model, "was_off": was_off, "precision": loop.precision if loop else None}

    # --- what the dashboard reads ---------------------------------------------------------------

    def status(self) -> dict:
        return self._service.status()

    def queue_pressure(self) -> tuple[float, float]:
        return self._service.queue_pressure()

    def latency_ms(self, quantile: float) -> float | None:
        return self._service.metrics.latency_ms(quantile)

    def first_audio_ms(self, quantile: float) -> float | None:
        return self._service.metrics.first_audio_ms(quantile)

    def audio_throughput(self) -> float:
        return self._service.metrics.audio_throughput()

    def job_backlog(self) -> tuple[int, int, float | None]:
        """Jobs queued, running, and the oldest queued one's wait (s), as the job runner last counted them."""
        return self._service.metrics.job_backlog

    def series(self, points: int) -> list[dict]:
        """The last `points` seconds of the dashboard's lines."""
        return list(self._service.metrics.series)[-points:]

    def cost_models(self) -> dict:
        """Each loaded model's batch policy and, where it learns, the cost model it sizes batches by (seconds =
        fixed + per_item * size + per_padded_token * padded tokens; a stepped engine's: seconds a step, its size
        the requests running) with the measured batches it is fitted on."""
        models = {}
        for name, loop in self._service.loops.items():
            described = loop.cost_model()
            model = described["model"]
            models[name] = {
                "policy": described["policy"], "unit": described["unit"], "max_size": described["max_size"],
                "fitted": model is not None and model.fitted,
                "coefficients": None if model is None else [float(value) for value in model.coefficients],
                "observations": [] if model is None else model.observations()}
        return models
