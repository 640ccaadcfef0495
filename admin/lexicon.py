"""The pronunciation lexicon: stored entries (storage) applied to the running front end (tts_core).

`refresh` runs in OperatorControl's loop (every second, as settings are read): it reads the stored
lexicon's version, and only when that changed the entries, which it swaps into the service (ServiceControls) as
one new immutable Lexicon. A change made here is applied at once; one made through another replica at the
next refresh. Entries in the database that do not validate (edited outside Chorus) are skipped and
logged once.
"""

from __future__ import annotations

import logging
import threading

from pydantic import ValidationError

from storage import Storage
from tts_core.controls import ServiceControls
from tts_core.text.lexicon import Lexicon, LexiconEntry, from_tsv, language_code, to_tsv

log = logging.getLogger(__name__)

ENTRY_FIELDS = tuple(LexiconEntry.model_fields)


class LexiconControl:
    def __init__(self, storage: Storage, controls: ServiceControls):
        self.storage = storage
        self.controls = controls
        self.version: int | None = None  # of the entries applied now; None before the first read
        self._skipped: set[int] = set()  # ids of stored entries that do not validate, logged once
        self._lock = threading.Lock()  # the refresh loop and admin changes both refresh: one at a time

    def refresh(self) -> None:
        """Re-read the entries if the stored version changed (StorageError when the database fails)."""
        with self._lock:
            version = self.storage.lexicon.version()  # first: a change made meanwhile is read at the next refresh
            if version == self.version:
                return
            entries = self._valid(self.storage.lexicon.entries())
            self.controls.use_lexicon(Lexicon(entries))
            self.version = version
        log.info("pronunciation lexicon version %s applied: %s entries", version, len(entries))

    def _valid(self, rows: list[dict]) -> list[LexiconEntry]:
        entries = []
        for row in rows:
            try:
                entries.append(LexiconEntry(**{name: row[name] for name in ENTRY_FIELDS}))
            except ValidationError as error:
                if row["id"] not in self._skipped:
                    log.error("skipping lexicon entry %s (%r): %s", row["id"], row["phrase"], error)
                    self._skipped.add(row["id"])
        return entries

    def entries(self, language: str | None = None) -> list[dict]:
        return self.storage.lexicon.entries(None if language is None else language_code(language))

    def add(self, entry: LexiconEntry, actor: str) -> dict:
        """Raises storage.AlreadyExists when the language has the phrase already."""
        record = self.storage.lexicon.add(entry.model_dump(), actor)
        self.refresh()
        return record

    def change(self, entry_id: int, entry: LexiconEntry, actor: str) -> dict | None:
        record = self.storage.lexicon.change(entry_id, entry.model_dump(), actor)
        self.refresh()
        return record

    def delete(self, entry_id: int, actor: str) -> dict | None:
        record = self.storage.lexicon.delete(entry_id, actor)
        self.refresh()
        return record

    def import_tsv(self, text: str, actor: str) -> dict:
        """Merge a TSV file's entries into the lexicon (LexiconFileError names its bad lines; nothing
        is stored then)."""
        counts = self.storage.lexicon.merge([entry.model_dump() for entry in from_tsv(text)], actor)
        self.refresh()
        return counts

    def export_tsv(self, language: str | None = None) -> str:
        return to_tsv(self._valid(self.entries(language)))
