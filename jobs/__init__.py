"""Asynchronous speech jobs: rows in the database, results as files, run in the background.

The runner claims queued jobs a few at a time and speaks them through the same service (and
batcher) as every other request, one priority class below the caller's interactive requests;
the queue's aging makes sure they are never starved. A failed attempt is retried with backoff
up to TTS_JOB_MAX_ATTEMPTS; jobs a dead process left running are queued again at start-up, and
a result is written under its job's id, so a rerun replaces it rather than duplicating it.
Results are kept for TTS_RESULT_TTL_S, then swept.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from storage import Storage
from tts_core.access import Caller, Tier
from tts_core.config import Settings
from tts_core.degrade import OperatorSettings
from tts_core.errors import InvalidRequest, Overloaded
from tts_core.service import SpeechService

log = logging.getLogger(__name__)

POLL_S = 0.5  # how often the runner looks for due jobs when nothing wakes it
SWEEP_EVERY_S = 30.0
BACKOFF_S = 2.0  # the first retry waits this long, each next one twice as long
RETRYABLE_REFUSALS = {"degraded_text_limit"}  # refusals that pass when the load does


class JobRunner:
    def __init__(self, storage: Storage, service: SpeechService, settings: Settings,
                 operator: Callable[[], OperatorSettings]):
        self.storage = storage
        self.service = service
        self.operator = operator
        self.results_dir = settings.data_dir / "results"
        self.ttl_s = settings.result_ttl_s
        self.max_attempts = settings.job_max_attempts
        self.max_backlog = settings.max_job_backlog
        self.concurrency = settings.job_concurrency
        self.sweep_every_s = min(SWEEP_EVERY_S, max(0.5, self.ttl_s / 2))
        self._running: dict[str, asyncio.Task] = {}
        self._cancelled: set[str] = set()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    # --- lifecycle (inside the server's event loop) ------------------------------------------------

    async def start(self) -> None:
        self.results_dir.mkdir(parents=True, exist_ok=True)
        requeued = await asyncio.to_thread(self.storage.requeue_interrupted)
        if requeued:
            log.info("requeued %d jobs left running by the previous process", requeued)
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="job-runner")

    async def stop(self) -> None:
        """Running jobs go back to the queue: the next start runs them again."""
        if self._task is not None:
            self._task.cancel()
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*(task for task in [self._task, *self._running.values()] if task),
                             return_exceptions=True)

    # --- what the API calls ------------------------------------------------------------------------

    def submit(self, caller: Caller, request: dict, priority: int = 0) -> dict:
        """Queue a job (validated by the caller); Overloaded when the backlog is full."""
        queued, _, _ = self.storage.backlog()
        if queued >= self.max_backlog:
            raise Overloaded(f"{queued} jobs are waiting (the most this server keeps); retry after 30 s", 30,
                             "job_backlog_full")
        job = self.storage.add_job(f"job_{secrets.token_hex(12)}", caller.identity, caller.tier_name,
                                   caller.tier.priority * 100 + priority, request)
        if self._wake is not None:
            self._wake.set()
        return job

    def cancel(self, job_id: str) -> dict | None:
        """Cancel a queued or running job; None when it had already ended."""
        task = self._running.get(job_id)
        if task is not None:
            self._cancelled.add(job_id)
            task.cancel()
            return {**(self.storage.job(job_id) or {}), "status": "cancelled"}
        return self.storage.finish_job(job_id, "cancelled")

    # --- the loop ----------------------------------------------------------------------------------

    async def _run(self) -> None:
        next_sweep = 0.0
        while True:
            try:
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + self.sweep_every_s
                    await asyncio.to_thread(self.sweep)
                free = self.concurrency - len(self._running)
                if free > 0:
                    for job in await asyncio.to_thread(self.storage.claim_jobs, free):
                        self._running[job["id"]] = asyncio.create_task(self._execute(job))
                self.service.metrics.jobs_state(*await asyncio.to_thread(self.storage.backlog))
            except asyncio.CancelledError:
                raise
            except Exception:  # the database may be briefly unavailable: keep going
                log.exception("job runner loop failed; retrying")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), POLL_S)
            except TimeoutError:
                pass

    def _caller(self, job: dict) -> Caller:
        """The job's owner, one priority class below its interactive requests."""
        operator = self.operator()
        tier = operator.tiers.get(job["tier"]) or operator.tiers.get(operator.anonymous_tier) or Tier()
        return Caller(job["owner"], job["tier"], tier.model_copy(update={"priority": tier.priority - 1}))

    async def _execute(self, job: dict) -> None:
        request, job_id = job["request"], job["id"]
        try:
            spoken = await self.service.speak(request["input"], request["voice"], request.get("model"),
                                              request.get("speed", 1.0), request["response_format"],
                                              self._caller(job))
            path = self.results_dir / f"{job_id}.{request['response_format']}"
            await asyncio.to_thread(_write_atomically, path, spoken.data)
            expires = datetime.now(UTC) + timedelta(seconds=self.ttl_s)
            await self._finish(job_id, "succeeded", result_path=str(path), content_type=spoken.content_type,
                               audio_s=round(spoken.duration_s, 3), expires_at=expires, error=None)
        except asyncio.CancelledError:
            # Cancelled by its owner, or the server is stopping (then it runs again after the restart).
            await self._finish(job_id, "cancelled" if job_id in self._cancelled else "queued")
        except InvalidRequest as invalid:
            if invalid.code in RETRYABLE_REFUSALS:
                await self._retry_or_fail(job, invalid.message)
            else:
                await self._finish(job_id, "failed", error=invalid.message)
        except Exception as error:
            await self._retry_or_fail(job, str(error) or type(error).__name__)
        finally:
            self._running.pop(job_id, None)
            self._cancelled.discard(job_id)
            if self._wake is not None:
                self._wake.set()

    async def _finish(self, job_id: str, status: str, **fields) -> None:
        await asyncio.to_thread(self.storage.finish_job, job_id, status, **fields)
        if status != "queued":
            self.service.metrics.jobs_finished.labels(status).inc()

    async def _retry_or_fail(self, job: dict, reason: str) -> None:
        if job["attempts"] < self.max_attempts:
            delay = BACKOFF_S * 2 ** (job["attempts"] - 1)
            await self._finish(job["id"], "queued", error=f"attempt {job['attempts']} failed: {reason}",
                               not_before=datetime.now(UTC) + timedelta(seconds=delay))
            log.info("job %s: attempt %d failed (%s); retrying in %.0f s", job["id"], job["attempts"], reason, delay)
        else:
            await self._finish(job["id"], "failed", error=f"failed after {job['attempts']} attempts: {reason}")

    def sweep(self) -> int:
        """Delete result files past their retention; their jobs then answer 410 for the audio."""
        expired = self.storage.expired_results()
        for job in expired:
            Path(job["result_path"]).unlink(missing_ok=True)
            self.storage.forget_result(job["id"])
        return len(expired)


def _write_atomically(path: Path, data: bytes) -> None:
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_bytes(data)
    partial.replace(path)
