"""The Ray Serve ingress's view of its engine deployments' load, from what their replicas report.

Every engine replica writes its figures to the shared database each second (admin.cluster.ReplicaReporter), and
the ingress reads every replica's row each second for the cluster view: this view is rebuilt from those rows, so
the ingress's status and its degrade mode's load score cost no call to a replica. A model's load is read through
the methods an engine loop offers for it (queue_length, predicted_wait, pressure, running_count, status).
Whether a request can wait is still decided by the replica's own queue, where it is queued.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from admin.cluster import GONE_AFTER_S
from tts_core.scheduler.queue import WaitTarget


@dataclass(frozen=True)
class DeploymentStatus:
    """A model's deployment as the status page shows it (an engine loop's LoopStatus stands here)."""

    queue_length: int
    queue_wait_s: float
    running: int
    replicas: int
    degraded_replicas: int

    def to_json(self) -> dict:
        return {"queue_length": self.queue_length, "queue_wait_s": self.queue_wait_s, "ready": True,
                "running": self.running, "replicas": self.replicas, "degraded_replicas": self.degraded_replicas}


@dataclass(frozen=True)
class DeploymentLoad:
    """One model's engine deployment, as its live replicas last reported (at least one)."""

    replicas: tuple[dict, ...]  # each replica's figures

    @property
    def queue_length(self) -> int:
        return sum(figures["queue_length"] for figures in self.replicas)

    def running_count(self) -> int:
        return sum(figures["running"] for figures in self.replicas)

    def predicted_wait(self) -> float:
        """A typical new sentence's wait on the replica where it would wait least: Ray's router sends a new call
        to the less busy of the replicas it looks at."""
        return min(figures["queue_wait_s"] for figures in self.replicas)

    def pressure(self, target: WaitTarget) -> tuple[float, float]:
        """The least pressed replica's predicted wait and the wait target in force there (the usual one, or the
        overload one where its queue is overloaded: its settings follow the same stored ones as `target`'s)."""
        least = min(self.replicas, key=lambda figures: figures["queue_wait_s"] / figures["queue_wait_limit_s"])
        return least["queue_wait_s"], least["queue_wait_limit_s"]

    def status(self) -> DeploymentStatus:
        return DeploymentStatus(self.queue_length, round(self.predicted_wait(), 3), self.running_count(),
                                len(self.replicas), sum(bool(figures["degraded"]) for figures in self.replicas))


class RemoteLoads:
    """Each model's DeploymentLoad, rebuilt whole (one assignment) from every replica's row as the ingress reads
    them. Reports that have not been read for GONE_AFTER_S (the database is out of reach) are no view at all: the
    ingress then sees no load, and the replicas' own queues still refuse what they cannot take."""

    def __init__(self, models: Iterable[str], clock: Callable[[], float] = time.monotonic):
        self.models = frozenset(models)
        self._clock = clock
        self._view: tuple[float, dict[str, DeploymentLoad]] = (-math.inf, {})  # (when read, the loads)

    def refresh(self, rows: list[dict]) -> None:
        """The rows of storage.replicas.all(): an engine replica's id is "<model>/<replica>"."""
        live: dict[str, list[dict]] = {}
        for row in rows:
            model = row["id"].rpartition("/")[0]
            if model in self.models and row["seen_s_ago"] <= GONE_AFTER_S and "queue_wait_s" in row["figures"]:
                live.setdefault(model, []).append(row["figures"])
        self._view = (self._clock(), {model: DeploymentLoad(tuple(figures)) for model, figures in live.items()})

    def loads(self) -> dict[str, DeploymentLoad]:
        """The models served by at least one live replica, and their load."""
        read_at, loads = self._view
        return loads if self._clock() - read_at <= GONE_AFTER_S else {}
