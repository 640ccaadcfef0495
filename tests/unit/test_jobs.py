"""The job runner on a real SQLite database and fake engines: retries, failures, overload, cancellation
at every step, restart after a crash, the backlog limit, retention and stray files.

Nothing here sleeps or polls: a test waits for a job row to change (the storage tells it) or for an
event a hook sets, each wait bounded by WAIT_S, generous for a loaded CI machine. The runner's loop
runs in asyncio's debug mode, which refuses calls into it from other threads.
"""

import asyncio
import errno
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

import jobs
from api.jobs import public_job
from storage import Storage, StorageError
from storage.jobs import Jobs
from storage.models import Job
from tests.fakes import FakeEngine
from tests.serve import wait_until
from tts_core.config import Settings
from tts_core.errors import Degraded, InvalidRequest, Overloaded, PartFailed
from tts_core.ops.metrics import Metrics
from tts_core.request.access import Caller, Tier
from tts_core.request.operating import OperatorSettings
from tts_core.scheduler.queue import RequestQueue
from tts_core.service import SpeechService

CALLER = Caller("key:1", "pro", Tier(priority=1))
WAIT_S = 60.0  # a passing test waits far less; this only bounds a failing one


class FlakyEngine(FakeEngine):
    """Fails its next `failures` calls, then works (set once warm-up is over)."""

    failures = 0

    def synthesize(self, batch):
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("engine hiccup")
        return super().synthesize(batch)


class WatchedJobs(Jobs):
    """The jobs repository of a WatchedStorage: tells it of every claim, cancel and finish."""

    def __init__(self, database, watcher: "WatchedStorage"):
        super().__init__(database)
        self.watcher = watcher

    def claim(self, limit, *lease):
        return self.watcher.tell(super().claim(limit, *lease))

    def cancel(self, job_id):
        return self.watcher.tell(super().cancel(job_id))

    def finish(self, job_id, holder, attempt, status, **fields):
        self.watcher.before_finish(job_id, status)
        moved = super().finish(job_id, holder, attempt, status, **fields)
        self.watcher.finishes.append((job_id, status, moved is not None))
        return self.watcher.tell(moved)


class WatchedStorage(Storage):
    """Storage that wakes waiting tests whenever a job row may have changed, records each attempt's
    finish (job id, status, whether it won), and runs `before_finish(job_id, status)` first: a hook
    where a test holds or fails a write at the storage boundary."""

    def __init__(self, url: str):
        super().__init__(url)
        self.changed = threading.Condition()
        self.finishes: list[tuple[str, str, bool]] = []
        self.before_finish: Callable[[str, str], None] = lambda job_id, status: None
        self.jobs = WatchedJobs(self._database, self)

    def tell(self, result=None):
        with self.changed:
            self.changed.notify_all()
        return result

    def wait_for(self, condition: Callable[[], bool]) -> bool:
        with self.changed:
            return self.changed.wait_for(condition, WAIT_S)


def request(text: str = "hello there", voice: str = "fake-voice") -> dict:
    return {"input": text, "voice": voice, "model": None, "speed": 1.0, "response_format": "wav"}


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A storage and a function that makes a started service with a runner over both."""
    monkeypatch.setattr(jobs, "BACKOFF_S", 0.05)
    storage = WatchedStorage(f"sqlite:///{tmp_path / 'chorus.db'}")
    storage.migrate()
    services = []

    def make(engine=None, **settings) -> tuple[SpeechService, jobs.JobRunner]:
        config = Settings(data_dir=tmp_path, batch_policy="sequential", calibration_sizes=[1], voice_aliases={},
                          model_aliases={}, **settings)
        service = SpeechService(config, [engine or FakeEngine()], Metrics())
        service.start()
        services.append(service)
        assert service.loops["fake"].calibrated.wait(WAIT_S)
        return service, jobs.JobRunner(storage, service, config, lambda: OperatorSettings())

    yield storage, make
    for service in services:
        service.stop()


def run(runner: jobs.JobRunner, scenario=None) -> None:
    """Start the runner on a new event loop in debug mode, play the scenario, stop the runner (which
    waits for every attempt past its synthesis, so the files are settled when this returns)."""
    async def main():
        # enough threads for the runner even while a test's waits and held writes occupy some
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(16))
        await runner.start()
        try:
            if scenario is not None:
                await scenario()
        finally:
            await runner.stop()

    asyncio.run(main(), debug=True)


async def until(storage: WatchedStorage, condition: Callable[[], bool]) -> None:
    assert await asyncio.to_thread(storage.wait_for, condition), "timed out"


async def until_event(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, WAIT_S), "timed out"


def status_is(storage: Storage, job: dict, status: str) -> Callable[[], bool]:
    return lambda: storage.jobs.get(job["id"])["status"] == status


def run_until(runner: jobs.JobRunner, storage: WatchedStorage, job: dict, status: str) -> dict:
    run(runner, lambda: until(storage, status_is(storage, job, status)))
    return storage.jobs.get(job["id"])


def backdate(storage: Storage, job_id: str, **moments: timedelta) -> None:
    """Move a job's timestamps into the past (instead of waiting for its retention to pass)."""
    past = {name: datetime.now(UTC) - ago for name, ago in moments.items()}
    with storage.engine.begin() as connection:
        connection.execute(update(Job).where(Job.id == job_id).values(**past))


