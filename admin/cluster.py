"""The replicas of a deployment: each reports its live figures to the shared database every second (on
the settings refresh's turn), and every replica's stats show them all, with the ones that stopped
reporting marked gone."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime

from storage import Storage, StorageError
from tts_core.service import SpeechService

log = logging.getLogger(__name__)

GONE_AFTER_S = 5.0  # a replica that has not reported for this long is shown as gone
SERIES_POINTS = 120  # seconds of the per-replica lines kept


class ReplicaReporter:
    def __init__(self, storage: Storage, service: SpeechService, replica: str):
        self.storage, self.service, self.replica = storage, service, replica
        self.started_at = datetime.now(UTC)
        self.failing = False  # the last report failed (logged once per outage)
        # every replica's load score and queue, as this one read them each second: the Admin tab's lines
        self.series: deque[dict] = deque(maxlen=SERIES_POINTS)
        self.on_rows: list[Callable[[list[dict]], None]] = []  # given every replica's report, each time they are read

    def report(self) -> None:
        """This replica's figures now (blocking). A write that fails is logged once per outage and does not
        stop the refresh it rides on: settings are still read while writes fail."""
        status, state = self.service.status(), self.service.degrade_state()
        wait_s, wait_limit_s = self.service.queue_pressure()  # an engine replica's, for the Ray ingress's degrade mode
        try:
            self.storage.replicas.report(self.replica, self.started_at, {
                "queue_length": status["queue_length"], "running": status["running_items"],
                "batch_size": status["avg_batch_size"], "load_score": round(state.score, 3),
                "degraded": state.active, "actions": list(state.actions),
                "queue_wait_s": round(wait_s, 3), "queue_wait_limit_s": wait_limit_s,
                "gpu_free_mem_mb": status["gpu_free_mem_mb"], "models_loaded": status["models_loaded"]})
            rows = self.storage.replicas.all()
        except StorageError as error:
            if not self.failing:
                log.warning("cannot report this replica's figures (%s); the cluster view misses it meanwhile", error)
            self.failing = True
            return
        self.failing = False
        for take in self.on_rows:
            take(rows)
        point: dict = {"t": time.time()}
        for row in rows:
            if row["seen_s_ago"] <= GONE_AFTER_S:
                point[f"load:{row['id']}"] = row["figures"]["load_score"]
                point[f"queue:{row['id']}"] = row["figures"]["queue_length"]
        self.series.append(point)

    def cluster(self) -> list[dict]:
        """Every replica as it last reported: this one marked `self`, the silent ones `gone`."""
        return [{**row, "self": row["id"] == self.replica, "gone": row["seen_s_ago"] > GONE_AFTER_S}
                for row in self.storage.replicas.all()]
