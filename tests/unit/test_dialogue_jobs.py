"""Dialogue jobs on a real SQLite database and fake engines: the row counts the turns made as they are made (one
engine call at a time, let through by the test), an attempt queued again counts from 0, progress is written only
by the attempt holding the job and only forward, and what a dialogue's job keeps and forgets.

Nothing sleeps: a test waits for the job's row to change (the storage tells it), each wait bounded by WAIT_S."""

import threading

import pytest

import jobs
from api.jobs import public_job
from storage import JobStatus
from tests.fakes import FakeEngine
from tests.unit.test_jobs import CALLER, WAIT_S, WatchedJobs, WatchedStorage, run, status_is, until
from tts_core.config import Settings
from tts_core.ops.metrics import Metrics
from tts_core.request.operating import OperatorSettings
from tts_core.service import SpeechService

TURNS = ["Ann: Hello there, Bob.", "Bob: Hello, Ann.", "Ann: How was the trip?", "Bob: Long, but lovely."]


class SteppedEngine(FakeEngine):
    """Once `stepping` is set, each call waits for a permit the test hands out: one sentence made per permit."""

    def __init__(self):
        super().__init__()
        self.stepping = False
        self.permits = threading.Semaphore(0)

    def synthesize(self, batch):
        if self.stepping:
            assert self.permits.acquire(timeout=WAIT_S), "no permit came"
        return super().synthesize(batch)


class ProgressWatchedJobs(WatchedJobs):
    """Tells the waiting test of every progress write too."""

    def progress(self, *args):
        return self.watcher.tell(super().progress(*args))


@pytest.fixture
def storage(tmp_path):
    storage = WatchedStorage(f"sqlite:///{tmp_path / 'chorus.db'}")
    storage.migrate()
    storage.jobs = ProgressWatchedJobs(storage._database, storage)
    return storage


@pytest.fixture
def service(tmp_path):
    engine = SteppedEngine()
    settings = Settings(data_dir=tmp_path, batch_policy="sequential", calibration_sizes=[1], voice_aliases={},
                        model_aliases={})
    service = SpeechService(settings, [engine], Metrics())
    service.start()
    assert service.loops["fake"].calibrated.wait(WAIT_S)
    engine.stepping = True
    yield service, engine
    engine.stepping = False
    for _ in range(100):  # let any call still waiting go
        engine.permits.release()
    service.stop()


def dialogue_request(script: str, **extra) -> dict:
    return {"script": script, "voices": {"Ann": "fake-voice", "Bob": "fake-voice"}, "model": None, "speed": 1.0,
            "response_format": "wav", "characters": len(script), **extra}


def test_the_row_counts_the_turns_as_they_are_made_and_the_job_ends_with_them_all(storage, service):
    service, engine = service
    runner = jobs.JobRunner(storage, service, service.settings, lambda: OperatorSettings())
    job = runner.submit(CALLER, dialogue_request("\n".join(TURNS)), turns=len(TURNS))
    assert (job["turns"], job["turns_done"]) == (4, 0)
    seen = []

    async def scenario():
        for made in range(1, len(TURNS)):  # one sentence (a turn) per permit: the count follows each
            engine.permits.release()
            await until(storage, lambda made=made: storage.jobs.get(job["id"])["turns_done"] == made)
            row = storage.jobs.get(job["id"])
            seen.append((row["status"], public_job(row)["progress"]))
        engine.permits.release()
        await until(storage, status_is(storage, job, JobStatus.SUCCEEDED))

    run(runner, scenario)
    assert seen == [("running", {"turns_done": made, "turns": 4}) for made in (1, 2, 3)]
    done = public_job(storage.jobs.get(job["id"]))
    assert done["progress"] == {"turns_done": 4, "turns": 4} and done["audio_s"] > 0
    assert done["request"]["voices"] == {"Ann": "fake-voice", "Bob": "fake-voice"}
    assert done["request"]["characters"] == len("\n".join(TURNS)) and done["captions_url"] is None


def test_a_job_queued_again_counts_from_zero_and_only_its_attempt_moves_the_count(storage):
    job = storage.jobs.add("job_0a", "key:1", "pro", 100, dialogue_request("Ann: Hi.\nBob: Hi."), turns=2)
    (claimed,) = storage.jobs.claim(1, "replica-a")
    storage.jobs.progress(job["id"], "replica-a", claimed["attempts"], 1)
    storage.jobs.progress(job["id"], "replica-b", claimed["attempts"], 2)  # not its job: nothing
    storage.jobs.progress(job["id"], "replica-a", claimed["attempts"] + 1, 2)  # not its attempt: nothing
    storage.jobs.progress(job["id"], "replica-a", claimed["attempts"], 0)  # a late write of less: nothing
    assert storage.jobs.get(job["id"])["turns_done"] == 1
    assert storage.jobs.requeue_expired("replica-a") == 1  # its replica started again: made again, from the start
    assert storage.jobs.get(job["id"])["turns_done"] == 0
    (again,) = storage.jobs.claim(1, "replica-a")
    storage.jobs.progress(job["id"], "replica-a", again["attempts"], 1)
    retried = storage.jobs.finish(job["id"], "replica-a", again["attempts"], JobStatus.QUEUED)  # a retry
    assert (retried["status"], retried["turns_done"]) == ("queued", 0)


def test_a_speech_job_has_no_turns_to_count(storage):
    job = storage.jobs.add("job_0b", "key:1", "pro", 100, {"input": "Hello.", "voice": "fake-voice", "model": None,
                                                          "speed": 1.0, "response_format": "wav"})
    storage.jobs.claim(1, "replica-a")
    storage.jobs.requeue_expired("replica-a")
    assert storage.jobs.get(job["id"])["turns_done"] is None and "progress" not in public_job(job)


def test_an_expired_dialogue_forgets_its_script_and_captions_and_keeps_its_length(storage):
    script = "Ann: Hello there.\nBob: Hi."
    job = storage.jobs.add("job_0c", "key:1", "pro", 100, dialogue_request(script, captions=True), turns=2)
    (claimed,) = storage.jobs.claim(1, "replica-a")
    storage.jobs.finish(job["id"], "replica-a", claimed["attempts"], JobStatus.FAILED, captions='{"words": []}')
    assert [expired["id"] for expired in storage.jobs.expired(0)] == [job["id"]]
    storage.jobs.expire(job["id"])
    kept = storage.jobs.get(job["id"])
    assert "script" not in kept["request"] and kept["captions"] is None
    assert public_job(kept)["request"]["characters"] == len(script)
    assert storage.jobs.expired(0) == []  # nothing left to forget