def files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


# --- retries and failures ---------------------------------------------------------------------------

def test_a_failing_job_is_retried_with_backoff_and_then_succeeds(world):
    storage, make = world
    engine = FlakyEngine()
    _, runner = make(engine, job_max_attempts=3)
    engine.failures = 2
    done = run_until(runner, storage, runner.submit(CALLER, request()), "succeeded")
    assert done["attempts"] == 3 and done["audio_s"] > 0 and done["expires_at"] > done["finished_at"]


def test_a_job_that_keeps_failing_ends_failed_with_the_reason(world):
    storage, make = world
    engine = FlakyEngine()
    _, runner = make(engine, job_max_attempts=2)
    engine.failures = 100
    failed = run_until(runner, storage, runner.submit(CALLER, request()), "failed")
    assert failed["attempts"] == 2 and "failed after 2 attempts" in failed["error"]
    assert "(RuntimeError)" in failed["error"]


def test_an_invalid_request_fails_at_once_without_retries(world):
    storage, make = world
    _, runner = make()
    failed = run_until(runner, storage, runner.submit(CALLER, request(voice="no-such-voice")), "failed")
    assert failed["attempts"] == 1 and "does not exist" in failed["error"]


def test_overload_puts_the_job_back_until_its_retry_after_without_spending_an_attempt(world):
    storage, make = world
    service, runner = make(job_max_attempts=1)  # one failure would end it
    answer, calls = service.answer, []

    async def busy_twice(*args, **options):
        calls.append(time.monotonic())
        if len(calls) <= 2:
            raise Overloaded("the queue's predicted wait is over its target; retry after 1 s", 1)
        return await answer(*args, **options)

    service.answer = busy_twice
    done = run_until(runner, storage, runner.submit(CALLER, request()), "succeeded")
    assert done["attempts"] == 1 and len(calls) == 3
    assert calls[1] - calls[0] >= 0.9 and calls[2] - calls[1] >= 0.9  # not before its Retry-After


def test_a_failing_upstream_spends_the_jobs_attempts_with_backoff_and_holds_no_other_work(world):
    storage, make = world
    service, runner = make(job_max_attempts=3)
    answer, calls = service.answer, []

    async def upstream_failing(ask, *args, **options):
        if ask.text == "upstream":
            calls.append(time.monotonic())
            raise PartFailed("the upstream of model x is unavailable: upstream answered 500: boom", 1,
                             "upstream_unavailable")
        return await answer(ask, *args, **options)

    service.answer = upstream_failing
    failing = runner.submit(CALLER, request("upstream"))
    plain = runner.submit(CALLER, request())

    async def both_end():
        await until(storage, status_is(storage, plain, "succeeded"))
        assert len(calls) < 3  # the plain job did not wait behind the failing one's backoff
        await until(storage, status_is(storage, failing, "failed"))

    run(runner, both_end)
    failed = storage.jobs.get(failing["id"])  # it waited with attempts 0 until its deadline
    assert failed["attempts"] == 3 and len(calls) == 3 and "failed after 3 attempts" in failed["error"]
    assert "answered 500" in failed["error"] and calls[2] - calls[1] >= 0.9  # backed off, its Retry-After at least
    assert storage.jobs.get(plain["id"])["attempts"] == 1


def cap_refusal(retry_after_s: float = 1) -> Degraded:
    return Degraded("the server is under heavy load: texts of up to 300 characters are accepted now (this one has "
                    "600)", retry_after_s, "degraded_text_limit", "input")


