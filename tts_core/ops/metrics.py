"""Prometheus metrics and the rolling windows that the status endpoint and dashboard read."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class BatchRecord:
    at: float
    engine: str
    size: int
    padded_tokens: int
    real_tokens: int
    seconds: float
    max_batch_size: int


class Metrics:
    """One per process (tests build several apps, so the registry is not the global one)."""

    def __init__(self, window_s: float = 60.0, series_points: int = 300):
        self.registry = CollectorRegistry()
        self.window_s = window_s
        self._lock = threading.Lock()
        self._batches: deque[BatchRecord] = deque()
        self._waits: deque[tuple[float, float]] = deque()
        self._running: dict[str, int] = {}  # engine -> size of the batch it is running now
        self._latencies: deque[tuple[float, float]] = deque()
        self._audio: deque[tuple[float, float]] = deque()  # (at, audio seconds) per answered request
        self._first_audio: deque[tuple[float, float]] = deque()  # (at, seconds to first audio) per stream
        self.series: deque[dict] = deque(maxlen=series_points)  # one point a second, for the dashboard

        self._add_request_metrics(self.registry)
        self._add_batch_metrics(self.registry)
        self._add_job_and_model_metrics(self.registry)
        self._add_overload_and_stream_metrics(self.registry)
        self._add_upstream_metrics(self.registry)

    def _add_request_metrics(self, r: CollectorRegistry) -> None:
        self.requests = Counter("tts_requests", "Speech requests answered", ["source", "status"], registry=r)
        self.request_seconds = Histogram("tts_request_seconds", "Time to answer a speech request",
                                         ["source"], buckets=LATENCY_BUCKETS, registry=r)
        self.characters = Counter("tts_characters", "Characters synthesized", registry=r)
        self.audio_seconds = Counter("tts_audio_seconds", "Seconds of audio produced", registry=r)
        self.queue_wait_seconds = Histogram("tts_queue_wait_seconds", "Time items wait in the queue",
                                            buckets=LATENCY_BUCKETS, registry=r)

    def _add_batch_metrics(self, r: CollectorRegistry) -> None:
        """The engines' batches, and the GPU they run on."""
        self.batch_size = Histogram("tts_batch_size", "Items per executed batch", ["engine"],
                                    buckets=BATCH_BUCKETS, registry=r)
        self.batch_seconds = Histogram("tts_batch_seconds", "Engine time per batch", ["engine"],
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("tts_tokens", "Input tokens synthesized (not counting padding)", ["engine"],
                              registry=r)
        self.padding_tokens = Counter("tts_padding_tokens", "Padded tokens that carried no input",
                                      ["engine"], registry=r)
        self.item_errors = Counter("tts_item_errors", "Items the engine failed on", ["engine"], registry=r)
        self.batch_retries = Counter("tts_batch_retries", "Batches retried item by item", ["engine"],
                                     registry=r)
        self.out_of_memory = Counter("tts_out_of_memory", "Batches that ran out of device memory (run again in halves)",
                                     ["engine"], registry=r)
        # Registered at the first reading: without a GPU there is no reading, and a 0 would say "none free"
        self.gpu_free_memory = Gauge("tts_gpu_free_memory_bytes", "Free memory of the GPU (NVML)", registry=None)
        self.gpu_used_fraction = Gauge("tts_gpu_memory_used_fraction", "Used share of GPU memory (NVML)", registry=None)
        self.gpu_utilization = Gauge("tts_gpu_utilization_percent", "GPU utilisation (NVML)", registry=None)
        self._gpu_gauges_registered = False

    def _add_job_and_model_metrics(self, r: CollectorRegistry) -> None:
        """Background jobs, model loads, and the engines' queues and running requests."""
        self.jobs_queued = Gauge("tts_jobs_queued", "Jobs waiting", registry=r)
        self.jobs_running = Gauge("tts_jobs_running", "Jobs running", registry=r)
        self.jobs_oldest_queued = Gauge("tts_jobs_oldest_queued_seconds", "Age of the oldest waiting job",
                                        registry=r)
        self.jobs_finished = Counter("tts_jobs_finished", "Jobs ended", ["status"], registry=r)
        self.job_backlog: tuple[int, int, float | None] = (0, 0, None)  # for the dashboard
        self.model_loads = Counter("tts_model_loads", "Model loads", ["model", "result"], registry=r)
        self.model_evictions = Counter("tts_model_evictions", "Models unloaded", ["model", "reason"], registry=r)
        self.models_loaded = Gauge("tts_models_loaded", "Models loaded now", registry=r)
        self.dropped = Counter("tts_dropped_items", "Queued items dropped unsynthesized",
                               ["reason"], registry=r)
        self.queue_length = Gauge("tts_queue_length", "Items waiting", ["engine"], registry=r)
        self.running_requests = Gauge("tts_running_requests", "Requests running on a stepped (autoregressive) engine",
                                      ["engine"], registry=r)
        self.steps = Counter("tts_steps", "Steps of a stepped engine", ["engine"], registry=r)
        self.frames = Counter("tts_frames", "Frames made by a stepped engine (one per running request per step)",
                              ["engine"], registry=r)

    def _add_upstream_metrics(self, r: CollectorRegistry) -> None:
        """Upstream models (engine: upstream): requests in flight there, the learned limit, the breaker."""
        self.upstream_in_flight = Gauge("tts_upstream_in_flight", "Requests in flight at an upstream", ["engine"],
                                        registry=r)
        self.upstream_limit = Gauge("tts_upstream_in_flight_limit", "Requests kept in flight at an upstream (learned)",
                                    ["engine"], registry=r)
        self.upstream_breaker_open = Gauge("tts_upstream_breaker_open", "1 while an upstream's circuit breaker is "
                                           "open (0.5 half-open)", ["engine"], registry=r)
        self.upstream_seconds = Histogram("tts_upstream_seconds", "Time an upstream took for a request",
                                          ["engine"], buckets=LATENCY_BUCKETS, registry=r)
        self.upstream_errors = Counter("tts_upstream_errors", "Upstream requests that failed, by kind",
                                       ["engine", "kind"], registry=r)

    def _add_overload_and_stream_metrics(self, r: CollectorRegistry) -> None:
        """The audio cache, degrade mode and the load score; streamed requests."""
        self.cache_lookups = Counter("tts_cache_lookups", "Audio cache lookups", ["result"], registry=r)
        self.degrade_actions = Counter("tts_degrade_actions", "Requests a degrade action applied to",
                                       ["action"], registry=r)
        self.degrade_active = Gauge("tts_degrade_active", "1 while degrade mode is on", registry=r)
        self.load_score = Gauge("tts_load_score", "Load score in [0, 1]", registry=r)
        self.time_to_first_audio = Histogram("tts_time_to_first_audio_seconds",
                                             "Streamed requests: arrival to first audio bytes",
                                             buckets=LATENCY_BUCKETS, registry=r)
        self.chunks_per_request = Histogram("tts_chunks_per_request", "Streamed requests: sentences per request",
                                            buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        # words timed after synthesis, for engines that do not time them (tts_core.audio.word_timing)
        self.word_timing_seconds = Histogram("tts_word_timing_cpu_seconds", "CPU seconds spent timing one piece's "
                                             "words after synthesis, by way (aligned, estimated)", ["way"],
                                             buckets=LATENCY_BUCKETS, registry=r)
        self.word_timing_audio_seconds = Counter("tts_word_timing_audio_seconds", "Seconds of audio whose words were "
                                                 "timed after synthesis, by way", ["way"], registry=r)

    def word_timing(self, way: str, cpu_s: float, audio_s: float) -> None:
        """One piece's words timed after synthesis: its cost (their ratio is the aligner's CPU per audio second)."""
        self.word_timing_seconds.labels(way).observe(cpu_s)
        self.word_timing_audio_seconds.labels(way).inc(audio_s)

    def jobs_state(self, queued: int, running: int, oldest_queued_s: float | None) -> None:
        self.job_backlog = (queued, running, oldest_queued_s)
        self.jobs_queued.set(queued)
        self.jobs_running.set(running)
        self.jobs_oldest_queued.set(oldest_queued_s or 0.0)

    def device_reading(self, reading: dict | None) -> None:
        """The latest NVML reading (gpu.readings()); None (no GPU) leaves the gauges out of /metrics."""
        if reading is None:
            return
        if not self._gpu_gauges_registered:
            for gauge in (self.gpu_free_memory, self.gpu_used_fraction, self.gpu_utilization):
                self.registry.register(gauge)
            self._gpu_gauges_registered = True
        self.gpu_free_memory.set(reading["free_mb"] * 2**20)
        if reading["used_fraction"] is not None:
            self.gpu_used_fraction.set(reading["used_fraction"])
        self.gpu_utilization.set(reading["utilization_pct"])

    def batch_started(self, engine: str, size: int) -> None:
        with self._lock:
            self._running[engine] = size

    def step_finished(self, engine: str, running: int, longest: int, seconds: float, max_running: int) -> None:
        """A step of a stepped engine: one frame for each of `running` requests. It counts as a batch of
        that many (so batch-size figures and charts read as frames per step)."""
        self.steps.labels(engine).inc()
        self.frames.labels(engine).inc(running)
        self.batch_finished(engine, BatchRecord(time.monotonic(), engine, running, running * longest, running * longest,
                                                seconds, max_running), [])

    def step_rate(self, engine: str, over_s: float = 10.0) -> dict:
        """Steps per second and frames per step of a stepped engine, over the last over_s seconds."""
        since = time.monotonic() - over_s
        with self._lock:
            sizes = [record.size for record in self._batches if record.engine == engine and record.at >= since]
        return {"steps_per_s": round(len(sizes) / over_s, 2),
                "frames_per_step": round(sum(sizes) / len(sizes), 2) if sizes else 0.0}

    def batch_finished(self, engine: str, record: BatchRecord | None, waits: list[float]) -> None:
        """record is None when the batch raised (it is retried item by item)."""
        if record is None:
            with self._lock:
                self._running.pop(engine, None)
            return
        self.batch_size.labels(record.engine).observe(record.size)
        self.batch_seconds.labels(record.engine).observe(record.seconds)
        self.tokens.labels(record.engine).inc(record.real_tokens)
        self.padding_tokens.labels(record.engine).inc(record.padded_tokens - record.real_tokens)
        for wait in waits:
            self.queue_wait_seconds.observe(wait)
        with self._lock:
            self._running.pop(record.engine, None)
            self._batches.append(record)
            self._waits.extend((record.at, wait) for wait in waits)
            self._trim(record.at)

    def request_answered(self, source: str, status: int, seconds: float, audio_s: float = 0.0) -> None:
        self.requests.labels(source, str(status)).inc()
        self.request_seconds.labels(source).observe(seconds)
        if status == 200:
            now = time.monotonic()
            with self._lock:
                self._latencies.append((now, seconds))
                self._audio.append((now, audio_s))
                self._trim(now)

    def first_audio(self, seconds: float) -> None:
        """A stream's first audio is ready, `seconds` after its request arrived."""
        self.time_to_first_audio.observe(seconds)
        now = time.monotonic()
        with self._lock:
            self._first_audio.append((now, seconds))
            self._trim(now)

    def latency_ms(self, quantile: float) -> float | None:
        """A quantile of recent successful request latencies, or None when there were none."""
        return self._quantile_ms(self._latencies, quantile)

    def first_audio_ms(self, quantile: float) -> float | None:
        """A quantile of recent streams' times to first audio, or None when there were none."""
        return self._quantile_ms(self._first_audio, quantile)

    def _quantile_ms(self, window: deque[tuple[float, float]], quantile: float) -> float | None:
        with self._lock:
            self._trim(time.monotonic())
            values = sorted(seconds for _, seconds in window)
        if not values:
            return None
        return round(1000 * values[min(len(values) - 1, int(quantile * len(values)))], 1)

    def audio_throughput(self, over_s: float = 10.0) -> float:
        """Seconds of audio answered per second, over the last over_s seconds."""
        since = time.monotonic() - over_s
        with self._lock:
            return round(sum(audio for at, audio in self._audio if at >= since) / over_s, 3)

    def _trim(self, now: float) -> None:
        horizon = now - self.window_s
        for window in (self._waits, self._latencies, self._audio, self._first_audio):
            while window and window[0][0] < horizon:
                window.popleft()
        while self._batches and self._batches[0].at < horizon:
            self._batches.popleft()

    def window(self) -> dict:
        """Recent-window figures for /api/v1/batch/status."""
        with self._lock:
            self._trim(time.monotonic())
            batches = list(self._batches)
            waits = [wait for _, wait in self._waits]
            running = dict(self._running)
        return {
            "active_batches": len(running),
            "running_items": sum(running.values()),
            "current_batch_size": (sum(running.values()) if running
                                   else (batches[-1].size if batches else 0)),
            "avg_queue_time_ms": round(1000 * sum(waits) / len(waits), 2) if waits else 0.0,
            "avg_batch_size": round(sum(b.size for b in batches) / len(batches), 2) if batches else 0.0,
            "max_batch_utilization": max((b.size / b.max_batch_size for b in batches), default=0.0),
            "batches_in_window": len(batches),
            "window_s": self.window_s,
        }
