"""Request accounting, in one place: every surface that answers speech (the HTTP routes, the WebSocket, Wyoming,
the UI) reports each request here once it has ended, and it is counted, timed and logged alike."""

from __future__ import annotations

import time

from storage.request_log import RequestLogWriter
from tts_core.ops.metrics import Metrics


def account(metrics: Metrics, request_log: RequestLogWriter | None, *, source: str, client: str, status: int,
            started: float, characters: int = 0, voice: str | None = None, audio_s: float = 0.0,
            queue_ms: float | None = None, synthesis_ms: float | None = None, batch_size: int | None = None
            ) -> None:
    """One answered request: `started` is its time.perf_counter() when it was accepted; status 499 when the
    caller left before the whole answer was sent."""
    metrics.request_answered(source, status, time.perf_counter() - started, audio_s)
    if request_log is not None:
        request_log.record(client=client, source=source, status=status, voice=voice, characters=characters,
                           queue_ms=queue_ms, synthesis_ms=synthesis_ms, batch_size=batch_size)