def test_a_degrade_mode_refusal_delays_the_job_until_the_mode_allows_it_without_spending_attempts(world):
    storage, make = world
    service, runner = make(job_max_attempts=1)  # one spent attempt would end it
    answer, calls = service.answer, []

    async def degraded_three_times(*args, **options):
        calls.append(time.monotonic())
        if len(calls) <= 3:  # longer than the 2 s and 4 s a retry used to wait: the episode lasts what it lasts
            raise cap_refusal()
        return await answer(*args, **options)

    service.answer = degraded_three_times
    job = runner.submit(CALLER, request())
    done = run_until(runner, storage, job, "succeeded")
    assert done["attempts"] == 1 and done["error"] is None and len(calls) == 4
    assert all(later - earlier >= 0.9 for earlier, later in zip(calls, calls[1:]))  # each after its Retry-After


def test_a_job_kept_waiting_past_its_deadline_fails_with_the_reason(world):
    storage, make = world
    service, runner = make()

    async def always_degraded(*args, **options):
        raise cap_refusal(retry_after_s=3600)  # the mode's expected end is far off

    service.answer = always_degraded
    job = runner.submit(CALLER, {**request(), "deadline_s": 1.5})
    failed = run_until(runner, storage, job, "failed")
    assert "not done within its deadline (1.5 s after it was queued)" in failed["error"]
    assert "texts of up to 300 characters are accepted now" in failed["error"]  # why it waited
    waited_s = (failed["finished_at"] - failed["created_at"]).total_seconds()
    assert 1.5 <= waited_s < 30  # at its deadline, not at the refusal's Retry-After


def test_a_deadline_longer_than_the_servers_is_refused(world):
    _, make = world
    _, runner = make(job_deadline_s=600)
    with pytest.raises(InvalidRequest) as raised:
        runner.submit(CALLER, {**request(), "deadline_s": 601})
    assert raised.value.param == "deadline_s" and "600" in raised.value.message
    assert runner.submit(CALLER, request())["request"]["deadline_s"] == 600  # the server's, kept in the job


def test_after_a_refusal_for_load_the_runner_claims_nothing_new_until_its_retry_after(world):
    """A refused job frees its place at once; offering the next job at once would only be refused too (and
    counted as more load): the runner waits the Retry-After the server gave."""
    storage, make = world
    service, runner = make(job_concurrency=1)
    answer, calls = service.answer, []

    async def refused_once(ask, *args, **options):
        calls.append((ask.text, time.monotonic()))
        if len(calls) == 1:
            raise Overloaded("the predicted wait is 18 s, over this server's target of 10 s; retry after 1 s", 1)
        return await answer(ask, *args, **options)

    service.answer = refused_once
    first, second = runner.submit(CALLER, request("first")), runner.submit(CALLER, request("second"))
    run(runner, lambda: until(storage, lambda: all(storage.jobs.get(job["id"])["status"] == "succeeded"
                                                   for job in (first, second))))
    assert calls[0][0] == "first" and calls[1][1] - calls[0][1] >= 0.9


def test_a_full_disk_puts_the_job_back_and_leaves_no_partial_file(world, tmp_path, monkeypatch):
    storage, make = world
    _, runner = make(job_max_attempts=2)
    write_bytes = Path.write_bytes

    def disk_full(path, data):
        if path.suffix != ".partial":
            return write_bytes(path, data)
        write_bytes(path, data[:100])  # the disk fills up half-way
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", disk_full)
    failed = run_until(runner, storage, runner.submit(CALLER, request()), "failed")
    assert failed["attempts"] == 2 and "No space left on device" in failed["error"]
    assert [status for _, status, _ in storage.finishes] == ["queued", "failed"]  # back to the queue first
    assert files(tmp_path / "results") == []


def test_a_finish_the_database_refuses_is_retried_until_it_is_taken(world, tmp_path, monkeypatch):
    storage, make = world
    monkeypatch.setattr(jobs, "POLL_S", 0.05)  # how soon the loop tries again (speed only)
    _, runner = make()
    refusals = []

    def database_down(job_id, status):
        if len(refusals) < 3:  # the outcome's write, then two retries, fail
            refusals.append(status)
            raise StorageError("OperationalError: database is locked")  # as the repository raises it

    storage.before_finish = database_down
    done = run_until(runner, storage, runner.submit(CALLER, request()), "succeeded")
    assert refusals == ["succeeded"] * 3 and done["attempts"] == 1
    assert files(tmp_path / "results") == [Path(done["result_path"]).name]


