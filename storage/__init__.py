"""Persistence: SQLAlchemy 2 over SQLite by default (any SQLAlchemy URL works), Alembic migrations.

Small repository methods only; nothing here knows what a setting means (that is tts_core's job).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.util.exc import CommandError
from sqlalchemy import and_, create_engine, delete, event, func, or_, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from .models import (
    ApiKey,
    AuditEntry,
    ClonedVoiceRow,
    Job,
    JobStatus,
    LexiconRow,
    LexiconVersion,
    ReplicaRow,
    RequestLogEntry,
    Setting,
)

log = logging.getLogger(__name__)
MIGRATIONS = Path(__file__).parent / "migrations"
MIGRATION_LOCK = 0x43686F72  # "Chor": the Postgres advisory lock that migrations hold


class AlreadyExists(Exception):
    """A row with that unique key is there already (the message names it)."""


class StorageError(Exception):
    """The database cannot do what was asked now (unreachable, locked, full, read-only, a bad URL).
    Every Storage method raises this in place of the driver's errors, so callers handle one kind; its
    text is the driver's, for the log and the operator, never for API callers."""


# What a database failure looks like from here: the driver's errors as SQLAlchemy wraps them, and the
# file system's under SQLite.
FAILURES = (DBAPIError, OSError)
# Failures that leave a connection unusable although the database may be well again: SQLite opens a file it
# cannot write read-only and keeps that connection read-only for good (SQLITE_READONLY), and after an I/O error
# or a journal it could not open (IOERR, CANTOPEN) its view of the file may be stale; Postgres answers 25006 on
# a connection to a server that has become a read-only standby. pool_pre_ping passes all of these (a SELECT
# works), so the connection, and the pool's others opened under the same fault, are dropped when one is seen.
SQLITE_STALE_CODES = {8, 10, 14}  # primary result codes: READONLY, IOERR, CANTOPEN
POSTGRES_STALE_STATES = {"25006"}  # read_only_sql_transaction


@contextmanager
def _guarded() -> Iterator[None]:
    try:
        yield
    except FAILURES as error:
        cause = getattr(error, "orig", None) or error  # the driver's own error, without the SQL and its parameters
        raise StorageError(f"{type(cause).__name__}: {cause}") from error


def _loads(value: str) -> Any:
    """JSON as stored; Infinity and NaN (which older versions could store) come back as strings, so that
    they fail validation instead of breaking a JSON answer."""
    return json.loads(value, parse_constant=str)


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def _now() -> datetime:
    return datetime.now(UTC)


def _iso(moment: datetime) -> str:
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).isoformat()


