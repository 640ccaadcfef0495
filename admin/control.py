"""Operator settings: validated by tts_core, stored in the database, applied to the running process.

Settings are re-read every second, so a change made through another replica (same database)
applies here too. If the database fails, the process keeps its last known settings and the error
is shown on the dashboard and logged once; synthesis never waits on the database. Stored values
that do not validate (out of bounds, from an older version) are skipped, logged once and shown.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from storage import Storage, StorageError
from storage.request_log import RequestLogWriter
from tts_core.controls import ServiceControls
from tts_core.request.operating import OperatorSettings

log = logging.getLogger(__name__)


class OperatorControl:
    def __init__(self, storage: Storage, controls: ServiceControls, request_log: RequestLogWriter,
                 refresh_s: float = 1.0, defaults: dict[str, Any] | None = None):
        self.storage = storage
        self.controls = controls
        self.request_log = request_log
        self.refresh_s = refresh_s
        self.defaults = defaults or {}  # deployment defaults (TTS_OPERATOR_DEFAULTS), under stored values
        # A failed read is over at the next read that works; a failed write only once a write works again
        # (reads often go on working when writes do not: a full disk, a read-only file, a lock).
        self.read_error: str | None = None
        self.write_error: str | None = None
        self.read_at: float | None = None  # when the stored settings were last read (epoch seconds)
        self.ignored: dict[str, str] = {}  # stored values that do not validate (name -> why): not applied
        self.on_reload: list[Callable[[], None]] = []  # more state to re-read from storage each refresh
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="settings-refresh", daemon=True)

    @property
    def settings(self) -> OperatorSettings:
        return self.controls.settings()

    @property
    def storage_error(self) -> str | None:
        return self.write_error or self.read_error

    def start(self) -> None:
        self.reload()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def apply(self, settings: OperatorSettings) -> None:
        if settings == self.settings:
            return
        self.controls.configure(settings)
        self.request_log.max_rows = settings.request_log_max_rows
        log.info("operator settings applied: %s", settings.model_dump())

    def reload(self) -> None:
        """Read the stored settings (and whatever on_reload reads) and apply them. Blocking."""
        try:
            stored = self.storage.settings.read()
            for reload_more in self.on_reload:
                reload_more()
        except StorageError as error:
            self.read_error = self._failed("read", error, self.read_error)
            return
        self.read_error, self.read_at = None, time.time()
        if self.write_error is not None:
            self._probe_write()
        settings, ignored = OperatorSettings.from_stored(stored, self.defaults)
        if ignored and ignored != self.ignored:  # once, not at every refresh
            log.error("ignoring stored operator settings out of their bounds (the defaults apply): %s",
                      "; ".join(f"{name} = {_short(stored.get(name))} ({why})" for name, why in ignored.items()))
        self.ignored = ignored
        self.apply(settings)

    def update(self, changes: dict[str, Any], actor: str) -> tuple[OperatorSettings, list[dict]]:
        """Validate (InvalidSetting), store with an audit row each (StorageError), apply. Blocking: call it
        from a worker thread."""
        with self._lock:
            updated = self.settings.merged(changes)
            values = updated.model_dump()
            try:
                entries = self.storage.settings.write({key: values[key] for key in changes}, actor,
                                                      self.settings.model_dump())
            except StorageError as error:
                self.write_error = self._failed("write", error, self.write_error)
                raise
            self.write_error = None
            self.apply(updated)
            return updated, entries

    def audit(self, limit: int = 50) -> list[dict]:
        return self.storage.audit.recent(limit)

    def health(self) -> dict:
        return {"database": self.storage.engine.url.render_as_string(hide_password=True),
                "settings_error": self.storage_error, "settings_read_at": self.read_at,
                "ignored_settings": dict(self.ignored), "request_log_error": self.request_log.last_error,
                "request_log_dropped": self.request_log.dropped}

    def _probe_write(self) -> None:
        try:
            self.storage.probe_write()
        except StorageError as error:
            self.write_error = f"write failed: {error}"
            return
        self.write_error = None
        log.warning("settings storage: writes work again")

    @staticmethod
    def _failed(what: str, error: StorageError, before: str | None) -> str:
        message = f"{what} failed: {error}"
        if message != before:  # once per outage, not at every refresh
            log.error("settings storage %s", message)
        return message

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                self.reload()
            except Exception:  # a bug must not end the refreshes
                log.exception("settings refresh failed")


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else f"{text[:20]}…({len(text)} characters)"