def test_a_storage_outage_is_logged_once_with_a_count_and_the_loop_backs_off(world, monkeypatch, caplog):
    storage, make = world
    monkeypatch.setattr(jobs, "POLL_S", 0.02)  # the backoff's first step (speed only)
    _, runner = make()
    refusals = []

    def disk_full(job_id, status):
        if len(refusals) < 5:
            refusals.append(time.monotonic())
            raise StorageError("OperationalError: database or disk is full")

    storage.before_finish = disk_full
    job = runner.submit(CALLER, request())

    async def until_recorded_and_over():
        await until(storage, status_is(storage, job, "succeeded"))
        assert await asyncio.to_thread(wait_until, lambda: runner.outage.since is None, WAIT_S)

    with caplog.at_level("INFO", logger="jobs"):
        run(runner, until_recorded_and_over)
    lines = [record.getMessage() for record in caplog.records if record.levelname in ("WARNING", "ERROR")]
    assert len(lines) == 2, lines  # not a line per failed write
    assert "storage unavailable" in lines[0] and "disk is full" in lines[0]
    assert "storage works again" in lines[1] and "(5 failed calls)" in lines[1]
    gaps = [later - earlier for earlier, later in zip(refusals, refusals[1:])]
    assert gaps[-1] > 2 * gaps[0]  # the tries spread out as the outage lasts


def test_the_outage_backoff_grows_with_its_length_up_to_a_cap():
    now = [100.0]
    outage = jobs.StorageOutage(clock=lambda: now[0])
    assert outage.retry_in_s() == jobs.POLL_S  # no outage
    outage.failed("a write", StorageError("disk full"))
    waits = []
    for _ in range(12):
        waits.append(outage.retry_in_s())
        now[0] += waits[-1]
        outage.failed("a write", StorageError("disk full"))
    assert waits[:4] == [jobs.POLL_S, jobs.POLL_S, 2 * jobs.POLL_S, 4 * jobs.POLL_S]  # doubling
    assert waits[-1] == jobs.STORAGE_RETRY_MAX_S and max(waits) == jobs.STORAGE_RETRY_MAX_S  # capped
    assert outage.failures == 13
    outage.ended()
    assert outage.since is None and outage.failures == 0 and outage.retry_in_s() == jobs.POLL_S


# --- leases -----------------------------------------------------------------------------------------

def test_an_attempt_whose_lease_passed_to_another_cannot_change_the_job(world, tmp_path):
    """This replica's attempt 1 is held in the engine past its lease (a paused process); the job is queued
    again and claimed (attempt 2). Attempt 1's outcome is then a no-op, and its file goes: the job is
    attempt 2's alone."""
    storage, make = world
    engine = FakeEngine()
    _, runner = make(engine)
    engine.calls_started = threading.Semaphore(0)
    engine.gate.clear()
    job = runner.submit(CALLER, request())

    async def take_over_while_speaking():
        try:
            assert await asyncio.to_thread(engine.calls_started.acquire, True, WAIT_S), "never reached the engine"
            backdate_lease(storage, job["id"])
            assert storage.jobs.requeue_expired() == 1
            # the same replica's id, a later attempt: only the attempt number tells them apart
            [taken] = storage.jobs.claim(1, runner.replica, 3600)
            assert taken["attempts"] == 2
        finally:
            engine.gate.set()
        await until(storage, lambda: (job["id"], "succeeded", False) in storage.finishes)

    run(runner, take_over_while_speaking)
    row = storage.jobs.get(job["id"])
    assert (row["status"], row["attempts"], row["result_path"]) == ("running", 2, None)
    assert files(tmp_path / "results") == []


def backdate_lease(storage: Storage, job_id: str) -> None:
    with storage.engine.begin() as connection:
        connection.execute(update(Job).where(Job.id == job_id).values(lease_until=datetime.now(UTC) - timedelta(1)))


# --- cancellation -----------------------------------------------------------------------------------