class Storage:
    def __init__(self, url: str):
        self.url = url
        try:
            self.engine: Engine = create_engine(url, pool_pre_ping=True)
        except (ArgumentError, ImportError) as error:  # not a URL, an unknown dialect, a driver not installed
            raise StorageError(f"not a usable database URL: {error}") from None
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
            if (database := self.engine.url.database) and database != ":memory:":
                _renew_read_only_connections(self.engine, database)
        event.listen(self.engine, "handle_error", _drop_stale_connections)
        self._session = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def _transaction(self, write: bool = False) -> Iterator[Session]:
        """A session, committed at the end when write; the driver's failures come out as StorageError."""
        with _guarded(), (self._session.begin() if write else self._session()) as session:
            yield session

    def migrate(self, revision: str = "head") -> None:
        """Upgrade the schema (an empty database is created from scratch)."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.set_main_option("sqlalchemy.url", self.url.replace("%", "%%"))
        try:
            with _guarded(), self._sqlite_file_lock(), self.engine.begin() as connection:
                if self.engine.dialect.name == "postgresql":  # replicas starting at once: one migrates, the rest wait
                    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
                config.attributes["connection"] = connection
                command.upgrade(config, revision)
        except CommandError as error:  # e.g. a database from a newer version of Chorus
            raise StorageError(f"cannot migrate the database: {error}") from None

    @contextmanager
    def _sqlite_file_lock(self) -> Iterator[None]:
        """Processes starting at once on one SQLite file: one migrates, the rest wait (then find nothing to do).
        SQLite runs a migration's DDL outside any lock, so they hold a lock file beside the database."""
        database = self.engine.url.database if self.engine.dialect.name == "sqlite" else None
        if not database or database == ":memory:":
            yield
            return
        with open(f"{database}.migrate-lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            yield

    def revision(self) -> str | None:
        from alembic.runtime.migration import MigrationContext

        with _guarded(), self.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()

    def probe_write(self) -> None:
        """A real committed write that changes nothing (the schema's version row rewritten to itself): it
        fails as any write would while the database is full, read-only or locked."""
        with self._transaction(write=True) as session:
            session.execute(text("UPDATE alembic_version SET version_num = version_num"))

    # --- settings and audit --------------------------------------------------------------------

    def read_settings(self) -> dict[str, Any]:
        with self._transaction() as session:
            rows = {row.key: row.value for row in session.scalars(select(Setting))}
        values = {}
        for key, value in rows.items():
            try:
                values[key] = _loads(value)
            except ValueError:  # damaged outside Chorus (it writes JSON it has parsed): the default applies
                continue
        return values

    def write_settings(self, changes: dict[str, Any], actor: str, effective: dict[str, Any] | None = None
                       ) -> list[dict]:
        """Store changed values and one audit row per change, in one transaction. `effective`: the values in
        force, for the audit's old value of a setting never stored (its default)."""
        entries = []
        with self._transaction(write=True) as session:
            for key, value in changes.items():
                row = session.get(Setting, key)
                old = _loads(row.value) if row else (effective or {}).get(key)
                if old == value and (row is not None or effective is not None):  # already so: nothing to record
                    continue
                now = _now()
                if row is None:
                    row = Setting(key=key)
                    session.add(row)
                row.value, row.value_type = json.dumps(value), type(value).__name__
                row.updated_at, row.updated_by = now, actor
                entry = AuditEntry(at=now, actor=actor, action="setting.update", key=key,
                                   old_value=None if old is None else json.dumps(old), new_value=json.dumps(value))
                session.add(entry)
                entries.append(_audit_dict(entry))
        return entries

    def add_audit(self, actor: str, action: str, key: str, new_value: Any) -> dict:
        """An audit row for an operator action that is not a setting change (e.g. a registry reload)."""
        with self._transaction(write=True) as session:
            entry = AuditEntry(at=_now(), actor=actor, action=action, key=key, old_value=None,
                               new_value=json.dumps(new_value))
            session.add(entry)
            session.flush()
            return _audit_dict(entry)

    def audit(self, limit: int = 50) -> list[dict]:
        with self._transaction() as session:
            rows = session.scalars(select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit))
            return [_audit_dict(row) for row in rows]

    # --- request log ---------------------------------------------------------------------------

    def add_request_logs(self, rows: list[dict]) -> None:
        with self._transaction(write=True) as session:
            session.add_all(RequestLogEntry(**row) for row in rows)

    def prune_request_log(self, keep_rows: int) -> int:
        """Delete all but the newest keep_rows entries; returns how many were deleted."""
        with self._transaction(write=True) as session:
            newest = session.scalar(select(func.max(RequestLogEntry.id))) or 0
            result = session.execute(delete(RequestLogEntry).where(RequestLogEntry.id <= newest - keep_rows))
            return result.rowcount or 0

    def request_log(self, limit: int = 50) -> list[dict]:
        with self._transaction() as session:
            rows = session.scalars(select(RequestLogEntry).order_by(RequestLogEntry.id.desc()).limit(limit))
            return [{"at": _iso(row.at), "client": row.client, "source": row.source, "voice": row.voice,
                     "characters": row.characters, "queue_ms": row.queue_ms, "synthesis_ms": row.synthesis_ms,
                     "batch_size": row.batch_size, "status": row.status} for row in rows]

    def count_request_log(self) -> int:
        with self._transaction() as session:
            return session.scalar(select(func.count(RequestLogEntry.id))) or 0


    # --- API keys (hashes only) -----------------------------------------------------------------

    def add_api_key(self, prefix: str, key_hash: str, name: str, tier: str, actor: str) -> dict:
        with self._transaction(write=True) as session:
            row = ApiKey(prefix=prefix, key_hash=key_hash, name=name, tier=tier, created_at=_now())
            session.add(row)
            session.flush()
            created = json.dumps({"name": name, "tier": tier, "prefix": prefix})
            session.add(AuditEntry(at=row.created_at, actor=actor, action="api_key.create", key=f"api_key:{row.id}",
                                   old_value=None, new_value=created))
            return _key_dict(row)

    def revoke_api_key(self, key_id: int, actor: str) -> dict | None:
        with self._transaction(write=True) as session:
            row = session.get(ApiKey, key_id)
            if row is None:
                return None
            if row.revoked_at is None:
                row.revoked_at = _now()
                session.add(AuditEntry(at=row.revoked_at, actor=actor, action="api_key.revoke",
                                       key=f"api_key:{row.id}", old_value=json.dumps("active"),
                                       new_value=json.dumps("revoked")))
            return _key_dict(row)

    def api_keys(self) -> list[dict]:
        with self._transaction() as session:
            return [_key_dict(row) for row in session.scalars(select(ApiKey).order_by(ApiKey.id))]

    # --- jobs ----------------------------------------------------------------------------------

    def add_job(self, job_id: str, owner: str, tier: str, priority: int, request: dict) -> dict:
        now = _now()
        with self._transaction(write=True) as session:
            row = Job(id=job_id, owner=owner, tier=tier, priority=priority, status=JobStatus.QUEUED,
                      request=json.dumps(request), attempts=0, created_at=now, not_before=now)
            session.add(row)
            return _job_dict(row)

    def job(self, job_id: str) -> dict | None:
        with self._transaction() as session:
            row = session.get(Job, job_id)
            return _job_dict(row) if row else None

    def jobs(self, owner: str, limit: int = 100, status: str | None = None) -> list[dict]:
        query = select(Job).where(Job.owner == owner)
        if status is not None:
            query = query.where(Job.status == status)
        with self._transaction() as session:
            return [_job_dict(row) for row in session.scalars(query.order_by(Job.created_at.desc()).limit(limit))]

    def claim_jobs(self, limit: int, owner: str = "", lease_s: float = 30.0) -> list[dict]:
        """Queued jobs that are due, highest priority then oldest first, marked running (attempt + 1) under
        the owner's lease. Replicas claim at once without taking one job twice: the rows are locked as
        they are read (FOR UPDATE SKIP LOCKED on Postgres: another replica's claim passes them by; SQLite
        has one writer at a time)."""
        now = _now()
        with self._transaction(write=True) as session:
            query = (select(Job).where(Job.status == JobStatus.QUEUED, Job.not_before <= now)
                     .order_by(Job.priority.desc(), Job.created_at).limit(limit))
            if self.engine.dialect.name != "sqlite":
                query = query.with_for_update(skip_locked=True)
            rows = list(session.scalars(query))
            for row in rows:
                row.status, row.started_at, row.attempts = JobStatus.RUNNING, now, row.attempts + 1
                row.lease_owner, row.lease_until = owner, now + timedelta(seconds=lease_s)
            return [_job_dict(row) for row in rows]

    # --- replicas ------------------------------------------------------------------------------

    def report_replica(self, replica: str, started_at: datetime, figures: dict[str, Any]) -> None:
        """This replica's live figures, now (one row a replica, rewritten)."""
        with self._transaction(write=True) as session:
            row = session.get(ReplicaRow, replica) or ReplicaRow(id=replica)
            row.started_at, row.seen_at, row.figures = started_at, _now(), json.dumps(figures)
            session.add(row)

    def replicas(self) -> list[dict]:
        """Every replica that has reported, newest report first: id, started_at, seen_at, seen_s_ago, figures."""
        now = _now()
        with self._transaction() as session:
            rows = list(session.scalars(select(ReplicaRow).order_by(ReplicaRow.seen_at.desc())))
        return [{"id": row.id, "started_at": _iso(row.started_at), "seen_at": _iso(row.seen_at),
                 "seen_s_ago": round((now - _aware(row.seen_at)).total_seconds(), 1), "figures": _loads(row.figures)}
                for row in rows]

    def renew_leases(self, owner: str, attempts: dict[str, int], lease_s: float) -> None:
        """The owner still runs these attempts (job id -> attempt): the leases it still holds last lease_s
        from now; one another replica has taken over since stays that one's."""
        if not attempts:
            return
        held = or_(*(and_(Job.id == job_id, Job.attempts == attempt) for job_id, attempt in attempts.items()))
        with self._transaction(write=True) as session:
            session.execute(update(Job).where(held, Job.status == JobStatus.RUNNING, Job.lease_owner == owner)
                            .values(lease_until=_now() + timedelta(seconds=lease_s)))

    def requeue_expired(self, owner: str | None = None) -> int:
        """Running jobs whose lease has run out (their replica died or hangs) go back to the queue; with
        `owner` (a replica starting again under its id), that replica's own at once too."""
        stale = or_(Job.lease_until.is_(None), Job.lease_until < _now())
        if owner is not None:
            stale = or_(stale, Job.lease_owner == owner)
        with self._transaction(write=True) as session:
            return session.execute(update(Job).where(Job.status == JobStatus.RUNNING, stale)
                                   .values(status=JobStatus.QUEUED, lease_owner=None, lease_until=None)).rowcount

    def cancel_job(self, job_id: str) -> dict | None:
        """queued|running -> cancelled, in one conditional update; None when the job had ended (or
        never was). Whatever a running attempt does afterwards, this row stays cancelled."""
        return self._move_job(job_id, (JobStatus.QUEUED, JobStatus.RUNNING), JobStatus.CANCELLED, finished_at=_now())

    def finish_job(self, job_id: str, holder: str, attempt: int, status: str, **fields: Any) -> dict | None:
        """running -> succeeded, failed or back to queued, by the lease's holder: the replica and attempt
        that claimed it last. None when the job is no longer that attempt's (a cancel came first and wins,
        or the lease ran out and the job was queued again or taken by another attempt: that one's row)."""
        if status != JobStatus.QUEUED:
            fields.setdefault("finished_at", _now())
        return self._move_job(job_id, (JobStatus.RUNNING,), status, Job.lease_owner == holder, Job.attempts == attempt,
                              **fields)

    def _move_job(self, job_id: str, sources: tuple[str, ...], status: str, *conditions: Any,
                  **fields: Any) -> dict | None:
        with self._transaction(write=True) as session:
            moved = session.execute(update(Job).where(Job.id == job_id, Job.status.in_(sources), *conditions)
                                    .values(status=status, **fields)).rowcount
            return _job_dict(session.get(Job, job_id)) if moved else None

    def backlog(self) -> tuple[int, int, float | None]:
        """Queued jobs, running jobs, and the age in seconds of the oldest queued one."""
        with self._transaction() as session:
            waiting = Job.status.in_((JobStatus.QUEUED, JobStatus.RUNNING))
            counts = dict(session.execute(select(Job.status, func.count()).where(waiting).group_by(Job.status)).all())
            oldest = session.scalar(select(func.min(Job.created_at)).where(Job.status == JobStatus.QUEUED))
        age = None if oldest is None else (_now() - _aware(oldest)).total_seconds()
        return counts.get(JobStatus.QUEUED, 0), counts.get(JobStatus.RUNNING, 0), age

    def expired_jobs(self, ttl_s: float) -> list[dict]:
        """Ended jobs past their retention that still keep a result file or their input text:
        succeeded ones from expires_at, failed and cancelled ones ttl_s after they ended."""
        now = _now()
        cutoff = now - timedelta(seconds=ttl_s)
        ended_long_ago = and_(Job.status.in_((JobStatus.FAILED, JobStatus.CANCELLED)), Job.finished_at <= cutoff)
        # add_job stores the request as json.dumps writes it; a dropped input leaves no "input" key
        keeps_data = or_(Job.result_path.is_not(None), Job.request.contains('"input": '))
        with self._transaction() as session:
            rows = session.scalars(select(Job).where(keeps_data, or_(Job.expires_at <= now, ended_long_ago)))
            return [_job_dict(row) for row in rows]

    def expire_job(self, job_id: str) -> None:
        """Forget a job's result file and input text; the other request fields and the text's length stay."""
        with self._transaction(write=True) as session:
            row = session.get(Job, job_id)
            if row is not None:
                row.result_path, row.request = None, json.dumps(_without_input(_loads(row.request)))

    def result_paths(self) -> list[str]:
        """The result files job rows point to."""
        with self._transaction() as session:
            return list(session.scalars(select(Job.result_path).where(Job.result_path.is_not(None))))

    # --- cloned voices (each change audited in its own transaction) --------------------------------

    def add_cloned_voice(self, name: str, model: str, owner: str, duration_s: float, transcript: str | None,
                         path: str, consent_at: datetime, actor: str, prompt: bytes | None = None) -> dict | None:
        """A new cloned voice (private to its owner), with its prompt file's bytes; None when a cloned voice
        has that name already."""
        try:
            with self._transaction(write=True) as session:
                if session.get(ClonedVoiceRow, name) is not None:
                    return None
                row = ClonedVoiceRow(name=name, model=model, owner=owner, public=False, created_at=_now(),
                                     duration_s=duration_s, transcript=transcript, path=path, consent_at=consent_at,
                                     prompt=prompt)
                session.add(row)
                session.add(_voice_audit(row.created_at, actor, "cloned_voice.create", name, None,
                                         {"model": model, "owner": owner, "duration_s": duration_s}))
                session.flush()
                return _cloned_voice_dict(row)
        except StorageError as error:
            if isinstance(error.__cause__, IntegrityError):  # made at the same moment by another replica
                return None
            raise

    def cloned_voices(self) -> list[dict]:
        """Every cloned voice, oldest first, without its prompt (cloned_voice_prompt reads one)."""
        with self._transaction() as session:
            rows = session.scalars(select(ClonedVoiceRow).order_by(ClonedVoiceRow.created_at))
            return [_cloned_voice_dict(row) for row in rows]

    def cloned_voice_prompt(self, name: str) -> bytes | None:
        """The voice's prompt file's bytes; None when there is no such voice, or it was made before they were
        kept."""
        with self._transaction() as session:
            return session.scalar(select(ClonedVoiceRow.prompt).where(ClonedVoiceRow.name == name))

    def delete_cloned_voice(self, name: str, actor: str) -> dict | None:
        """The deleted voice's row as it was; None when there is none."""
        with self._transaction(write=True) as session:
            row = session.get(ClonedVoiceRow, name)
            if row is None:
                return None
            record = _cloned_voice_dict(row)
            session.delete(row)
            session.add(_voice_audit(_now(), actor, "cloned_voice.delete", name, {"owner": row.owner}, None))
            return record

    def set_cloned_voice_public(self, name: str, public: bool, actor: str) -> dict | None:
        with self._transaction(write=True) as session:
            row = session.get(ClonedVoiceRow, name)
            if row is None:
                return None
            if row.public != public:
                session.add(_voice_audit(_now(), actor, "cloned_voice.public", name, row.public, public))
                row.public = public
            return _cloned_voice_dict(row)

    # --- pronunciation lexicon (each change audited, and the version raised, in its transaction) ---------

    def lexicon_version(self) -> int:
        with self._transaction() as session:
            return session.scalar(select(LexiconVersion.version).where(LexiconVersion.id == 1)) or 0

    def lexicon_entries(self, language: str | None = None) -> list[dict]:
        query = select(LexiconRow).order_by(LexiconRow.language, LexiconRow.phrase)
        if language is not None:
            query = query.where(LexiconRow.language == language)
        with self._transaction() as session:
            return [_lexicon_dict(row) for row in session.scalars(query)]

    def add_lexicon_entry(self, entry: dict, actor: str) -> dict:
        """entry: language, phrase, ipa, respelling, case_sensitive. Raises AlreadyExists."""
        with self._lexicon_change() as session:
            self._check_free(session, entry["language"], entry["phrase"], None)
            row = LexiconRow(**entry, updated_at=_now(), updated_by=actor)
            session.add(row)
            session.flush()
            session.add(_lexicon_audit(row.updated_at, actor, "lexicon.add", f"lexicon:{row.id}", None, entry))
            return _lexicon_dict(row)

    def change_lexicon_entry(self, entry_id: int, entry: dict, actor: str) -> dict | None:
        """The entry as changed; None when there is none with that id. Raises AlreadyExists."""
        with self._lexicon_change() as session:
            row = session.get(LexiconRow, entry_id)
            if row is None:
                return None
            self._check_free(session, entry["language"], entry["phrase"], entry_id)
            old = _lexicon_fields(row)
            if old != entry:
                for name, value in entry.items():
                    setattr(row, name, value)
                row.updated_at, row.updated_by = _now(), actor
                session.add(_lexicon_audit(row.updated_at, actor, "lexicon.change", f"lexicon:{row.id}", old, entry))
            return _lexicon_dict(row)

    def delete_lexicon_entry(self, entry_id: int, actor: str) -> dict | None:
        """The deleted entry as it was; None when there is none."""
        with self._lexicon_change() as session:
            row = session.get(LexiconRow, entry_id)
            if row is None:
                return None
            record = _lexicon_dict(row)
            session.delete(row)
            session.add(_lexicon_audit(_now(), actor, "lexicon.delete", f"lexicon:{entry_id}",
                                       _lexicon_fields(row), None))
            return record

    def merge_lexicon(self, entries: list[dict], actor: str) -> dict:
        """Entries added, or changed where their language and phrase have one: all in one transaction,
        one audit row for the lot. Returns how many were added, changed and already so."""
        counts = {"added": 0, "changed": 0, "unchanged": 0}
        with self._lexicon_change() as session:
            now = _now()
            existing = {(row.language, row.phrase): row for row in session.scalars(select(LexiconRow))}
            for entry in entries:
                row = existing.get((entry["language"], entry["phrase"]))
                if row is None:
                    session.add(LexiconRow(**entry, updated_at=now, updated_by=actor))
                    counts["added"] += 1
                elif _lexicon_fields(row) != entry:
                    for name, value in entry.items():
                        setattr(row, name, value)
                    row.updated_at, row.updated_by = now, actor
                    counts["changed"] += 1
                else:
                    counts["unchanged"] += 1
            session.add(_lexicon_audit(now, actor, "lexicon.import", "lexicon", None, counts))
        return counts

    @contextmanager
    def _lexicon_change(self) -> Iterator[Session]:
        try:
            with self._transaction(write=True) as session:
                yield session
                session.execute(update(LexiconVersion).where(LexiconVersion.id == 1)
                                .values(version=LexiconVersion.version + 1))
        except StorageError as error:
            if isinstance(error.__cause__, IntegrityError):  # the same phrase, at the same moment, on another replica
                raise AlreadyExists("the lexicon has that phrase for that language already") from None
            raise

    @staticmethod
    def _check_free(session: Session, language: str, phrase: str, entry_id: int | None) -> None:
        taken = session.scalar(select(LexiconRow.id).where(LexiconRow.language == language,
                                                           LexiconRow.phrase == phrase))
        if taken is not None and taken != entry_id:
            raise AlreadyExists(f"the lexicon has {phrase!r} for {language} already (entry {taken})")


