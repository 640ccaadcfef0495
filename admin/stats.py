"""One snapshot of everything the dashboard shows (also GET /admin/api/stats)."""

from __future__ import annotations

from dataclasses import asdict

from access.control import AccessControl
from storage import StorageError
from tts_core.monitor import Monitor
from tts_core.ops import gpu
from tts_core.service import SpeechService

from .cluster import ReplicaReporter
from .control import OperatorControl


def collect_stats(service: SpeechService, monitor: Monitor, control: OperatorControl, access: AccessControl,
                  replicas: ReplicaReporter | None = None, points: int = 120) -> dict:
    """This replica's figures, and under `replicas` every replica of the deployment as it last reported."""
    return {
        **_cluster(replicas),
        "status": service.status(),
        "degrade": asdict(service.degrade.state),
        "precision": dict(monitor.precision),
        "latency_ms": {"p50": service.metrics.latency_ms(0.5), "p95": service.metrics.latency_ms(0.95)},
        "first_audio_ms": {"p50": service.metrics.first_audio_ms(0.5), "p95": service.metrics.first_audio_ms(0.95)},
        "throughput_audio_s_per_s": service.metrics.audio_throughput(),
        "cache": service.cache.stats(),
        "jobs": dict(zip(("queued", "running", "oldest_queued_s"), service.metrics.job_backlog)),
        "gpu": gpu.readings(),
        "storage": {**control.health(), "rate_limit_error": access.storage_error,
                    "rate_limit_store": {"uri": access.store_uri, **access.breaker.state()}},
        "series": list(service.metrics.series)[-points:],
        "cost_models": cost_models(service),
    }


def _cluster(replicas: ReplicaReporter | None) -> dict:
    if replicas is None:
        return {"replicas": [], "replica_series": []}
    series = list(replicas.series)  # each replica's load score and queue, second by second, as this one read them
    try:
        return {"replicas": replicas.cluster(), "replica_series": series}
    except StorageError as error:  # the rest of the figures still answer
        return {"replicas": [], "replica_series": series, "replicas_error": str(error)}


def cost_models(service: SpeechService) -> dict:
    """Each loaded model's batch policy and, where it learns, the cost model it sizes batches by (seconds =
    fixed + per_item * size + per_padded_token * padded tokens; a stepped engine's: seconds a step, its size
    the requests running) with the measured batches it is fitted on."""
    models = {}
    for name, loop in service.loops.items():
        described = loop.cost_model()
        model = described["model"]
        models[name] = {
            "policy": described["policy"], "unit": described["unit"], "max_size": described["max_size"],
            "fitted": model is not None and model.fitted,
            "coefficients": None if model is None else [float(value) for value in model.coefficients],
            "observations": [] if model is None else model.observations()}
    return models