def test_cancelling_a_running_job_stops_its_synthesis(world, tmp_path):
    storage, make = world
    engine = FakeEngine()
    _, runner = make(engine)
    engine.calls_started = threading.Semaphore(0)  # count this job's engine calls only, not the warm-up's
    engine.gate.clear()  # the job's synthesis blocks in the engine
    job = runner.submit(CALLER, request())

    async def cancel_while_speaking():
        try:
            assert await asyncio.to_thread(engine.calls_started.acquire, True, WAIT_S), "never reached the engine"
            cancelled = await runner.cancel(job["id"])
            assert cancelled["status"] == "cancelled" == storage.jobs.get(job["id"])["status"]  # the answer is the row
            # the attempt gives up (its put-back loses to the cancel) while the engine is still busy
            await until(storage, lambda: (job["id"], "queued", False) in storage.finishes)
        finally:
            engine.gate.set()
        assert await runner.cancel(job["id"]) is None  # it has ended: nothing to cancel

    run(runner, cancel_while_speaking)
    assert storage.jobs.get(job["id"])["status"] == "cancelled" and files(tmp_path / "results") == []


def test_a_cancel_during_the_result_write_wins_and_the_file_goes(world, tmp_path, monkeypatch):
    storage, make = world
    _, runner = make()
    writing, release = threading.Event(), threading.Event()
    write = jobs._write_atomically

    def held_write(path, data):
        writing.set()
        release.wait(WAIT_S)
        write(path, data)

    monkeypatch.setattr(jobs, "_write_atomically", held_write)
    job = runner.submit(CALLER, request())

    async def cancel_while_writing():
        await until_event(writing)
        assert (await runner.cancel(job["id"]))["status"] == "cancelled"
        release.set()
        await until(storage, lambda: (job["id"], "succeeded", False) in storage.finishes)

    run(runner, cancel_while_writing)
    assert storage.jobs.get(job["id"])["status"] == "cancelled" and storage.jobs.get(job["id"])["result_path"] is None
    assert files(tmp_path / "results") == []


def test_a_cancel_during_the_finish_wins_and_the_file_goes(world, tmp_path):
    storage, make = world
    _, runner = make()
    finishing, release = threading.Event(), threading.Event()

    def held_finish(job_id, status):
        if status == "succeeded":
            finishing.set()
            release.wait(WAIT_S)

    storage.before_finish = held_finish
    job = runner.submit(CALLER, request())

    async def cancel_while_finishing():
        await until_event(finishing)
        assert (await runner.cancel(job["id"]))["status"] == "cancelled"
        release.set()

    run(runner, cancel_while_finishing)
    assert storage.finishes == [(job["id"], "succeeded", False)]
    assert storage.jobs.get(job["id"])["status"] == "cancelled" and files(tmp_path / "results") == []


def test_a_cancelled_queued_job_never_runs(world):
    storage, make = world
    _, runner = make()
    cancelled = runner.submit(CALLER, request())
    assert asyncio.run(runner.cancel(cancelled["id"]))["status"] == "cancelled"
    later = runner.submit(CALLER, request())
    run_until(runner, storage, later, "succeeded")  # the runner has claimed what there was to claim
    row = storage.jobs.get(cancelled["id"])
    assert row["status"] == "cancelled" and row["attempts"] == 0
    assert [job_id for job_id, _, _ in storage.finishes] == [later["id"]]


# --- the runner's loop ------------------------------------------------------------------------------

class ThreadRecordingEvent(asyncio.Event):
    def __init__(self):
        super().__init__()
        self.threads: set[int] = set()

    def set(self):
        self.threads.add(threading.get_ident())
        super().set()


def test_a_job_submitted_from_a_worker_thread_wakes_the_runner_on_its_loop(world, monkeypatch):
    storage, make = world
    monkeypatch.setattr(jobs, "POLL_S", 3600.0)  # only the wake-up can start the job
    _, runner = make()

    async def submit_from_a_thread():
        runner._wake = wake = ThreadRecordingEvent()  # asyncio.Event is not thread-safe
        job = await asyncio.to_thread(runner.submit, CALLER, request())  # as the API does
        await until(storage, status_is(storage, job, "succeeded"))
        assert wake.threads == {threading.get_ident()}  # set only ever on the loop's thread

    run(runner, submit_from_a_thread)


def test_jobs_left_running_by_a_dead_process_run_again(world):
    storage, make = world
    _, runner = make()
    job = runner.submit(CALLER, request())
    storage.jobs.claim(10, runner.replica, 3600)  # as if this replica's previous process had started it and died
    assert storage.jobs.get(job["id"])["status"] == "running"
    assert run_until(runner, storage, job, "succeeded")["attempts"] == 2


