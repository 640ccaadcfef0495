"""The pronunciation lexicon: entries by language and phrase, and one version raised by every change (what
replicas poll to know when to read the entries again). Each change audited in its transaction."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .audit import audit_entry
from .database import AlreadyExists, Database, StorageError, iso, now
from .models import LexiconRow, LexiconVersion

_FIELDS = ("language", "phrase", "ipa", "respelling", "case_sensitive")


class Lexicon:
    def __init__(self, database: Database):
        self._database = database

    def version(self) -> int:
        with self._database.transaction() as session:
            return session.scalar(select(LexiconVersion.version).where(LexiconVersion.id == 1)) or 0

    def entries(self, language: str | None = None) -> list[dict]:
        query = select(LexiconRow).order_by(LexiconRow.language, LexiconRow.phrase)
        if language is not None:
            query = query.where(LexiconRow.language == language)
        with self._database.transaction() as session:
            return [_lexicon_dict(row) for row in session.scalars(query)]

    def add(self, entry: dict, actor: str) -> dict:
        """entry: language, phrase, ipa, respelling, case_sensitive. Raises AlreadyExists."""
        with self._change() as session:
            _check_free(session, entry["language"], entry["phrase"], None)
            row = LexiconRow(**entry, updated_at=now(), updated_by=actor)
            session.add(row)
            session.flush()
            session.add(audit_entry(row.updated_at, actor, "lexicon.add", f"lexicon:{row.id}", None, entry))
            return _lexicon_dict(row)

    def change(self, entry_id: int, entry: dict, actor: str) -> dict | None:
        """The entry as changed; None when there is none with that id. Raises AlreadyExists."""
        with self._change() as session:
            row = session.get(LexiconRow, entry_id)
            if row is None:
                return None
            _check_free(session, entry["language"], entry["phrase"], entry_id)
            old = _fields(row)
            if old != entry:
                for name, value in entry.items():
                    setattr(row, name, value)
                row.updated_at, row.updated_by = now(), actor
                session.add(audit_entry(row.updated_at, actor, "lexicon.change", f"lexicon:{row.id}", old, entry))
            return _lexicon_dict(row)

    def delete(self, entry_id: int, actor: str) -> dict | None:
        """The deleted entry as it was; None when there is none."""
        with self._change() as session:
            row = session.get(LexiconRow, entry_id)
            if row is None:
                return None
            record = _lexicon_dict(row)
            session.delete(row)
            session.add(audit_entry(now(), actor, "lexicon.delete", f"lexicon:{entry_id}", _fields(row), None))
            return record

    def merge(self, entries: list[dict], actor: str) -> dict:
        """Entries added, or changed where their language and phrase have one: all in one transaction,
        one audit entry for the lot. Returns how many were added, changed and already so."""
        counts = {"added": 0, "changed": 0, "unchanged": 0}
        with self._change() as session:
            at = now()
            existing = {(row.language, row.phrase): row for row in session.scalars(select(LexiconRow))}
            for entry in entries:
                row = existing.get((entry["language"], entry["phrase"]))
                if row is None:
                    session.add(LexiconRow(**entry, updated_at=at, updated_by=actor))
                    counts["added"] += 1
                elif _fields(row) != entry:
                    for name, value in entry.items():
                        setattr(row, name, value)
                    row.updated_at, row.updated_by = at, actor
                    counts["changed"] += 1
                else:
                    counts["unchanged"] += 1
            session.add(audit_entry(at, actor, "lexicon.import", "lexicon", None, counts))
        return counts

    @contextmanager
    def _change(self) -> Iterator[Session]:
        """A write transaction that raises the lexicon's version with the change it holds."""
        try:
            with self._database.transaction(write=True) as session:
                yield session
                session.execute(update(LexiconVersion).where(LexiconVersion.id == 1)
                                .values(version=LexiconVersion.version + 1))
        except StorageError as error:
            if isinstance(error.__cause__, IntegrityError):  # the same phrase, at the same moment, on another replica
                raise AlreadyExists("the lexicon has that phrase for that language already") from None
            raise


def _check_free(session: Session, language: str, phrase: str, entry_id: int | None) -> None:
    taken = session.scalar(select(LexiconRow.id).where(LexiconRow.language == language, LexiconRow.phrase == phrase))
    if taken is not None and taken != entry_id:
        raise AlreadyExists(f"the lexicon has {phrase!r} for {language} already (entry {taken})")


def _fields(row: LexiconRow) -> dict:
    return {name: getattr(row, name) for name in _FIELDS}


def _lexicon_dict(row: LexiconRow) -> dict:
    return {"id": row.id, **_fields(row), "updated_at": iso(row.updated_at), "updated_by": row.updated_by}
