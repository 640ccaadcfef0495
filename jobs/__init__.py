"""Asynchronous speech jobs: rows in the database, results as files, run in the background.

The runner claims queued jobs a few at a time and speaks them through the same service (and
batcher) as every other request, one priority class below the caller's interactive requests;
the queue's aging makes sure they are never starved. A failed attempt is retried with backoff
up to TTS_JOB_MAX_ATTEMPTS; a refusal for load (Overloaded) puts the job back without spending an
attempt; jobs a dead process left running are queued again at start-up, and a result is written
under its job's id, so a rerun replaces it rather than duplicating it. Results, and the texts of
ended jobs, are kept for TTS_RESULT_TTL_S, then swept.

The job's row is its state machine, and each move is one conditional update: a cancel moves
queued|running -> cancelled, an attempt moves running -> succeeded|failed|queued, so whichever
comes first wins and the other is a no-op. A cancel only stops the attempt's synthesis; an attempt
that loses to a cancel deletes the file it wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from storage import Storage, StorageError
from tts_core.access import Caller, Tier
from tts_core.config import Settings
from tts_core.degrade import OperatorSettings
from tts_core.errors import ChorusError, Overloaded
from tts_core.frontend import NormalizationOptions
from tts_core.script import Reading
from tts_core.service import SpeechService, SpokenAudio

log = logging.getLogger(__name__)

POLL_S = 0.5  # how often the runner looks for due jobs when nothing wakes it
SWEEP_EVERY_S = 30.0
BACKOFF_S = 2.0  # the first retry waits this long, each next one twice as long
# Result files no job points to, and partial files, are removed once this old, not younger: a write in
# progress is one of those for a moment.
ORPHAN_AGE_S = 300.0
RETRYABLE_REFUSALS = {"degraded_text_limit"}  # refusals that pass when the load does


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
        self.max_backlog = settings.max_job_backlog
        self.concurrency = settings.job_concurrency
        self.sweep_every_s = min(SWEEP_EVERY_S, max(0.5, self.ttl_s / 2))
        # All of these belong to the event loop's thread; submit() reaches it through _loop.
        self._running: dict[str, asyncio.Task] = {}  # job id -> its attempt
        self._speaking: dict[str, asyncio.Task] = {}  # job id -> the attempt's synthesis (what a cancel stops)
        self._unsettled: dict[str, tuple[str, dict]] = {}  # outcomes the database did not take yet
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._storage_failing = False  # the loop's last storage call failed (logged once per outage)

    # --- lifecycle (inside the server's event loop) ------------------------------------------------

    async def start(self) -> None:
        self.results_dir.mkdir(parents=True, exist_ok=True)
        requeued = await asyncio.to_thread(self.storage.requeue_expired, self.replica)
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

    def submit(self, caller: Caller, request: dict, priority: int = 0) -> dict:
        """Queue a job (validated by the caller); Overloaded when the backlog is full. Blocking: call
        it from a worker thread."""
        queued, _, _ = self.storage.backlog()
        if queued >= self.max_backlog:
            raise Overloaded(f"{queued} jobs are waiting (the most this server keeps); retry after 30 s", 30,
                             "job_backlog_full")
        job = self.storage.add_job(f"job_{secrets.token_hex(12)}", caller.identity, caller.tier_name,
                                   caller.tier.priority * 100 + priority, request)
        loop = self._loop
        if loop is not None:  # asyncio.Event is not thread-safe: set it on its loop
            with contextlib.suppress(RuntimeError):  # the loop closed just now: the next start claims the job
                loop.call_soon_threadsafe(self._wake.set)
        return job

    async def cancel(self, job_id: str) -> dict | None:
        """Cancel a queued or running job; None when it had already ended. The row's cancel is the
        truth; a running attempt's synthesis is stopped, a write in progress is not (it loses)."""
        job = await asyncio.to_thread(self.storage.cancel_job, job_id)
        if job is not None:
            self.service.metrics.jobs_finished.labels("cancelled").inc()
            if (speaking := self._speaking.get(job_id)) is not None:
                speaking.cancel()
        return job

    # --- the loop ----------------------------------------------------------------------------------

    async def _run(self) -> None:
        next_sweep = next_lease = 0.0
        while True:
            self._wake.clear()  # before the work: a wake-up during it makes the wait below return at once
            try:
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + self.sweep_every_s
                    await asyncio.to_thread(self.sweep)
                if time.monotonic() >= next_lease:  # a third of a lease: a late renewal or two leave it standing
                    next_lease = time.monotonic() + self.lease_s / 3
                    await asyncio.to_thread(self._keep_leases)
                for job_id, (status, fields) in list(self._unsettled.items()):
                    del self._unsettled[job_id]
                    await self._finish(job_id, status, **fields)
                free = self.concurrency - len(self._running)
                if free > 0:
                    for job in await asyncio.to_thread(self.storage.claim_jobs, free, self.replica, self.lease_s):
                        log.info("job %s: attempt %d started on %s", job["id"], job["attempts"], self.replica)
                        self._launch(job)
                self.service.metrics.jobs_state(*await asyncio.to_thread(self.storage.backlog))
                if self._storage_failing:
                    self._storage_failing = False
                    log.warning("job runner: storage works again")
            except StorageError as error:  # the database may be unavailable for a while: keep going
                if not self._storage_failing:  # once per outage, not every POLL_S
                    log.error("job runner: storage unavailable (%s); trying again every %.1f s", error, POLL_S)
                self._storage_failing = True
            except Exception:
                log.exception("job runner loop failed; retrying")
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that comes as the
            # event is set, and stop() would then wait for ever
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_S):
                    await self._wake.wait()

    def _keep_leases(self) -> None:
        """Renew the leases of the jobs this replica runs; queue again those of replicas that died."""
        self.storage.renew_leases(self.replica, list(self._running), self.lease_s)
        if requeued := self.storage.requeue_expired():
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

    def _launch(self, job: dict) -> None:
        """Start an attempt; its synthesis is a task of its own, so that a cancel can stop just that."""
        speaking = asyncio.create_task(self._speak(job))
        self._speaking[job["id"]] = speaking
        self._running[job["id"]] = asyncio.create_task(self._execute(job, speaking))

    async def _speak(self, job: dict) -> SpokenAudio:
        request = job["request"]
        # Jobs queued before the text front end kept their text already normalised: spoken as written.
        normalization = NormalizationOptions(**request.get("normalization", {"normalize": False}))
        return await self.service.speak(request["input"], request["voice"], request.get("model"),
                                        request.get("speed", 1.0), request["response_format"], self._caller(job),
                                        Reading(normalization, request.get("input_type", "auto")),
                                        sample_rate=request.get("sample_rate"))

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
        except Overloaded as busy:  # the server's load, not the job: no attempt spent
            await self._put_back(job, busy.retry_after_s)
        except ChorusError as error:
            if error.retryable or error.code in RETRYABLE_REFUSALS:
                await self._retry_or_fail(job, error.message)
            else:
                await self._finish(job_id, "failed", error=error.message)
        except Exception as error:  # an unexpected failure, or the result could not be written (disk full)
            log.warning("job %s: attempt %d failed: %r", job_id, job["attempts"], error)
            await self._retry_or_fail(job, str(error) or type(error).__name__)
        finally:
            self._running.pop(job_id, None)
            self._wake.set()

    async def _succeed(self, job: dict, spoken: SpokenAudio) -> None:
        name = f"{job['id']}.{job['request']['response_format']}"  # stored by name: replicas mount the folder anywhere
        await asyncio.to_thread(_write_atomically, self.results_dir / name, spoken.data)
        expires = datetime.now(UTC) + timedelta(seconds=self.ttl_s)
        if await self._finish(job["id"], "succeeded", result_path=name, content_type=spoken.content_type,
                              audio_s=round(spoken.duration_s, 3), expires_at=expires, error=None):
            log.info("job %s: succeeded on %s", job["id"], self.replica)

    async def _put_back(self, job: dict, delay_s: float) -> None:
        """Queue the job again after delay_s, as if this attempt had not happened."""
        due = datetime.now(UTC) + timedelta(seconds=delay_s)
        await self._finish(job["id"], "queued", attempts=job["attempts"] - 1, not_before=due)
        self._wake_in(delay_s)

    async def _retry_or_fail(self, job: dict, reason: str) -> None:
        if job["attempts"] < self.max_attempts:
            delay = BACKOFF_S * 2 ** (job["attempts"] - 1)
            await self._finish(job["id"], "queued", error=f"attempt {job['attempts']} failed: {reason}",
                               not_before=datetime.now(UTC) + timedelta(seconds=delay))
            self._wake_in(delay)
            log.info("job %s: attempt %d failed (%s); retrying in %.0f s", job["id"], job["attempts"], reason, delay)
        else:
            await self._finish(job["id"], "failed", error=f"failed after {job['attempts']} attempts: {reason}")

    async def _finish(self, job_id: str, status: str, **fields) -> bool:
        """Record an attempt's outcome; False when it lost (a cancel came first) or is not recorded yet: when
        the database cannot take it now, the loop tries again until it does (a job never stays running for
        want of one write)."""
        try:
            won = await asyncio.to_thread(self._settle, job_id, status, fields)
        except StorageError as error:
            log.warning("job %s: could not record %s (%r); trying again", job_id, status, error)
            self._unsettled[job_id] = (status, fields)
            return False
        if won and status != "queued":
            self.service.metrics.jobs_finished.labels(status).inc()
        return won

    def _settle(self, job_id: str, status: str, fields: dict) -> bool:
        """Move the row from running (in a worker thread); False when a cancel came first."""
        if self.storage.finish_job(job_id, status, **fields) is not None:
            return True
        name = fields.get("result_path")
        # Delete the file only if no row points to it: when this is a retry, the earlier try may have
        # been written after all (its error came after the commit).
        if name and (self.storage.job(job_id) or {}).get("result_path") != name:
            (self.results_dir / name).unlink(missing_ok=True)
        return False

    # --- retention ---------------------------------------------------------------------------------

    def sweep(self) -> int:
        """Forget results and input texts past their retention (their jobs then answer 410 for the
        audio), and remove stray files. Blocking; returns how many jobs were expired."""
        expired = self.storage.expired_jobs(self.ttl_s)
        for job in expired:
            self.storage.expire_job(job["id"])  # the row first: a crash here leaves a stray file, not a dangling row
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
        kept = {Path(path).name for path in self.storage.result_paths()}
        for path in old:
            if path.suffix == ".partial" or path.name not in kept:
                path.unlink(missing_ok=True)


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
