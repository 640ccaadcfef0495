"""Voices cloned from callers' clips: who owns each, whether it is public, its prompt's bytes; each change
audited in its own transaction."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from .audit import audit_entry
from .database import Database, StorageError, aware, now
from .models import ClonedVoiceRow


class ClonedVoices:
    def __init__(self, database: Database):
        self._database = database

    def add(self, name: str, model: str, owner: str, duration_s: float, transcript: str | None, path: str,
            consent_at: datetime, actor: str, prompt: bytes | None = None) -> dict | None:
        """A new cloned voice (private to its owner), with its prompt file's bytes; None when a cloned voice
        has that name already."""
        try:
            with self._database.transaction(write=True) as session:
                if session.get(ClonedVoiceRow, name) is not None:
                    return None
                row = ClonedVoiceRow(name=name, model=model, owner=owner, public=False, created_at=now(),
                                     duration_s=duration_s, transcript=transcript, path=path, consent_at=consent_at,
                                     prompt=prompt)
                session.add(row)
                session.add(audit_entry(row.created_at, actor, "cloned_voice.create", _key(name), None,
                                        {"model": model, "owner": owner, "duration_s": duration_s}))
                session.flush()
                return _cloned_voice_dict(row)
        except StorageError as error:
            if isinstance(error.__cause__, IntegrityError):  # made at the same moment by another replica
                return None
            raise

    def all(self) -> list[dict]:
        """Every cloned voice, oldest first, without its prompt (`prompt` reads one)."""
        with self._database.transaction() as session:
            rows = session.scalars(select(ClonedVoiceRow).order_by(ClonedVoiceRow.created_at))
            return [_cloned_voice_dict(row) for row in rows]

    def prompt(self, name: str) -> bytes | None:
        """The voice's prompt file's bytes; None when there is no such voice, or it was made before they were
        kept."""
        with self._database.transaction() as session:
            return session.scalar(select(ClonedVoiceRow.prompt).where(ClonedVoiceRow.name == name))

    def delete(self, name: str, actor: str) -> dict | None:
        """The deleted voice's row as it was; None when there is none."""
        with self._database.transaction(write=True) as session:
            row = session.get(ClonedVoiceRow, name)
            if row is None:
                return None
            record = _cloned_voice_dict(row)
            session.delete(row)
            session.add(audit_entry(now(), actor, "cloned_voice.delete", _key(name), {"owner": row.owner}, None))
            return record

    def set_public(self, name: str, public: bool, actor: str) -> dict | None:
        with self._database.transaction(write=True) as session:
            row = session.get(ClonedVoiceRow, name)
            if row is None:
                return None
            if row.public != public:
                session.add(audit_entry(now(), actor, "cloned_voice.public", _key(name), row.public, public))
                row.public = public
            return _cloned_voice_dict(row)


def _key(name: str) -> str:
    return f"cloned_voice:{name}"


def _cloned_voice_dict(row: ClonedVoiceRow) -> dict:
    return {"name": row.name, "model": row.model, "owner": row.owner, "public": row.public,
            "created_at": aware(row.created_at), "duration_s": row.duration_s, "transcript": row.transcript,
            "path": row.path, "consent_at": aware(row.consent_at)}
