"""Cloned voices, from an upload to a voice (clones -> tts_core, storage): the one way the API, the UI
and the Admin tab make, share and delete them.

The engine's side (the clip's checks, its encoding on the engine's thread, the catalogue) is
tts_core.cloning; the rows, and the audit of every change, are storage's. Every storage call runs in
a worker thread, never on the event loop. The database row is the truth a restart starts from: a
voice is offered once its row is written, and its row goes before anything else when it is deleted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from storage import Storage
from tts_core.access import Caller
from tts_core.cloning import MAX_TRANSCRIPT_CHARS, ClonedVoice, prompt_path, read_clip, save_prompt
from tts_core.errors import Conflict, InvalidRequest, NotFound
from tts_core.service import SpeechService

log = logging.getLogger(__name__)


def stored_clones(storage: Storage, data_dir: Path, models: Iterable[str]) -> list[ClonedVoice]:
    """At start-up: the stored cloned voices whose model is configured and whose file is there."""
    models = set(models)
    voices = []
    for row in storage.cloned_voices():
        path = Path(data_dir) / row["path"]
        if row["model"] not in models or not path.is_file():
            log.warning("cloned voice %s is not offered: its model %s is not configured, or %s is missing",
                        row["name"], row["model"], path)
            continue
        voices.append(ClonedVoice(row["name"], row["model"], row["owner"], row["public"], str(path)))
    return voices


class VoiceClones:
    def __init__(self, storage: Storage, service: SpeechService):
        self.storage, self.service = storage, service
        self.data_dir = service.settings.data_dir

    async def create(self, caller: Caller, data: bytes, name: str, model: str, consent: bool,
                     transcript: str | None = None) -> dict:
        """A voice from the clip, private to the caller. Refused with 400 naming the field at fault
        (consent, text, model, name, audio) or 409 (the name is taken; the caller has as many as allowed)."""
        if consent is not True:
            raise InvalidRequest("cloning a voice needs the speaker's consent: send consent=true", "consent",
                                 "consent_required")
        if transcript is not None and len(transcript) > MAX_TRANSCRIPT_CHARS:
            raise InvalidRequest(f"the transcript is over {MAX_TRANSCRIPT_CHARS} characters", "text",
                                 "string_above_max_length")
        consent_at, service = datetime.now(UTC), self.service
        target = service.cloner.target(model, service.catalogue)
        with service.clones.reserving(name, caller.identity, service.catalogue,
                                      service.settings.max_cloned_voices_per_caller):
            clip = await asyncio.to_thread(read_clip, data)
            latents = await service.cloner.encode(target, clip)
            path = prompt_path(self.data_dir, target, name)
            await asyncio.to_thread(save_prompt, path, latents, service.cloner.prompt_key(target))
            record = await asyncio.to_thread(self._store, name, target, caller.identity, clip.duration_s, transcript,
                                             path, consent_at)
            try:
                await service.cloner.add(ClonedVoice(name, target, caller.identity, False, str(path)), latents)
            except BaseException:
                await asyncio.to_thread(self._forget, name, path, caller.identity)
                raise
        return record

    def _store(self, name: str, model: str, owner: str, duration_s: float, transcript: str | None, path: Path,
               consent_at: datetime) -> dict:
        """The voice's row (its creation audited); the file goes again if the row cannot be written."""
        try:
            record = self.storage.add_cloned_voice(name, model, owner, round(duration_s, 3), transcript,
                                                   str(path.relative_to(self.data_dir)), consent_at, owner)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        if record is None:
            path.unlink(missing_ok=True)
            raise Conflict(f"voice name {name!r} is taken; choose another", "name", "voice_exists")
        return record

    def _forget(self, name: str, path: Path, actor: str) -> None:
        self.storage.delete_cloned_voice(name, actor)
        path.unlink(missing_ok=True)

    async def delete(self, name: str, actor: str, owner: str | None = None) -> dict:
        """Delete a cloned voice: its row, then the catalogue's and its engine's copies, then its file.
        owner: only that caller's (another's answers 404, as if there were none); None: any (an admin)."""
        voice = self.service.clones.all().get(name)
        if owner is not None and (voice is None or voice.owner != owner):
            raise NotFound(f"you have no cloned voice named {name!r}", "name", "voice_not_found")
        record = await asyncio.to_thread(self.storage.delete_cloned_voice, name, actor)
        if record is None and voice is None:
            raise NotFound(f"no cloned voice named {name!r}", "name", "voice_not_found")
        await self.service.cloner.remove(name)
        path = Path(voice.path) if voice is not None else self.data_dir / record["path"]
        await asyncio.to_thread(path.unlink, missing_ok=True)
        return record or {"name": name}

    async def set_public(self, name: str, public: bool, actor: str) -> dict:
        """Usable by everyone (public) or by its owner only (an admin's decision, audited)."""
        record = await asyncio.to_thread(self.storage.set_cloned_voice_public, name, public, actor)
        if record is None:
            raise NotFound(f"no cloned voice named {name!r}", "name", "voice_not_found")
        await self.service.cloner.set_public(name, public)
        return record

    async def listing(self) -> list[dict]:
        """Every stored cloned voice, oldest first (the admin's view)."""
        return await asyncio.to_thread(self.storage.cloned_voices)
