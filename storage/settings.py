"""Operator settings as stored: key -> JSON value, each change audited. What a setting means is tts_core's."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select

from .audit import audit_dict, audit_entry
from .database import Database, loads, now
from .models import Setting


class StoredSettings:
    def __init__(self, database: Database):
        self._database = database

    def read(self) -> dict[str, Any]:
        with self._database.transaction() as session:
            rows = {row.key: row.value for row in session.scalars(select(Setting))}
        values = {}
        for key, value in rows.items():
            try:
                values[key] = loads(value)
            except ValueError:  # damaged outside Chorus (it writes JSON it has parsed): the default applies
                continue
        return values

    def write(self, changes: dict[str, Any], actor: str, effective: dict[str, Any] | None = None) -> list[dict]:
        """Store changed values and one audit entry per change, in one transaction; returns the entries.
        `effective`: the values in force, for the audit's old value of a setting never stored (its default)."""
        entries = []
        with self._database.transaction(write=True) as session:
            for key, value in changes.items():
                row = session.get(Setting, key)
                old = loads(row.value) if row else (effective or {}).get(key)
                if old == value and (row is not None or effective is not None):  # already so: nothing to record
                    continue
                at = now()
                if row is None:
                    row = Setting(key=key)
                    session.add(row)
                row.value, row.value_type = json.dumps(value), type(value).__name__
                row.updated_at, row.updated_by = at, actor
                entry = audit_entry(at, actor, "setting.update", key, old, value)
                session.add(entry)
                entries.append(audit_dict(entry))
        return entries
