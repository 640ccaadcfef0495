"""The job runner on a real SQLite database and fake engines: retries, failures, cancellation,
restart after a crash, the backlog limit, retention."""

import asyncio
import time

import pytest

import jobs
from storage import Storage
from tests.fakes import FakeEngine
from tts_core.access import Caller, Tier
from tts_core.config import Settings
from tts_core.degrade import OperatorSettings
from tts_core.errors import Overloaded
from tts_core.metrics import Metrics
from tts_core.service import SpeechService

CALLER = Caller("key:1", "pro", Tier(priority=1))


class FlakyEngine(FakeEngine):
    """Fails its next `failures` calls, then works (set once warm-up is over)."""

    failures = 0

    def synthesize(self, batch):
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("engine hiccup")
        return super().synthesize(batch)


def request(text: str = "hello there", voice: str = "fake-voice") -> dict:
    return {"input": text, "voice": voice, "model": None, "speed": 1.0, "response_format": "wav"}


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A storage, a started service, and a function that runs a runner over them until a condition."""
    monkeypatch.setattr(jobs, "BACKOFF_S", 0.05)
    monkeypatch.setattr(jobs, "POLL_S", 0.02)
    storage = Storage(f"sqlite:///{tmp_path / 'chorus.db'}")
    storage.migrate()
    services = []

    def make(engine=None, **settings) -> tuple[SpeechService, jobs.JobRunner]:
        config = Settings(data_dir=tmp_path, batch_policy="sequential", calibration_sizes=[1], voice_aliases={},
                          model_aliases={}, **settings)
        service = SpeechService(config, [engine or FakeEngine()], Metrics())
        service.start()
        services.append(service)
        assert service.batchers["fake"].ready.wait(10)
        return service, jobs.JobRunner(storage, service, config, lambda: OperatorSettings())

    yield storage, make
    for service in services:
        service.stop()


def run_until(runner: jobs.JobRunner, condition, timeout: float = 10.0, before=None):
    async def scenario():
        await runner.start()
        try:
            if before is not None:
                await before()
            deadline = time.monotonic() + timeout
            while not await asyncio.to_thread(condition):
                assert time.monotonic() < deadline, "timed out"
                await asyncio.sleep(0.02)
        finally:
            await runner.stop()

    asyncio.run(scenario())


def test_a_failing_job_is_retried_with_backoff_and_then_succeeds(world):
    storage, make = world
    engine = FlakyEngine()
    _, runner = make(engine, job_max_attempts=3)
    engine.failures = 2
    job = runner.submit(CALLER, request())
    run_until(runner, lambda: storage.job(job["id"])["status"] == "succeeded")
    done = storage.job(job["id"])
    assert done["attempts"] == 3 and done["audio_s"] > 0 and done["expires_at"] > done["finished_at"]


def test_a_job_that_keeps_failing_ends_failed_with_the_reason(world):
    storage, make = world
    engine = FlakyEngine()
    _, runner = make(engine, job_max_attempts=2)
    engine.failures = 100
    job = runner.submit(CALLER, request())
    run_until(runner, lambda: storage.job(job["id"])["status"] == "failed")
    failed = storage.job(job["id"])
    assert failed["attempts"] == 2 and "failed after 2 attempts" in failed["error"] and "hiccup" in failed["error"]


def test_an_invalid_request_fails_at_once_without_retries(world):
    storage, make = world
    _, runner = make()
    job = runner.submit(CALLER, request(voice="no-such-voice"))
    run_until(runner, lambda: storage.job(job["id"])["status"] == "failed")
    assert storage.job(job["id"])["attempts"] == 1 and "does not exist" in storage.job(job["id"])["error"]


def test_jobs_left_running_by_a_dead_process_run_again(world):
    storage, make = world
    _, runner = make()
    job = runner.submit(CALLER, request())
    storage.claim_jobs(10)  # as if a previous process had started it and died
    assert storage.job(job["id"])["status"] == "running"
    run_until(runner, lambda: storage.job(job["id"])["status"] == "succeeded")
    assert storage.job(job["id"])["attempts"] == 2


def test_cancelling_a_running_job_stops_it(world):
    storage, make = world
    engine = FakeEngine()
    service, runner = make(engine)
    engine.gate.clear()  # the job's synthesis blocks
    job = runner.submit(CALLER, request())

    async def cancel_once_running():
        while storage.job(job["id"])["status"] != "running":
            await asyncio.sleep(0.02)
        assert runner.cancel(job["id"])["status"] == "cancelled"
        engine.gate.set()

    run_until(runner, lambda: storage.job(job["id"])["status"] == "cancelled", before=cancel_once_running)
    assert runner.cancel(job["id"]) is None  # it has ended: nothing to cancel


def test_a_full_backlog_refuses_new_jobs(world):
    storage, make = world
    _, runner = make(max_job_backlog=2)
    runner.submit(CALLER, request())
    runner.submit(CALLER, request())
    with pytest.raises(Overloaded) as raised:
        runner.submit(CALLER, request())
    assert raised.value.code == "job_backlog_full" and raised.value.retry_after_s > 0


def test_results_past_their_retention_are_swept(world):
    storage, make = world
    _, runner = make(result_ttl_s=0.5)
    job = runner.submit(CALLER, request())
    run_until(runner, lambda: storage.job(job["id"])["status"] == "succeeded")
    path = storage.job(job["id"])["result_path"]
    time.sleep(0.6)
    assert runner.sweep() == 1
    assert storage.job(job["id"])["result_path"] is None and not __import__("os").path.exists(path)


def test_jobs_run_one_priority_class_below_the_callers_interactive_requests(world):
    storage, make = world
    engine = FakeEngine()
    service, runner = make(engine)
    priorities = []
    original = service.batchers["fake"].submit

    def recording_submit(items, tier_limit=None):
        priorities.extend(item.priority for item in items)
        return original(items, tier_limit)

    service.batchers["fake"].submit = recording_submit
    job = runner.submit(CALLER, request())
    run_until(runner, lambda: storage.job(job["id"])["status"] == "succeeded")
    assert priorities == [CALLER.tier.priority - 1]