_LEXICON_FIELDS = ("language", "phrase", "ipa", "respelling", "case_sensitive")


def _lexicon_fields(row: LexiconRow) -> dict:
    return {name: getattr(row, name) for name in _LEXICON_FIELDS}


def _lexicon_dict(row: LexiconRow) -> dict:
    return {"id": row.id, **_lexicon_fields(row), "updated_at": _iso(row.updated_at), "updated_by": row.updated_by}


def _lexicon_audit(at: datetime, actor: str, action: str, key: str, old: Any, new: Any) -> AuditEntry:
    return AuditEntry(at=at, actor=actor, action=action, key=key,
                      old_value=None if old is None else json.dumps(old),
                      new_value=None if new is None else json.dumps(new))


def _voice_audit(at: datetime, actor: str, action: str, name: str, old: Any, new: Any) -> AuditEntry:
    return AuditEntry(at=at, actor=actor, action=action, key=f"cloned_voice:{name}",
                      old_value=None if old is None else json.dumps(old),
                      new_value=None if new is None else json.dumps(new))


def _cloned_voice_dict(row: ClonedVoiceRow) -> dict:
    return {"name": row.name, "model": row.model, "owner": row.owner, "public": row.public,
            "created_at": _aware(row.created_at), "duration_s": row.duration_s, "transcript": row.transcript,
            "path": row.path, "consent_at": _aware(row.consent_at)}


