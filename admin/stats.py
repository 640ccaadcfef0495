"""One snapshot of everything the dashboard shows (also GET /admin/api/stats)."""

from __future__ import annotations

from dataclasses import asdict

from access.control import AccessControl
from storage import StorageError
from tts_core.controls import ServiceControls
from tts_core.monitor import Monitor
from tts_core.ops import gpu

from .cluster import ReplicaReporter
from .control import OperatorControl


def collect_stats(controls: ServiceControls, monitor: Monitor, control: OperatorControl, access: AccessControl,
                  replicas: ReplicaReporter | None = None, points: int = 120) -> dict:
    """This replica's figures, and under `replicas` every replica of the deployment as it last reported."""
    return {
        **_cluster(replicas),
        "status": controls.status(),
        "degrade": asdict(controls.degrade_state()),
        "precision": dict(monitor.precision),
        "latency_ms": {"p50": controls.latency_ms(0.5), "p95": controls.latency_ms(0.95)},
        "first_audio_ms": {"p50": controls.first_audio_ms(0.5), "p95": controls.first_audio_ms(0.95)},
        "throughput_audio_s_per_s": controls.audio_throughput(),
        "cache": controls.cache_stats(),
        "jobs": dict(zip(("queued", "running", "oldest_queued_s"), controls.job_backlog())),
        "gpu": gpu.readings(),
        "storage": {**control.health(), "rate_limit_error": access.storage_error,
                    "rate_limit_store": {"uri": access.store_uri, **access.breaker.state()}},
        "series": controls.series(points),
        "cost_models": controls.cost_models(),
    }


def _cluster(replicas: ReplicaReporter | None) -> dict:
    if replicas is None:
        return {"replicas": [], "replica_series": []}
    series = list(replicas.series)  # each replica's load score and queue, second by second, as this one read them
    try:
        return {"replicas": replicas.cluster(), "replica_series": series}
    except StorageError as error:  # the rest of the figures still answer
        return {"replicas": [], "replica_series": series, "replicas_error": str(error)}

