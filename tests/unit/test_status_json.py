"""Each strategy's status is typed (read as attributes by the monitor, /health and the admin's state) and written out
by to_json as GET /api/v1/batch/status has always answered: the same fields, in the same order."""

from __future__ import annotations

import json

from tests.fakes import FakeEngine, FakeSteppedEngine
from tts_core.config import Settings
from tts_core.ops.metrics import Metrics
from tts_core.scheduler.faults import FaultCounts
from tts_core.scheduler.stepped import SteppedStatus
from tts_core.scheduler.upstream import BreakerStatus, UpstreamStatus
from tts_core.service import SpeechService

LOOP = ["queue_length", "queue_wait_s", "ready", "calibrated"]
AFTER = ["turn_failures", "turn_failures_in_a_row", "last_turn_failure", "precision", "memory_token_budget",
         "out_of_memory"]
ONE_SHOT = ["policy", "instances"]
STEPPED = ["policy", "running", "steps_per_s", "frames_per_step", "codec_thread", "engine_busy_share",
           "codec_busy_share", "codec_waiting", "codec_job_failures", "codec_job_failures_in_a_row",
           "last_codec_job_failure"]


def test_the_status_page_answers_the_same_fields_in_the_same_order():
    service = SpeechService(Settings(voice_aliases={}, model_aliases={}), [FakeEngine(), FakeSteppedEngine()],
                            Metrics())
    try:
        engines = service.status()["engines"]
        running = service.loops["fake-ar"].status().strategy
    finally:
        service.stop()
    assert list(engines["fake"]) == ["loaded", "pinned", *LOOP, *ONE_SHOT, *AFTER]
    assert list(engines["fake-ar"]) == ["loaded", "pinned", *LOOP, *STEPPED, *AFTER]
    assert isinstance(running, SteppedStatus) and running.running == engines["fake-ar"]["running"] == 0
    json.dumps(engines)  # as the API writes it


def test_an_upstreams_status_reads_back_from_its_json_and_another_s_does_not():
    status = UpstreamStatus("http://far:8091", 2, limit=4, settled=2, most=16, above_measured=False,
                            audio_s_per_s={2: 3.5}, latency_s=0.25, breaker=BreakerStatus("closed", 0, 0.0),
                            errors={"busy": 1})
    written = status.to_json()
    assert list(written) == ["policy", "running"] and written["running"] == 2
    assert list(written["policy"]) == ["name", "url", "in_flight", "limit", "settled", "most", "above_measured",
                                       "audio_s_per_s", "latency_s", "breaker", "errors"]
    assert written["policy"]["breaker"] == {"state": "closed", "failures_in_a_row": 0, "retry_after_s": 0.0}
    assert UpstreamStatus.from_json(written) == status
    stepped = SteppedStatus({"name": "adaptive"}, 0, 0.0, 0.0, False, 0.0, 0.0, 0, FaultCounts())
    assert UpstreamStatus.from_json(stepped.to_json()) is None and UpstreamStatus.from_json({"loaded": False}) is None
