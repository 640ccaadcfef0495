"""The operator loop: measures load, moves degrade mode, samples the dashboard's time series. It reads the service
it watches, so it sits beside it (layer 5), not under it."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future

from .degrade import LoadInputs
from .ops import gpu
from .request.operating import DegradeAction
from .scheduler.engine_loop import EngineLoop
from .scheduler.queue import QueueClosed
from .scheduler.stepped import SteppedStatus
from .service import SpeechService

log = logging.getLogger(__name__)


class Monitor:
    def __init__(self, service: SpeechService, interval_s: float = 0.25, sample_every_s: float = 1.0):
        self.service = service
        self.interval_s = interval_s
        self.sample_every_s = sample_every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        next_sample = 0.0
        while not self._stop.wait(self.interval_s):
            try:
                device = gpu.readings()
                self.service.metrics.device_reading(device)
                self.tick(device)
                if time.monotonic() >= next_sample:
                    next_sample = time.monotonic() + self.sample_every_s
                    self.sample(device)
            except Exception:
                log.exception("monitor tick failed")

    def tick(self, device: dict | None = None) -> None:
        service, metrics = self.service, self.service.metrics
        service.pool.maintain()
        loops = service.loops
        memory_used = device["used_fraction"] if device else None
        state = service.degrade.update(LoadInputs(*service.queue_pressure(), memory_used))
        metrics.load_score.set(state.score)
        metrics.degrade_active.set(1 if state.active else 0)
        self._set_precision(loops, DegradeAction.LOWER_PRECISION in state.actions)

    @property
    def precision(self) -> dict[str, str]:
        """Loaded model -> its precision now."""
        return {name: loop.precision for name, loop in self.service.loops.items()}

    def _set_precision(self, loops: dict[str, EngineLoop], low: bool) -> list[Future[bool]]:
        """Ask each loop for the precision wanted, as an errand on its engine's thread; returns the errands
        handed over. The state lives on each loop, so a model loaded again while degraded starts at full and
        is lowered too."""
        switches = []
        for name, loop in loops.items():
            try:
                switch = loop.set_low_precision(low)
            except QueueClosed:  # unloaded meanwhile
                continue
            if switch is not None:
                switches.append(switch)
                if low:
                    switch.add_done_callback(lambda done, name=name: self._lowered(name, done))
        return switches

    def _lowered(self, name: str, done: Future[bool]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        supported = done.result()
        action = DegradeAction.LOWER_PRECISION
        self.service.metrics.degrade_actions.labels(action if supported else f"{action}_noop").inc()
        log.info("degrade: %s precision for %s", "lower" if supported else "no lower", name)

    def sample(self, device: dict | None = None) -> dict:
        service, metrics = self.service, self.service.metrics
        window = metrics.window()
        state = service.degrade.state
        # autoregressive engines and upstreams: requests running (in flight); steps a second, frames a step (the
        # autoregressive ones'); None without one
        running = [loop.status().strategy for loop in service.loops.values() if loop.running_count() is not None]
        stepped = [status for status in running if isinstance(status, SteppedStatus)]
        point = {
            "t": time.time(),
            "queue_length": service.queue_length(),
            "batch_size": window["avg_batch_size"],
            "throughput_audio_s": metrics.audio_throughput(),
            "p50_ms": metrics.latency_ms(0.5),
            "p95_ms": metrics.latency_ms(0.95),
            "first_audio_p50_ms": metrics.first_audio_ms(0.5),
            "first_audio_p95_ms": metrics.first_audio_ms(0.95),
            "jobs_queued": metrics.job_backlog[0],
            "jobs_oldest_s": metrics.job_backlog[2],
            "cache_hit_rate": service.cache.stats()["hit_rate"],
            "load_score": state.score,
            "degraded": state.active,
            "gpu_used_fraction": device["used_fraction"] if device else None,
            "gpu_utilization_pct": device["utilization_pct"] if device else None,
            "running_requests": sum(status.running for status in running) if running else None,
            "steps_per_s": sum(status.steps_per_s for status in stepped) if running else None,
            "frames_per_step": max((status.frames_per_step for status in stepped), default=None),
            # its stages' busy shares: the steps, the codec (tts_core.scheduler.codec_stage)
            "engine_busy_share": max((status.engine_busy_share for status in stepped), default=None),
            "codec_busy_share": max((status.codec_busy_share for status in stepped), default=None),
        }
        metrics.series.append(point)
        return point
