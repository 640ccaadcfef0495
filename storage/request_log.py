"""The request log: one row per answered request, written by a background thread (the request path only
appends to a bounded buffer, so a slow, locked or failing database never delays or fails synthesis) and kept
to the newest rows."""

from __future__ import annotations

import logging
import threading
from collections import deque
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import delete, func, select

from .database import Database, StorageError, iso
from .models import RequestLogEntry

if TYPE_CHECKING:
    from . import Storage

log = logging.getLogger(__name__)


class RequestLog:
    def __init__(self, database: Database):
        self._database = database

    def add(self, rows: list[dict]) -> None:
        with self._database.transaction(write=True) as session:
            session.add_all(RequestLogEntry(**row) for row in rows)

    def prune(self, keep_rows: int) -> int:
        """Delete all but the newest keep_rows entries; returns how many were deleted."""
        with self._database.transaction(write=True) as session:
            newest = session.scalar(select(func.max(RequestLogEntry.id))) or 0
            result = session.execute(delete(RequestLogEntry).where(RequestLogEntry.id <= newest - keep_rows))
            return result.rowcount or 0

    def recent(self, limit: int = 50) -> list[dict]:
        """The newest entries first."""
        with self._database.transaction() as session:
            rows = session.scalars(select(RequestLogEntry).order_by(RequestLogEntry.id.desc()).limit(limit))
            return [{"at": iso(row.at), "client": row.client, "source": row.source, "voice": row.voice,
                     "characters": row.characters, "queue_ms": row.queue_ms, "synthesis_ms": row.synthesis_ms,
                     "batch_size": row.batch_size, "status": row.status} for row in rows]

    def count(self) -> int:
        with self._database.transaction() as session:
            return session.scalar(select(func.count(RequestLogEntry.id))) or 0


class RequestLogWriter:
    def __init__(self, storage: Storage, max_rows: int = 100_000, flush_every_s: float = 1.0,
                 buffer_limit: int = 10_000):
        self.storage = storage
        self.max_rows = max_rows
        self.flush_every_s = flush_every_s
        self.last_error: str | None = None
        self.dropped = 0  # rows lost because the buffer overflowed while storage was failing
        self._buffer: deque[dict] = deque()
        self._buffer_limit = buffer_limit
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="request-log", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.flush()

    def record(self, *, client: str, source: str, status: int, voice: str | None = None,
               characters: int = 0, queue_ms: float | None = None, synthesis_ms: float | None = None,
               batch_size: int | None = None) -> None:
        row = {"at": datetime.now(UTC), "client": client[:128], "source": source, "voice": voice,
               "characters": characters, "queue_ms": queue_ms, "synthesis_ms": synthesis_ms,
               "batch_size": batch_size, "status": status}
        with self._lock:
            if len(self._buffer) >= self._buffer_limit:
                self._buffer.popleft()
                self.dropped += 1
            self._buffer.append(row)

    def flush(self) -> None:
        with self._lock:
            rows = list(self._buffer)
            self._buffer.clear()
        if not rows:
            return
        try:
            self.storage.request_log.add(rows)
            self.storage.request_log.prune(self.max_rows)
        except Exception as error:  # StorageError, or a bug: either way the rows wait and the thread lives on
            if self.last_error is None:  # once per outage, not at every flush
                log.error("request log writes fail (rows are kept for retry, up to %d): %s", self._buffer_limit, error)
            self.last_error = str(error) if isinstance(error, StorageError) else f"{type(error).__name__}: {error}"
            with self._lock:
                self._buffer.extendleft(reversed(rows[-(self._buffer_limit - len(self._buffer)):]))
            return
        if self.last_error is not None:
            log.warning("request log writes work again")
            self.last_error = None

    def _run(self) -> None:
        while not self._stop.wait(self.flush_every_s):
            self.flush()