def test_a_dead_replicas_job_runs_again_once_its_lease_runs_out(world):
    """Another replica claimed it and stopped renewing: once the lease is past, this one runs it; a live
    replica's claim (a lease still valid) is left alone."""
    storage, make = world
    _, runner = make(job_lease_s=3)
    dead, alive = runner.submit(CALLER, request()), runner.submit(CALLER, request("Still running."))
    storage.jobs.claim(1, "other-replica:1", -1)  # claimed, its lease already past: that replica is gone
    storage.jobs.claim(1, "busy-replica:2", 3600)
    assert run_until(runner, storage, dead, "succeeded")["attempts"] == 2
    assert storage.jobs.get(alive["id"])["status"] == "running"


def test_a_full_backlog_refuses_new_jobs(world):
    _, make = world
    _, runner = make(max_job_backlog=2)
    runner.submit(CALLER, request())
    runner.submit(CALLER, request())
    with pytest.raises(Overloaded) as raised:
        runner.submit(CALLER, request())
    assert raised.value.code == "job_backlog_full" and raised.value.retry_after_s > 0


def test_jobs_run_one_priority_class_below_the_callers_interactive_requests(world, monkeypatch):
    storage, make = world
    priorities = []
    put_many = RequestQueue.put_many

    def recording(queue, items, *args, **options):  # what the queue orders them by
        priorities.extend(item.priority for item in items)
        return put_many(queue, items, *args, **options)

    monkeypatch.setattr(RequestQueue, "put_many", recording)
    service, runner = make(FakeEngine())
    run_until(runner, storage, runner.submit(CALLER, request()), "succeeded")
    assert priorities == [CALLER.tier.priority - 1]


# --- retention --------------------------------------------------------------------------------------

def test_results_past_their_retention_are_swept_with_their_input_text(world):
    storage, make = world
    _, runner = make()
    done = run_until(runner, storage, runner.submit(CALLER, request("some words")), "succeeded")
    assert runner.sweep() == 0  # within its retention
    backdate(storage, done["id"], expires_at=timedelta(seconds=1))
    assert runner.sweep() == 1
    swept = storage.jobs.get(done["id"])
    assert swept["result_path"] is None and not runner.result_file(done).exists()
    assert "input" not in swept["request"] and swept["request"]["voice"] == "fake-voice"
    public = public_job(swept)
    assert public["expired"] and public["audio_url"] is None and public["request"]["characters"] == 10
    assert runner.sweep() == 0  # nothing left to forget


def test_failed_and_cancelled_jobs_forget_their_input_text_after_the_retention(world):
    storage, make = world
    _, runner = make(result_ttl_s=600)
    failed = run_until(runner, storage, runner.submit(CALLER, request("twelve chars", "nobody")), "failed")
    cancelled = storage.jobs.cancel(runner.submit(CALLER, request("a cancelled text"))["id"])
    recent = storage.jobs.cancel(runner.submit(CALLER, request("a recent one"))["id"])
    for job in (failed, cancelled):
        backdate(storage, job["id"], finished_at=timedelta(seconds=601))
    assert runner.sweep() == 2
    for job, characters in ((failed, 12), (cancelled, 16)):
        forgotten = storage.jobs.get(job["id"])
        assert "input" not in forgotten["request"] and forgotten["status"] == job["status"]
        assert public_job(forgotten)["request"]["characters"] == characters
    assert storage.jobs.get(recent["id"])["request"]["input"] == "a recent one"


def test_stray_result_and_partial_files_are_removed_once_old(world, tmp_path):
    storage, make = world
    _, runner = make()
    done = run_until(runner, storage, runner.submit(CALLER, request()), "succeeded")
    results = tmp_path / "results"
    old = time.time() - jobs.ORPHAN_AGE_S - 60
    for name in ("job_0a.wav", "job_0b.mp3.partial", "job_0c.wav", "job_0d.wav.partial"):
        (results / name).write_bytes(b"x")
    for name in ("job_0a.wav", "job_0b.mp3.partial", Path(done["result_path"]).name):
        os.utime(results / name, (old, old))
    runner.sweep()
    # what a row points to stays, however old; strays go once old (a young one may be a write in progress)
    assert files(results) == sorted([Path(done["result_path"]).name, "job_0c.wav", "job_0d.wav.partial"])
