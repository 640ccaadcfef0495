"""The models' calibration sweeps, kept per model, settings and machine (the key tts_core.scheduler.calibration
makes), so that a restart serves at once on what it measured last and only checks it again in the background."""

from __future__ import annotations

import json

from .database import Database, now
from .models import CalibrationRow


class Calibrations:
    def __init__(self, database: Database):
        self._database = database

    def load(self, key: str) -> list[tuple[int, int, float]] | None:
        """The rows kept under this key ([batch size, padded tokens, seconds] each), or None."""
        with self._database.transaction() as session:
            row = session.get(CalibrationRow, key)
            rows = None if row is None else json.loads(row.rows)
        return None if not rows else [(int(size), int(padded), float(seconds)) for size, padded, seconds in rows]

    def save(self, key: str, described: dict, rows: list[tuple[int, int, float]]) -> None:
        """Keep these rows under this key (rewritten if kept already)."""
        with self._database.transaction(write=True) as session:
            row = session.get(CalibrationRow, key) or CalibrationRow(key=key)
            row.model, row.described = str(described.get("model", ""))[:256], json.dumps(described, sort_keys=True)
            row.rows, row.measured_at = json.dumps([list(entry) for entry in rows]), now()
            session.add(row)
