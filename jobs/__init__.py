"""Asynchronous speech jobs: rows in the database, results as files, run in the background.

A job says a text, or a dialogue's script (its request has `voices`: tts_core.request.dialogue). A dialogue's row
counts its turns made as they are made (its progress, read by any replica); an attempt makes it from its first
turn, so a job queued again (a retry, a restart) starts counting from 0, and one that succeeds has made them all.

The runner claims queued jobs a few at a time and speaks them through the same service (and
batcher) as every other request, one priority class below the caller's interactive requests;
the queue's aging makes sure they are never starved. Jobs are background work: a refusal for load
(Overloaded, and Degraded: a degrade-mode action such as the text cap) puts the job back until the
refusal's Retry-After without spending an attempt, and this runner claims nothing new until then (it
does not offer more work to a server that has just said it has too much). Each job has a deadline
(TTS_JOB_DEADLINE_S after it was queued, or the shorter one its request asked for): past it, the job
fails with the reason it was kept waiting. A failed attempt is retried with backoff up to
TTS_JOB_MAX_ATTEMPTS; what can never succeed (a non-retryable error) fails at once with the reason.
Jobs a dead process left running are queued again at start-up, and a result is written under its
job's id and attempt. Results, and the texts of ended jobs, are kept for TTS_RESULT_TTL_S, then swept.

The job's row is its state machine, and each move is one conditional update: a cancel moves
queued|running -> cancelled, an attempt moves running -> succeeded|failed|queued, so whichever
comes first wins and the other is a no-op. An attempt's moves (and lease renewals) are fenced by its
lease: they apply only while the row is still that replica's and that attempt's, so a replica that
was paused past its lease cannot change a job another replica has taken over. A cancel only stops the
attempt's synthesis; an attempt that loses deletes the file it wrote.

While the database fails, the loop backs off (waits as long as the outage has lasted, POLL_S up to
STORAGE_RETRY_MAX_S), logs the outage once when it starts and once, with a count of the failed calls,
when a write works again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from storage import JobStatus, Storage, StorageError
from tts_core.config import Settings
from tts_core.errors import ChorusError, ErrorCode, InvalidRequest, Overloaded, PartFailed
from tts_core.request.access import Caller, Tier
from tts_core.request.ask import Ask
from tts_core.request.captions import every_subtitle, word_timings
from tts_core.request.operating import OperatorSettings
from tts_core.request.script import Reading
from tts_core.service import SpeechService, SpokenAudio
from tts_core.text.frontend import NormalizationOptions

log = logging.getLogger(__name__)

POLL_S = 0.5  # how often the runner looks for due jobs when nothing wakes it
STORAGE_RETRY_MAX_S = 30.0  # the longest the loop waits between tries while the database fails
SWEEP_EVERY_S = 30.0
BACKOFF_S = 2.0  # the first retry waits this long, each next one twice as long
# Result files no job points to, and partial files, are removed once this old, not younger: a write in
# progress is one of those for a moment.
ORPHAN_AGE_S = 300.0


class JobRunner:
    def __init__(self, storage: Storage, service: SpeechService, settings: Settings,
                 operator: Callable[[], OperatorSettings]):
        self.storage = storage
        self.service = service
        self.operator = operator
        self.results_dir = settings.results_path
        self.replica, self.lease_s = settings.replica, settings.job_lease_s
        self.ttl_s = settings.result_ttl_s
        self.max_attempts = settings.job_max_attempts
        self.deadline_s = settings.job_deadline_s
        self.max_backlog = settings.max_job_backlog
        self.concurrency = settings.job_concurrency
        self.sweep_every_s = min(SWEEP_EVERY_S, max(0.5, self.ttl_s / 2))
        # All of these belong to the event loop's thread; submit() reaches it through _loop.
        self._running: dict[str, asyncio.Task] = {}  # job id -> its attempt
        self._attempts: dict[str, int] = {}  # job id -> the attempt number running here (its lease)
        self._speaking: dict[str, asyncio.Task] = {}  # job id -> the attempt's synthesis (what a cancel stops)
        self._unsettled: dict[str, tuple[int, str, dict]] = {}  # outcomes the database did not take yet
        self._progress_writes: set[asyncio.Task] = set()  # dialogues' turns made, on their way to the database
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._held_until = 0.0  # (loop time) refusals for load said when: no claims before then
        self.outage = StorageOutage()

    # --- lifecycle (inside the server's event loop) ------------------------------------------------

    async def start(self) -> None:
        self.results_dir.mkdir(parents=True, exist_ok=True)
        requeued = await asyncio.to_thread(self.storage.jobs.requeue_expired, self.replica)
        if requeued:
            log.info("requeued %d jobs left running by this replica's previous process or a dead replica", requeued)
        self._wake, self._loop = asyncio.Event(), asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name="job-runner")

    async def stop(self) -> None:
        """Syntheses in progress stop and their jobs go back to the queue (the next start runs them);
        attempts past their synthesis finish writing."""
        self._loop = None
        if self._task is not None:
            self._task.cancel()
        for speaking in self._speaking.values():
            speaking.cancel()
        await asyncio.gather(*(task for task in [self._task, *self._running.values()] if task),
                             return_exceptions=True)

    # --- what the API calls ------------------------------------------------------------------------

    def submit(self, caller: Caller, request: dict, priority: int = 0, turns: int | None = None) -> dict:
        """Queue a job (validated by the caller; `turns`: a dialogue's); Overloaded when the backlog is full. Its
        deadline is the request's deadline_s if it has one (at most TTS_JOB_DEADLINE_S), else TTS_JOB_DEADLINE_S:
        kept in the job, so a later change of the setting leaves queued jobs as they were. Blocking: call it from a
        worker thread."""
        asked = request.get("deadline_s")
        if asked is not None and asked > self.deadline_s:
            raise InvalidRequest(f"deadline_s is {asked:g}; jobs on this server may wait at most {self.deadline_s:g} s "
                                 "(TTS_JOB_DEADLINE_S)", "deadline_s", ErrorCode.DEADLINE_TOO_LONG)
        request = {**request, "deadline_s": self.deadline_s if asked is None else asked}
        queued, _, _ = self.storage.jobs.backlog()
        if queued >= self.max_backlog:
            raise Overloaded(f"{queued} jobs are waiting (the most this server keeps); retry after 30 s", 30,
                             ErrorCode.JOB_BACKLOG_FULL)
        job = self.storage.jobs.add(f"job_{secrets.token_hex(12)}", caller.identity, caller.tier_name,
                                   caller.tier.priority * 100 + priority, request, turns)
        loop = self._loop
        if loop is not None:  # asyncio.Event is not thread-safe: set it on its loop
            with contextlib.suppress(RuntimeError):  # the loop closed just now: the next start claims the job
                loop.call_soon_threadsafe(self._wake.set)
        return job

    async def cancel(self, job_id: str) -> dict | None:
        """Cancel a queued or running job; None when it had already ended. The row's cancel is the
        truth; a running attempt's synthesis is stopped, a write in progress is not (it loses)."""
        job = await asyncio.to_thread(self.storage.jobs.cancel, job_id)
        if job is not None:
            self.service.job_finished(JobStatus.CANCELLED)
            if (speaking := self._speaking.get(job_id)) is not None:
                speaking.cancel()
        return job

    # --- the loop ----------------------------------------------------------------------------------

    async def _run(self) -> None:
        next_sweep = next_lease = 0.0
        while True:
            self._wake.clear()  # before the work: a wake-up during it makes the wait below return at once
            try:
                if self.outage.since is not None:  # a write must work too: reads often do all along
                    await asyncio.to_thread(self.storage.probe_write)
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + self.sweep_every_s
                    await asyncio.to_thread(self.sweep)
                if time.monotonic() >= next_lease:  # a third of a lease: a late renewal or two leave it standing
                    next_lease = time.monotonic() + self.lease_s / 3
                    await asyncio.to_thread(self._keep_leases)
                for job_id, (attempt, status, fields) in list(self._unsettled.items()):
                    del self._unsettled[job_id]
                    await self._finish(job_id, attempt, status, **fields)
                free = self.concurrency - len(self._running)
                if free > 0 and asyncio.get_running_loop().time() >= self._held_until:
                    for job in await asyncio.to_thread(self.storage.jobs.claim, free, self.replica, self.lease_s):
                        self._launch(job)
                self.service.jobs_waiting(*await asyncio.to_thread(self.storage.jobs.backlog))
                if not self._unsettled:  # a whole round worked, and every outcome is recorded: over (if one was on)
                    self.outage.ended()
            except StorageError as error:  # the database may be unavailable for a while: keep going
                self.outage.failed("the job runner's loop", error)
            except Exception:
                log.exception("job runner loop failed; retrying")
            if self.outage.since is not None:  # wake-ups do not shorten the backoff
                await asyncio.sleep(self.outage.retry_in_s())
                continue
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that comes as the
            # event is set, and stop() would then wait for ever
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_S):
                    await self._wake.wait()

    def _keep_leases(self) -> None:
        """Renew the leases of the attempts this replica runs; queue again the jobs of replicas that died."""
        self.storage.jobs.renew_leases(self.replica, dict(self._attempts), self.lease_s)
        if requeued := self.storage.jobs.requeue_expired():
            log.warning("requeued %d jobs whose replica stopped renewing their leases", requeued)

    def result_file(self, job: dict) -> Path | None:
        """Where a job's result is: under this replica's results folder (replicas share one), by its name."""
        return None if job["result_path"] is None else self.results_dir / Path(job["result_path"]).name

    def _wake_in(self, delay_s: float) -> None:
        """Look for due jobs again when a job put back with a delay is due."""
        asyncio.get_running_loop().call_later(delay_s, self._wake.set)

    def _caller(self, job: dict) -> Caller:
        """The job's owner, one priority class below its interactive requests."""
        operator = self.operator()
        tier = operator.tiers.get(job["tier"]) or operator.tiers.get(operator.anonymous_tier) or Tier()
        return Caller(job["owner"], job["tier"], tier.model_copy(update={"priority": tier.priority - 1}))

    def _deadline(self, job: dict) -> datetime:
        """When the job gives up: its deadline_s (jobs from before deadlines: TTS_JOB_DEADLINE_S) after it was
        queued."""
        return job["created_at"] + timedelta(seconds=job["request"].get("deadline_s", self.deadline_s))

    def _launch(self, job: dict) -> None:
        """Start an attempt; its synthesis is a task of its own, so that a cancel can stop just that. A job
        claimed past its deadline fails instead, with what kept it waiting."""
        self._attempts[job["id"]] = job["attempts"]
        if datetime.now(UTC) >= self._deadline(job):
            self._running[job["id"]] = asyncio.create_task(self._expire(job))
            return
        log.info("job %s: attempt %d started on %s", job["id"], job["attempts"], self.replica)
        speaking = asyncio.create_task(self._speak(job))
        self._speaking[job["id"]] = speaking
        self._running[job["id"]] = asyncio.create_task(self._execute(job, speaking))

    async def _expire(self, job: dict) -> None:
        try:
            waited = f"; {job['error']}" if job["error"] else ""
            deadline_s = job["request"].get("deadline_s", self.deadline_s)
            if await self._finish(job["id"], job["attempts"], JobStatus.FAILED,
                                  error=f"not done within its deadline ({deadline_s:g} s after it was queued){waited}"):
                log.info("job %s: failed: past its deadline", job["id"])
        finally:
            self._ended(job["id"])

    def _ended(self, job_id: str) -> None:
        self._running.pop(job_id, None)
        self._attempts.pop(job_id, None)
        self._wake.set()

    async def _speak(self, job: dict) -> SpokenAudio:
        request = job["request"]
        # Jobs queued before the text front end kept their text already normalised: spoken as written.
        normalization = NormalizationOptions(**request.get("normalization", {"normalize": False}))
        reading = Reading(normalization, request.get("input_type", "auto"), instructions=request.get("instructions"))
        asked = dict(model=request.get("model"), speed=request.get("speed", 1.0),
                     response_format=request["response_format"], sample_rate=request.get("sample_rate"),
                     reading=reading, caller=self._caller(job))
        if is_dialogue(request):
            return await self.service.answer(Ask(script=request["script"], voices=request["voices"],
                                                 words=request.get("captions", False), **asked),
                                             on_turn=lambda made: self._record_progress(job, made))
        return await self.service.answer(Ask(request["input"], request["voice"], **asked))

    def _record_progress(self, job: dict, made: int) -> None:
        """A dialogue's turns made so far, written in the background (its synthesis goes on meanwhile)."""
        write = asyncio.create_task(asyncio.to_thread(self.storage.jobs.progress, job["id"], self.replica,
                                                      job["attempts"], made))
        self._progress_writes.add(write)
        write.add_done_callback(self._progress_written)

    def _progress_written(self, write: asyncio.Task) -> None:
        self._progress_writes.discard(write)
        error = None if write.cancelled() else write.exception()
        if isinstance(error, StorageError):  # the next turn's write says it again, or the job's end does
            self.outage.failed("recording a dialogue's progress", error)
        elif error is not None:
            log.warning("could not record a dialogue's progress: %r", error)

    # --- one attempt -------------------------------------------------------------------------------

    async def _execute(self, job: dict, speaking: asyncio.Task) -> None:
        """Await the synthesis, write the result, finish the row: every way out finishes it."""
        job_id = job["id"]
        try:
            try:
                spoken = await speaking
            finally:
                self._speaking.pop(job_id, None)
            await self._succeed(job, spoken)
        except asyncio.CancelledError:  # its owner cancelled it (then this finish loses) or the server stops
            await self._put_back(job, 0)
        except PartFailed as failed:  # a part it needs failed (an upstream's 5xx): an attempt spent, backed off
            await self._retry_or_fail(job, failed.message, failed.retry_after_s or 0)
        except Overloaded as busy:  # the server's load (a full queue, a degrade-mode action), not the job's fault
            await self._wait_for_load(job, busy)
        except ChorusError as error:
            if error.retryable:
                await self._retry_or_fail(job, error.message)
            else:  # it can never succeed as asked: at once, with the reason
                await self._finish(job_id, job["attempts"], JobStatus.FAILED, error=error.message)
        except Exception as error:  # an unexpected failure, or the result could not be written (disk full)
            log.warning("job %s: attempt %d failed: %r", job_id, job["attempts"], error)
            await self._retry_or_fail(job, str(error) or type(error).__name__)
        finally:
            self._ended(job_id)

    async def _succeed(self, job: dict, spoken: SpokenAudio) -> None:
        # stored by name (replicas mount the folder anywhere), one per attempt: a stale attempt's file is never
        # the one the row points to
        name = f"{job['id']}.{job['attempts']}.{job['request']['response_format']}"
        await asyncio.to_thread(_write_atomically, self.results_dir / name, spoken.data)
        expires = datetime.now(UTC) + timedelta(seconds=self.ttl_s)
        if await self._finish(job["id"], job["attempts"], JobStatus.SUCCEEDED, result_path=name,
                              content_type=spoken.content_type, audio_s=round(spoken.duration_s, 3),
                              expires_at=expires, error=None, **_dialogue_outcome(job, spoken)):
            log.info("job %s: succeeded on %s", job["id"], self.replica)

    async def _wait_for_load(self, job: dict, busy: Overloaded) -> None:
        """Put the job back until the refusal's Retry-After (no later than its deadline, where it fails with this
        reason), and claim nothing new here until then."""
        remaining_s = (self._deadline(job) - datetime.now(UTC)).total_seconds()
        delay_s = max(0.0, min(busy.retry_after_s, remaining_s))
        now = asyncio.get_running_loop().time()
        # until the first job put back is due, no later: a hold never keeps a refused job past its deadline
        self._held_until = now + delay_s if self._held_until <= now else min(self._held_until, now + delay_s)
        log.info("job %s: waiting %.0f s, the server refused it for now (%s)", job["id"], delay_s, busy.code)
        await self._put_back(job, delay_s, f"waiting: {busy.message}")

    async def _put_back(self, job: dict, delay_s: float, reason: str | None = None) -> None:
        """Queue the job again after delay_s, as if this attempt had not happened (with the reason it waits)."""
        due = datetime.now(UTC) + timedelta(seconds=delay_s)
        await self._finish(job["id"], job["attempts"], JobStatus.QUEUED, attempts=job["attempts"] - 1, not_before=due,
                           **({"error": reason} if reason else {}))
        self._wake_in(delay_s)

    async def _retry_or_fail(self, job: dict, reason: str, retry_after_s: float = 0) -> None:
        """The attempt failed: queued again after the backoff (or the failure's Retry-After, if longer), claiming
        nothing less meanwhile, until TTS_JOB_MAX_ATTEMPTS; then failed with the reason."""
        if job["attempts"] < self.max_attempts:
            delay = max(BACKOFF_S * 2 ** (job["attempts"] - 1), retry_after_s)
            await self._finish(job["id"], job["attempts"], JobStatus.QUEUED,
                               error=f"attempt {job['attempts']} failed: {reason}",
                               not_before=datetime.now(UTC) + timedelta(seconds=delay))
            self._wake_in(delay)
            log.info("job %s: attempt %d failed (%s); retrying in %.0f s", job["id"], job["attempts"], reason, delay)
        else:
            await self._finish(job["id"], job["attempts"], JobStatus.FAILED,
                               error=f"failed after {job['attempts']} attempts: {reason}")

    async def _finish(self, job_id: str, attempt: int, status: str, **fields) -> bool:
        """Record an attempt's outcome; False when it lost (a cancel came first, or the job is no longer this
        attempt's) or is not recorded yet: when the database cannot take it now, the loop tries again until it
        does (a job never stays running for want of one write)."""
        try:
            won = await asyncio.to_thread(self._settle, job_id, attempt, status, fields)
        except StorageError as error:
            self.outage.failed(f"recording job {job_id} {status}", error)
            self._unsettled[job_id] = (attempt, status, fields)
            return False
        if won and status != JobStatus.QUEUED:
            self.service.job_finished(status)
        return won

    def _settle(self, job_id: str, attempt: int, status: str, fields: dict) -> bool:
        """Move the row from running (in a worker thread); False when a cancel came first or the lease has
        passed to another attempt."""
        if self.storage.jobs.finish(job_id, self.replica, attempt, status, **fields) is not None:
            return True
        name = fields.get("result_path")
        # Delete the file only if no row points to it: when this is a retry, the earlier try may have
        # been written after all (its error came after the commit).
        if name and (self.storage.jobs.get(job_id) or {}).get("result_path") != name:
            (self.results_dir / name).unlink(missing_ok=True)
        return False

    # --- retention ---------------------------------------------------------------------------------

    def sweep(self) -> int:
        """Forget results and input texts past their retention (their jobs then answer 410 for the
        audio), and remove stray files. Blocking; returns how many jobs were expired."""
        expired = self.storage.jobs.expired(self.ttl_s)
        for job in expired:
            self.storage.jobs.expire(job["id"])  # the row first: a crash here leaves a stray file, not a dangling row
            if (path := self.result_file(job)) is not None:
                path.unlink(missing_ok=True)
        self._remove_stray_files()
        return len(expired)

    def _remove_stray_files(self) -> None:
        """Result files no job points to (a crash between the write and the row) and partial files (a
        crash during the write), once they are ORPHAN_AGE_S old."""
        cutoff = time.time() - ORPHAN_AGE_S
        old = [path for path in self.results_dir.iterdir() if _modified_before(path, cutoff)]
        if not old:
            return
        kept = {Path(path).name for path in self.storage.jobs.result_paths()}
        for path in old:
            if path.suffix == ".partial" or path.name not in kept:
                path.unlink(missing_ok=True)


