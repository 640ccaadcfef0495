"""All settings in one place, read from the environment with the prefix TTS_."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_VOICE = "en_US-joe-medium"
# What TTS_BATCH_POLICY and TTS_QUEUE_ORDER may name. The scheduler holds what each one is (scheduler/policy.py's
# POLICIES, scheduler/queue.py): settings are a leaf, below it (tests/unit/test_layers.py holds the names the same).
BATCH_POLICIES = ("adaptive", "sequential", "static", "window")
QUEUE_ORDERS = ("fair", "fifo")

OPENAI_MODEL_NAMES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
OPENAI_VOICE_NAMES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable",
    "nova", "onyx", "sage", "shimmer", "verse", "marin", "cedar",
)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TTS_", extra="ignore")

    host: str = "0.0.0.0"
    port: int = Field(7860, ge=1, le=65535)
    data_dir: Path = Path("data")
    voices_dir: Path | None = None  # default: <data_dir>/voices
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    database_url: str | None = None  # default: SQLite at <data_dir>/chorus.db
    admin_token: SecretStr | None = None  # unset: the admin tab and API are disabled
    operator_defaults: dict[str, Any] = {}  # JSON: operator settings used until an admin stores others
    require_api_key: bool = False
    # A bearer token for /metrics and /api/v1/batch/status (Prometheus scrapers). Set, or with require_api_key,
    # those need it or a valid API key; neither set: they are open.
    metrics_token: SecretStr | None = None
    trusted_proxies: Annotated[list[str], NoDecode] = []  # proxies whose X-Forwarded-For is believed
    ratelimit_storage: str = "memory://"  # or redis://host:port/db to share counters between replicas

    # Request limits
    max_chars: int = Field(5000, ge=1)
    max_spoken_chars: int = Field(10_000, ge=1)  # the longest an input may be once numbers etc. are said as words
    max_body_bytes: int = Field(1_048_576, ge=1024)
    max_chunk_chars: int = Field(400, ge=20)
    stream_first_chunk_chars: int = Field(24, ge=0)  # streams start with a chunk this short; 0: whole sentences
    request_timeout_s: float = Field(120.0, gt=0)

    # Jobs (POST /v1/audio/jobs, /v1/audio/speech/batch)
    max_batch_items: int = Field(32, ge=1)  # items in one /v1/audio/speech/batch call
    result_ttl_s: float = Field(3600.0, gt=0)  # how long job results are kept
    job_max_attempts: int = Field(3, ge=1)
    job_deadline_s: float = Field(3600.0, gt=0)  # jobs not done this long after being queued fail; the most one may ask
    max_job_backlog: int = Field(1000, ge=1)  # queued jobs beyond which submissions answer 503
    job_concurrency: int = Field(4, ge=1)  # jobs in the batcher at once
    job_lease_s: float = Field(30.0, ge=1)  # a running job's claim holds this long unrenewed (a dead replica's returns)
    results_dir: Path | None = None  # default: <data_dir>/results; replicas share one (a mounted volume)
    replica_id: str | None = None  # default: <host name>:<port>; stable across restarts of one replica

    # Batching
    batch_policy: Literal[BATCH_POLICIES] = "adaptive"  # type: ignore[valid-type]
    max_batch_size: int = Field(16, ge=1)
    max_batch_tokens: int = Field(8192, ge=64)
    max_queue: int = Field(512, ge=1)
    max_queue_per_caller: int = Field(128, ge=0)  # pieces of text one caller may have waiting; 0: no limit
    aging_horizon_s: float = Field(2.0, ge=0)
    queue_order: Literal[QUEUE_ORDERS] = "fair"  # type: ignore[valid-type]  # fifo: arrival order (benchmark peers)
    calibration_sizes: Annotated[list[int], NoDecode] = [1, 2, 4, 8, 16]

    # Engines
    onnx_intra_op_threads: int = Field(0, ge=0)  # 0: one per physical core
    onnx_inter_op_threads: int = Field(1, ge=0)
    piper_noise_scale: float | None = Field(None, ge=0)  # None: the voice's own; 0 with noise_w 0: deterministic
    piper_noise_w: float | None = Field(None, ge=0)
    torch_threads: int = Field(0, ge=0)  # torch's CPU threads for transformers engines; 0: torch's own (one a core)
    onnx_spinning: bool = False  # busy-wait idle onnxruntime threads (faster alone, slower when serving)
    engine_instances: int = Field(1, ge=0)  # copies of a one-shot model on a CPU; 0: as many as measure fastest
    voices_file: Path | None = None  # YAML voice registry (transformers VITS models, named Piper voices)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # for transformers models
    dtype: Literal["fp32", "fp16", "bf16"] = "fp32"  # for transformers models; fp16/bf16 need CUDA
    min_free_mem_mb: int = Field(2048, ge=0)  # device memory batches leave free
    cpu_cache_mb: int = Field(1024, ge=16)  # memory the running requests' caches may take on a CPU (stepped engines)
    codec_stage: Literal["auto", "on", "off"] = "auto"  # a stepped engine's codec on a thread of its own; auto: on CUDA
    max_loaded_models: int = Field(4, ge=0)  # models kept loaded at once (pinned ones count); 0: no limit
    model_memory_mb: int = Field(0, ge=0)  # memory the loaded models' weights may take; 0: no limit
    empty_cache_every: int = Field(100, ge=0)  # batches between releases of cached device memory; 0: never
    default_voice: str = DEFAULT_VOICE
    max_cloned_voices_per_caller: int = Field(20, ge=0)  # cloned voices one caller may keep; 0: no limit
    model_aliases: dict[str, str] = {name: "piper" for name in OPENAI_MODEL_NAMES}
    voice_aliases: dict[str, str] = {name: DEFAULT_VOICE for name in OPENAI_VOICE_NAMES}
    language_voices: dict[str, str] = {}  # a request's language with no voice -> the voice to use ("fr": "mms-fra")

    # Connections and hostile input (#14)
    http_max_per_caller: int = Field(256, ge=1)  # HTTP connections one address may hold open (a trusted proxy: no cap)
    http_max_connections: int = Field(1024, ge=1)  # HTTP connections open at once, all callers together
    header_timeout_s: float = Field(10.0, gt=0)  # an HTTP request's headers and body must arrive whole within this
    write_timeout_s: float = Field(30.0, gt=0)  # a client that takes none of what is sent to it this long is cut off
    shutdown_grace_s: float = Field(30.0, ge=0)  # on SIGTERM: the longest in-flight work is waited for, then cut
    ws_idle_timeout_s: float = Field(300.0, gt=0)  # a WebSocket with no message and nothing spoken this long is closed
    ws_max_per_caller: int = Field(8, ge=1)  # WebSockets one caller may hold open
    ws_max_connections: int = Field(256, ge=1)  # WebSockets open at once, all callers together
    # Origins (scheme://host[:port]) whose web pages may open the WebSocket; empty: the server's own host only
    # (Origin's host is the Host header); "*": any. Clients that send no Origin (not browsers) are not affected.
    allowed_origins: Annotated[list[str], NoDecode] = []
    upload_max_per_caller_per_hour: int = Field(20, ge=0)  # UI file uploads per caller an hour; 0: none
    upload_max_mb_per_caller_per_hour: float = Field(20.0, ge=0)  # their bytes per caller an hour
    upload_max_total_mb: float = Field(256.0, ge=0)  # uploads Gradio keeps on disk, all callers together

    # Wyoming (Home Assistant, Rhasspy): off unless a port is set; it binds `host`, and has no authentication
    wyoming_port: int | None = Field(None, ge=1, le=65535)
    wyoming_tier: str | None = None  # the operator tier its callers get; None: the anonymous tier
    wyoming_idle_timeout_s: float = Field(60.0, gt=0)  # no whole event from the client, or it reads nothing: closed
    wyoming_max_per_caller: int = Field(8, ge=1)  # connections one address may hold open
    wyoming_max_connections: int = Field(64, ge=1)  # connections open at once, all addresses together

    @field_validator("calibration_sizes", mode="before")
    @classmethod
    def _comma_separated_ints(cls, value):
        if isinstance(value, str):
            return [int(part) for part in value.strip("[] ").split(",") if part.strip()]
        return value

    @field_validator("wyoming_port", mode="before")
    @classmethod
    def _empty_is_unset(cls, value):
        return None if isinstance(value, str) and not value.strip() else value  # TTS_WYOMING_PORT= turns it off

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_case(cls, value):
        return value.lower() if isinstance(value, str) else value

    @field_validator("trusted_proxies", "allowed_origins", mode="before")
    @classmethod
    def _comma_separated(cls, value):
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @property
    def database(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'chorus.db'}"

    @property
    def results_path(self) -> Path:
        return self.results_dir if self.results_dir is not None else self.data_dir / "results"

    @property
    def replica(self) -> str:
        return self.replica_id or f"{socket.gethostname()}:{self.port}"

    @property
    def voices_path(self) -> Path:
        return self.voices_dir if self.voices_dir is not None else self.data_dir / "voices"

    # Storage and Redis faults (#14)
    redis_timeout_s: float = Field(0.25, gt=0, le=10)  # longest wait for one call to the rate-limit store
    redis_cooldown_s: float = Field(10.0, gt=0, le=600)  # a failing store is asked again after this (fail open)
