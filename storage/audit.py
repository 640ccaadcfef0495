"""The audit log: who changed what, when, from what to what. Repositories that change audited rows add their
entry in the same transaction (`audit_entry`); this repository adds the others and reads them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select

from .database import Database, dumps_or_none, iso, loads, now
from .models import AuditEntry


class AuditLog:
    def __init__(self, database: Database):
        self._database = database

    def add(self, actor: str, action: str, key: str, new_value: Any) -> dict:
        """An entry for an operator action that changes no stored row (e.g. a registry reload)."""
        with self._database.transaction(write=True) as session:
            entry = audit_entry(now(), actor, action, key, None, new_value)
            session.add(entry)
            session.flush()
            return audit_dict(entry)

    def recent(self, limit: int = 50) -> list[dict]:
        """The newest entries first."""
        with self._database.transaction() as session:
            rows = session.scalars(select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit))
            return [audit_dict(row) for row in rows]


def audit_entry(at: datetime, actor: str, action: str, key: str, old: Any, new: Any) -> AuditEntry:
    return AuditEntry(at=at, actor=actor, action=action, key=key, old_value=dumps_or_none(old),
                      new_value=dumps_or_none(new))


def audit_dict(entry: AuditEntry) -> dict:
    return {"at": iso(entry.at), "actor": entry.actor, "action": entry.action, "key": entry.key,
            "old_value": None if entry.old_value is None else loads(entry.old_value),
            "new_value": None if entry.new_value is None else loads(entry.new_value)}