def _without_input(request: dict) -> dict:
    if "input" not in request:
        return request
    return {key: value for key, value in request.items() if key != "input"} | {"characters": len(request["input"])}


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _job_dict(row: Job) -> dict:
    moments = ("created_at", "not_before", "started_at", "finished_at", "expires_at")
    return {"id": row.id, "owner": row.owner, "tier": row.tier, "priority": row.priority, "status": row.status,
            "request": _loads(row.request), "attempts": row.attempts, "error": row.error,
            **{name: _aware(getattr(row, name)) if getattr(row, name) else None for name in moments},
            "result_path": row.result_path, "content_type": row.content_type, "audio_s": row.audio_s}


def _key_dict(row: ApiKey) -> dict:
    return {"id": row.id, "prefix": row.prefix, "key_hash": row.key_hash, "name": row.name, "tier": row.tier,
            "created_at": _iso(row.created_at), "revoked_at": _iso(row.revoked_at) if row.revoked_at else None}


def _audit_dict(entry: AuditEntry) -> dict:
    return {"at": _iso(entry.at), "actor": entry.actor, "action": entry.action, "key": entry.key,
            "old_value": None if entry.old_value is None else _loads(entry.old_value),
            "new_value": None if entry.new_value is None else _loads(entry.new_value)}


def _renew_read_only_connections(engine: Engine, database: str) -> None:
    """A connection SQLite opened read-only (its file was not writable then) is replaced by a fresh one at its
    first use after the file is writable again, before any write of its fails."""
    @event.listens_for(engine, "connect")
    def opened(_dbapi_connection, record) -> None:
        record.info["read_only_file"] = not os.access(database, os.W_OK)

    @event.listens_for(engine, "checkout")
    def checked_out(_dbapi_connection, record, _proxy) -> None:
        if record.info.get("read_only_file") and os.access(database, os.W_OK):
            raise DisconnectionError("opened while the file was read-only; it is writable now")


def _drop_stale_connections(context) -> None:
    """A failure that leaves its connection unusable counts as a disconnect: SQLAlchemy then drops the
    connection and renews the pool's others, so the database works again here as soon as it does."""
    error = context.original_exception
    code = getattr(error, "sqlite_errorcode", None)
    if (code is not None and code & 0xFF in SQLITE_STALE_CODES) or getattr(error, "sqlstate", None) in \
            POSTGRES_STALE_STATES:
        context.is_disconnect = True


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()
