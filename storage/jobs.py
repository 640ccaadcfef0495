"""Asynchronous speech jobs (a text, or a dialogue's script): the queue rows, the leases of the replicas that run
them, a dialogue's progress in turns, and their results' retention."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, case, func, or_, select, update

from .database import Database, aware, loads, now
from .models import Job, JobStatus

# An attempt starts a dialogue from its first turn: a job queued again has none of its turns made (speech jobs
# have no turns to count).
NO_TURNS_MADE = case((Job.turns.is_(None), None), else_=0)
TEXT_KEYS = ("input", "script")  # what a job says: a text, or a dialogue's script


class Jobs:
    def __init__(self, database: Database):
        self._database = database

    def add(self, job_id: str, owner: str, tier: str, priority: int, request: dict, turns: int | None = None
            ) -> dict:
        """A queued job; `turns`: a dialogue's, in all (its progress counts them)."""
        at = now()
        with self._database.transaction(write=True) as session:
            row = Job(id=job_id, owner=owner, tier=tier, priority=priority, status=JobStatus.QUEUED,
                      request=json.dumps(request), attempts=0, created_at=at, not_before=at, turns=turns,
                      turns_done=None if turns is None else 0)
            session.add(row)
            return _job_dict(row)

    def get(self, job_id: str) -> dict | None:
        with self._database.transaction() as session:
            row = session.get(Job, job_id)
            return _job_dict(row) if row else None

    def owned_by(self, owner: str, limit: int = 100, status: str | None = None) -> list[dict]:
        """The owner's jobs, newest first; with `status`, only those in it."""
        query = select(Job).where(Job.owner == owner)
        if status is not None:
            query = query.where(Job.status == status)
        with self._database.transaction() as session:
            return [_job_dict(row) for row in session.scalars(query.order_by(Job.created_at.desc()).limit(limit))]

    def claim(self, limit: int, owner: str = "", lease_s: float = 30.0) -> list[dict]:
        """Queued jobs that are due, highest priority then oldest first, marked running (attempt + 1) under
        the owner's lease. Replicas claim at once without taking one job twice: the rows are locked as
        they are read (FOR UPDATE SKIP LOCKED on Postgres: another replica's claim passes them by; SQLite
        has one writer at a time)."""
        at = now()
        with self._database.transaction(write=True) as session:
            query = (select(Job).where(Job.status == JobStatus.QUEUED, Job.not_before <= at)
                     .order_by(Job.priority.desc(), Job.created_at).limit(limit))
            if self._database.dialect != "sqlite":
                query = query.with_for_update(skip_locked=True)
            rows = list(session.scalars(query))
            for row in rows:
                row.status, row.started_at, row.attempts = JobStatus.RUNNING, at, row.attempts + 1
                row.lease_owner, row.lease_until = owner, at + timedelta(seconds=lease_s)
            return [_job_dict(row) for row in rows]

    def renew_leases(self, owner: str, attempts: dict[str, int], lease_s: float) -> None:
        """The owner still runs these attempts (job id -> attempt): the leases it still holds last lease_s
        from now; one another replica has taken over since stays that one's."""
        if not attempts:
            return
        held = or_(*(and_(Job.id == job_id, Job.attempts == attempt) for job_id, attempt in attempts.items()))
        with self._database.transaction(write=True) as session:
            session.execute(update(Job).where(held, Job.status == JobStatus.RUNNING, Job.lease_owner == owner)
                            .values(lease_until=now() + timedelta(seconds=lease_s)))

    def requeue_expired(self, owner: str | None = None) -> int:
        """Running jobs whose lease has run out (their replica died or hangs) go back to the queue; with
        `owner` (a replica starting again under its id), that replica's own at once too."""
        stale = or_(Job.lease_until.is_(None), Job.lease_until < now())
        if owner is not None:
            stale = or_(stale, Job.lease_owner == owner)
        with self._database.transaction(write=True) as session:
            return session.execute(update(Job).where(Job.status == JobStatus.RUNNING, stale)
                                   .values(status=JobStatus.QUEUED, lease_owner=None, lease_until=None,
                                           turns_done=NO_TURNS_MADE)).rowcount

    def cancel(self, job_id: str) -> dict | None:
        """queued|running -> cancelled, in one conditional update; None when the job had ended (or
        never was). Whatever a running attempt does afterwards, this row stays cancelled."""
        return self._move(job_id, (JobStatus.QUEUED, JobStatus.RUNNING), JobStatus.CANCELLED, finished_at=now())

    def finish(self, job_id: str, holder: str, attempt: int, status: str, **fields: Any) -> dict | None:
        """running -> succeeded, failed or back to queued, by the lease's holder: the replica and attempt
        that claimed it last. None when the job is no longer that attempt's (a cancel came first and wins,
        or the lease ran out and the job was queued again or taken by another attempt: that one's row)."""
        if status != JobStatus.QUEUED:
            fields.setdefault("finished_at", now())
        else:
            fields.setdefault("turns_done", NO_TURNS_MADE)
        return self._move(job_id, (JobStatus.RUNNING,), status, Job.lease_owner == holder, Job.attempts == attempt,
                          **fields)

    def progress(self, job_id: str, holder: str, attempt: int, turns_done: int) -> None:
        """A dialogue's attempt has made turns_done of its turns: recorded while the attempt holds the job, and only
        forward (writes from worker threads may land out of order)."""
        with self._database.transaction(write=True) as session:
            session.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.RUNNING,
                                              Job.lease_owner == holder, Job.attempts == attempt,
                                              Job.turns_done < turns_done).values(turns_done=turns_done))

    def _move(self, job_id: str, sources: tuple[str, ...], status: str, *conditions: Any,
              **fields: Any) -> dict | None:
        with self._database.transaction(write=True) as session:
            moved = session.execute(update(Job).where(Job.id == job_id, Job.status.in_(sources), *conditions)
                                    .values(status=status, **fields)).rowcount
            return _job_dict(session.get(Job, job_id)) if moved else None

    def backlog(self) -> tuple[int, int, float | None]:
        """Queued jobs, running jobs, and the age in seconds of the oldest queued one."""
        with self._database.transaction() as session:
            waiting = Job.status.in_((JobStatus.QUEUED, JobStatus.RUNNING))
            counts = dict(session.execute(select(Job.status, func.count()).where(waiting).group_by(Job.status)).all())
            oldest = session.scalar(select(func.min(Job.created_at)).where(Job.status == JobStatus.QUEUED))
        age = None if oldest is None else (now() - aware(oldest)).total_seconds()
        return counts.get(JobStatus.QUEUED, 0), counts.get(JobStatus.RUNNING, 0), age

    def expired(self, ttl_s: float) -> list[dict]:
        """Ended jobs past their retention that still keep a result file or their input text:
        succeeded ones from expires_at, failed and cancelled ones ttl_s after they ended."""
        at = now()
        cutoff = at - timedelta(seconds=ttl_s)
        ended_long_ago = and_(Job.status.in_((JobStatus.FAILED, JobStatus.CANCELLED)), Job.finished_at <= cutoff)
        # add stores the request as json.dumps writes it; a dropped text leaves no "input" (or "script") key
        keeps_data = or_(Job.result_path.is_not(None), Job.captions.is_not(None),
                         *(Job.request.contains(f'"{key}": ') for key in TEXT_KEYS))
        with self._database.transaction() as session:
            rows = session.scalars(select(Job).where(keeps_data, or_(Job.expires_at <= at, ended_long_ago)))
            return [_job_dict(row) for row in rows]

    def expire(self, job_id: str) -> None:
        """Forget a job's result file, captions and text; the other request fields and the text's length stay."""
        with self._database.transaction(write=True) as session:
            row = session.get(Job, job_id)
            if row is not None:
                row.result_path, row.captions, row.request = None, None, json.dumps(_without_text(loads(row.request)))

    def result_paths(self) -> list[str]:
        """The result files job rows point to."""
        with self._database.transaction() as session:
            return list(session.scalars(select(Job.result_path).where(Job.result_path.is_not(None))))


def _without_text(request: dict) -> dict:
    """The request without what it says; its length stays (a dialogue's is kept in it from the start)."""
    if not any(key in request for key in TEXT_KEYS):
        return request
    return ({key: value for key, value in request.items() if key not in TEXT_KEYS}
            | {"characters": request.get("characters", len(request.get("input", "")))})


def _job_dict(row: Job) -> dict:
    moments = ("created_at", "not_before", "started_at", "finished_at", "expires_at")
    return {"id": row.id, "owner": row.owner, "tier": row.tier, "priority": row.priority, "status": row.status,
            "request": loads(row.request), "attempts": row.attempts, "error": row.error,
            **{name: aware(getattr(row, name)) if getattr(row, name) else None for name in moments},
            "result_path": row.result_path, "content_type": row.content_type, "audio_s": row.audio_s,
            "turns": row.turns, "turns_done": row.turns_done, "captions": row.captions}
