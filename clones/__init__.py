"""Cloned voices, from an upload to a voice (clones -> tts_core, storage): the one way the API, the UI
and the Admin tab make, share and delete them.

The engine's side (the clip's checks, its encoding on the engine's thread, the catalogue) is
tts_core.voices.cloning; the rows, and the audit of every change, are storage's. Every storage call runs in
a worker thread, never on the event loop. The database row is the truth a restart starts from: a
voice is offered once its row is written, and its row goes before anything else when it is deleted.

The row keeps the voice's prompt file's bytes, so replicas on one database share the voices: `refresh`
(on OperatorControl's refresh thread, every second) makes this replica's voices the stored ones, writing
the prompt file of a voice made elsewhere into this replica's data dir.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from storage import Storage, StorageError
from tts_core.errors import Conflict, ErrorCode, InvalidRequest, NotFound
from tts_core.request.access import Caller
from tts_core.service import SpeechService
from tts_core.voices.cloning import MAX_TRANSCRIPT_CHARS, ClonedVoice, prompt_path, read_clip, save_prompt, write_prompt

log = logging.getLogger(__name__)


def stored_clones(storage: Storage, data_dir: Path, models: Iterable[str]) -> list[ClonedVoice]:
    """At start-up: the stored cloned voices this replica can offer (the first refresh logs the others)."""
    models, voices = set(models), []
    for row in storage.cloned_voices.all():
        try:
            voice = offered(storage, Path(data_dir), row, models)
        except OSError:  # its file cannot be written here (a full disk): the refresh tries again, and says so
            continue
        if voice is not None:
            voices.append(voice)
    return voices


def offered(storage: Storage, data_dir: Path, row: dict, models: set[str]) -> ClonedVoice | None:
    """A stored voice as this replica offers it, its prompt file written from the row's bytes (a row from
    before they were kept: the file this replica has); None when its model is not configured here or it has
    no prompt. Start-up and each refresh turn rows into voices here, and only here."""
    if row["model"] not in models:
        return None
    path = data_dir / row["path"]
    prompt = storage.cloned_voices.prompt(row["name"])
    if prompt is not None:
        write_prompt(path, prompt)
    elif not path.is_file():
        return None
    return ClonedVoice(row["name"], row["model"], row["owner"], row["public"], str(path), row["created_at"],
                       row["transcript"])


class VoiceClones:
    def __init__(self, storage: Storage, service: SpeechService):
        self.storage, self.service = storage, service
        self.data_dir = service.settings.data_dir
        # Stored voices this replica does not offer, each (name, created_at) logged once; those without a
        # prompt here, or refused by their engine, are not tried again (the others are, at each refresh).
        self._said: set[tuple[str, datetime]] = set()
        self._skipped: set[tuple[str, datetime]] = set()
        self._failure: str | None = None  # the refresh's last failure, logged once

    async def create(self, caller: Caller, data: bytes, name: str, model: str, consent: bool,
                     transcript: str | None = None) -> dict:
        """A voice from the clip, private to the caller. Refused with 400 naming the field at fault
        (consent, text, model, name, audio) or 409 (the name is taken; the caller has as many as allowed)."""
        if consent is not True:
            raise InvalidRequest("cloning a voice needs the speaker's consent: send consent=true", "consent",
                                 ErrorCode.CONSENT_REQUIRED)
        if transcript is not None and len(transcript) > MAX_TRANSCRIPT_CHARS:
            raise InvalidRequest(f"the transcript is over {MAX_TRANSCRIPT_CHARS} characters", "text",
                                 ErrorCode.STRING_ABOVE_MAX_LENGTH)
        consent_at, service = datetime.now(UTC), self.service
        target = service.cloner.target(model, service.catalogue)
        with service.clones.reserving(name, caller.identity, service.catalogue,
                                      service.settings.max_cloned_voices_per_caller):
            clip = await asyncio.to_thread(read_clip, data)
            latents = await service.cloner.encode(target, clip)
            path = prompt_path(self.data_dir, target, name)
            prompt = await asyncio.to_thread(save_prompt, path, latents, service.cloner.prompt_key(target))
            record = await asyncio.to_thread(self._store, name, target, caller.identity, clip.duration_s, transcript,
                                             path, prompt, consent_at)
            voice = ClonedVoice(name, target, caller.identity, False, str(path), record["created_at"], transcript)
            try:
                await service.cloner.add(voice, latents)
            except BaseException:
                await asyncio.to_thread(self._forget, name, path, caller.identity)
                raise
        return record

    def _store(self, name: str, model: str, owner: str, duration_s: float, transcript: str | None, path: Path,
               prompt: bytes, consent_at: datetime) -> dict:
        """The voice's row (its creation audited); the file goes again if the row cannot be written."""
        try:
            record = self.storage.cloned_voices.add(name, model, owner, round(duration_s, 3), transcript,
                                                   str(path.relative_to(self.data_dir)), consent_at, owner, prompt)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        if record is None:
            path.unlink(missing_ok=True)
            raise Conflict(f"voice name {name!r} is taken; choose another", "name", ErrorCode.VOICE_EXISTS)
        return record

    def _forget(self, name: str, path: Path, actor: str) -> None:
        self.storage.cloned_voices.delete(name, actor)
        path.unlink(missing_ok=True)

    async def delete(self, name: str, actor: str, owner: str | None = None) -> dict:
        """Delete a cloned voice: its row, then the catalogue's and its engine's copies, then its file.
        owner: only that caller's (another's answers 404, as if there were none); None: any (an admin)."""
        voice = self.service.clones.all().get(name)
        if owner is not None and (voice is None or voice.owner != owner):
            raise NotFound(f"you have no cloned voice named {name!r}", "name", ErrorCode.VOICE_NOT_FOUND)
        record = await asyncio.to_thread(self.storage.cloned_voices.delete, name, actor)
        if record is None and voice is None:
            raise NotFound(f"no cloned voice named {name!r}", "name", ErrorCode.VOICE_NOT_FOUND)
        await self.service.cloner.remove(name)
        path = Path(voice.path) if voice is not None else self.data_dir / record["path"]
        await asyncio.to_thread(path.unlink, missing_ok=True)
        return record or {"name": name}

    async def set_public(self, name: str, public: bool, actor: str) -> dict:
        """Usable by everyone (public) or by its owner only (an admin's decision, audited)."""
        record = await asyncio.to_thread(self.storage.cloned_voices.set_public, name, public, actor)
        if record is None:
            raise NotFound(f"no cloned voice named {name!r}", "name", ErrorCode.VOICE_NOT_FOUND)
        await self.service.cloner.set_public(name, public)
        return record

    async def listing(self) -> list[dict]:
        """Every stored cloned voice, oldest first (the admin's view)."""
        return await asyncio.to_thread(self.storage.cloned_voices.all)

    def refresh(self) -> None:
        """Make this replica's cloned voices the stored ones: made, deleted, made again, made public or private
        through another replica. Blocking: OperatorControl's refresh thread calls it every second, beside the
        settings, keys and lexicon; a StorageError is its to say (once per outage), any other failure is said
        here, once until it changes, and never keeps the others from their refresh."""
        try:
            self._follow()
        except StorageError:
            raise
        except Exception as error:
            if repr(error) != self._failure:
                log.exception("cloned voices refresh failed")
            self._failure = repr(error)
        else:
            self._failure = None

    def _follow(self) -> None:
        """The rows are read without their prompts; a prompt only for a voice new here."""
        known, making = self.service.clones.snapshot()  # before the rows: what changes here meanwhile is kept
        rows = {row["name"]: row for row in self.storage.cloned_voices.all()}
        gone, changed = [], []
        for name, voice in known.items():
            row = rows.get(name)
            if name in making:
                continue
            if row is None or row["created_at"] != voice.created_at:  # deleted, or deleted and made again
                gone.append((voice, None))
            elif row["public"] != voice.public:
                changed.append((voice, replace(voice, public=row["public"])))
        cloner = self.service.cloner
        if gone or changed:  # first: a voice made again under its name has its old file removed
            cloner.follow(gone + changed)
        made = self._made([row for name, row in rows.items() if name not in making and
                           (name not in known or known[name].created_at != row["created_at"])])
        if made:
            self._skipped.update((voice.name, voice.created_at) for voice in cloner.follow(made))

    def _made(self, rows: list[dict]) -> list[tuple[None, ClonedVoice]]:
        """The new rows' voices, each prompt written into this replica's data dir; a row this replica cannot
        offer is logged once."""
        models, made = set(self.service.cloner.speaking()), []
        for row in rows:
            key = (row["name"], row["created_at"])
            if key in self._skipped:
                continue
            try:
                voice = offered(self.storage, self.data_dir, row, models)
            except OSError as error:  # its file cannot be written here (a full disk): tried again at the next refresh
                voice, why = None, f"its prompt file cannot be written: {error}"
            else:
                why = f"its model {row['model']} is not configured here"  # it may be, after a registry reload
                if voice is None and row["model"] in models:
                    self._skipped.add(key)
                    why = f"it has no prompt, neither in the database nor at {self.data_dir / row['path']}"
            if voice is not None:
                made.append((None, voice))
            elif key not in self._said:
                self._said.add(key)
                log.warning("cloned voice %s is not offered: %s", row["name"], why)
        return made
