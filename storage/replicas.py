"""The server processes of a deployment as each last reported itself: what the cluster view and the
ingress's load score read."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import select

from .database import Database, aware, iso, loads, now
from .models import ReplicaRow


class Replicas:
    def __init__(self, database: Database):
        self._database = database

    def report(self, replica: str, started_at: datetime, figures: dict[str, Any]) -> None:
        """This replica's live figures, now (one row a replica, rewritten)."""
        with self._database.transaction(write=True) as session:
            row = session.get(ReplicaRow, replica) or ReplicaRow(id=replica)
            row.started_at, row.seen_at, row.figures = started_at, now(), json.dumps(figures)
            session.add(row)

    def all(self) -> list[dict]:
        """Every replica that has reported, newest report first: id, started_at, seen_at, seen_s_ago, figures."""
        at = now()
        with self._database.transaction() as session:
            rows = list(session.scalars(select(ReplicaRow).order_by(ReplicaRow.seen_at.desc())))
        return [{"id": row.id, "started_at": iso(row.started_at), "seen_at": iso(row.seen_at),
                 "seen_s_ago": round((at - aware(row.seen_at)).total_seconds(), 1), "figures": loads(row.figures)}
                for row in rows]