def is_dialogue(request: dict) -> bool:
    """A dialogue's job (a script and its speakers' voices), not a text's."""
    return "voices" in request


def _dialogue_outcome(job: dict, spoken: SpokenAudio) -> dict:
    """What a dialogue's row keeps besides its audio: every turn made, and the captions if they were asked for (as
    POST /v1/audio/dialogue/captioned answers them, and as subtitles)."""
    if job["turns"] is None:
        return {}
    if not job["request"].get("captions"):
        return {"turns_done": job["turns"]}
    words = list(spoken.words or ())
    captions = {"words": [word.as_json() for word in words], "turns": [turn.as_json() for turn in spoken.turns],
                "word_timings": word_timings(words), **every_subtitle(words)}
    return {"turns_done": job["turns"], "captions": json.dumps(captions)}


def _modified_before(path: Path, cutoff: float) -> bool:
    try:
        return path.stat().st_mtime < cutoff
    except FileNotFoundError:  # removed meanwhile
        return False


def _write_atomically(path: Path, data: bytes) -> None:
    partial = path.with_suffix(path.suffix + ".partial")
    try:
        partial.write_bytes(data)
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)  # a full disk leaves no partial file behind
        raise


class StorageOutage:
    """The runner's database outages: one log line when one starts, one when it ends (with how long it lasted
    and how many calls failed), and the backoff between tries: as long as the outage has lasted so far, from
    POLL_S up to STORAGE_RETRY_MAX_S (so the waits double, and a long outage costs a try every half minute)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self.since: float | None = None
        self.failures = 0

    def failed(self, what: str, error: StorageError) -> None:
        self.failures += 1
        if self.since is None:
            self.since = self._clock()
            log.error("job runner: storage unavailable (%s: %s); retrying with backoff, further failures counted "
                      "until it works again", what, error)

    def retry_in_s(self) -> float:
        if self.since is None:
            return POLL_S
        return min(STORAGE_RETRY_MAX_S, max(POLL_S, self._clock() - self.since))

    def ended(self) -> None:
        if self.since is not None:
            log.warning("job runner: storage works again after %.1f s (%d failed calls)",
                        self._clock() - self.since, self.failures)
            self.since, self.failures = None, 0
