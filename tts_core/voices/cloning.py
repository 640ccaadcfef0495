"""Voice cloning: a caller's clip becomes a voice of a model that can clone.

A model can clone when its engine has `voice_prompt_from_audio(audio, sample_rate) -> latents`,
`add_voice(name, latents, transcript)` and `remove_voice(name)` (Pocket TTS; VibeVoice has the same hooks; an
upstream that clones per request keeps the clip and what it says, and sends both with each request).

- `read_clip` decodes an upload (what the bytes are, never what a file name says): WAV, FLAC and Ogg with
  soundfile (libsndfile), anything else with PyAV (mp3; other containers are refused); and checks it:
  audio at all, in an accepted container, 3 to 30 s long, samples that are numbers within full scale
  (a float file can hold NaN, infinity or 1e30), not silent.
- A cloned voice's prompt is a file, the latents in safetensors under the key the model's own voice
  files use (Pocket TTS `audio_prompt_latents`, VibeVoice `acoustic_latents`: so a file can also serve
  as a registry `prompt`), at <data dir>/voices/cloned/<model>/<name>.safetensors; the database keeps
  its bytes too, from which every other replica writes its own.
- `ClonedVoices` is the set the server offers, swapped whole on every change like the catalogue, which
  lists them and says who may use each. Its `give_to` is the load hook: a model that loads later (the
  pool loads lazily, and after a restart) gets its cloned voices before its batcher starts.
- `Cloner` makes the engine calls (encode a clip, add or remove a voice) on the engine's own thread
  (EngineLoop.run_on_engine), never beside a step; the model is loaded first if it is not. Its `follow`
  applies, from a thread, what another replica made, changed or deleted (the stored rows' refresh).
"""

from __future__ import annotations

import asyncio
import io
import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, wait
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import av
import numpy as np
import soundfile
from safetensors.numpy import load_file, save

from ..engines.base import VOICE_NAME
from ..errors import ChorusError, Conflict, ErrorCode, InvalidRequest, SynthesisError
from ..scheduler.queue import QueueClosed

if TYPE_CHECKING:
    from ..audio.cache import AudioCache
    from ..engines import Engine
    from ..scheduler.pool import ModelPool
    from .catalogue import Catalogue

log = logging.getLogger(__name__)

MIN_CLIP_S, MAX_CLIP_S = 3.0, 30.0
CONTAINERS = {"wav", "mp3", "flac", "ogg"}  # PyAV's names for what the bytes turned out to be
SOUNDFILE_CONTAINERS = {"WAV", "WAVEX", "FLAC", "OGG"}  # the ones soundfile reads (libsndfile's names)
BLOCK_FRAMES = 65536  # soundfile reads this many frames at a time: a header can claim any length
# Speech is loud in at least a tenth of its 50 ms windows (-30 to -10 dBFS); a clip whose loudest tenth
# stays under -50 dBFS is silence, hiss or hum.
SILENCE_DBFS, WINDOW_S = -50.0, 0.05
# Full scale is 1.0; a float file may go a little over it (a mix that clips), never far: +12 dBFS is no recording.
MAX_PEAK = 4.0
PROMPT_KEY = "audio_prompt_latents"
MAX_TRANSCRIPT_CHARS = 2000
# How long a refresh waits for engines to take (or drop) the voices made (or deleted) elsewhere: a stuck
# engine must not hold up the settings and keys read on the same thread (a voice not taken by then is
# offered anyway: its engine runs the call before any request that can name it).
FOLLOW_WAIT_S = 5.0


# --- the clip ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Clip:
    audio: np.ndarray  # float32 mono
    sample_rate: int

    @property
    def duration_s(self) -> float:
        return self.audio.size / self.sample_rate


def _bad_clip(message: str, code: str) -> InvalidRequest:
    return InvalidRequest(message, "audio", code)


def read_clip(data: bytes) -> Clip:
    """The upload as float32 mono at its own rate; InvalidRequest (param audio) saying what is wrong."""
    clip = soundfile_clip(data) or _pyav_clip(data)
    if not clip.audio.size:
        raise _not_audio()
    if clip.duration_s < MIN_CLIP_S:
        raise _bad_clip(f"the clip is {clip.duration_s:.1f} s long; a voice needs {MIN_CLIP_S:.0f} to "
                        f"{MAX_CLIP_S:.0f} s", ErrorCode.AUDIO_TOO_SHORT)
    _check_samples(clip.audio)
    if _loudness_dbfs(clip) < SILENCE_DBFS:
        raise _bad_clip("the clip is silent (or nearly): record someone speaking", ErrorCode.AUDIO_SILENT)
    return clip


def _check_samples(audio: np.ndarray) -> None:
    """Refuse samples that are not numbers or far past full scale: a float file can hold anything, and the
    loudness check and the codec would read NaN as speech."""
    finite = np.isfinite(audio)
    if not finite.all():
        raise _bad_clip(f"the clip holds {audio.size - int(finite.sum())} samples that are not numbers (NaN or "
                        "infinity); send a recording", ErrorCode.AUDIO_UNREADABLE)
    peak = float(np.abs(audio).max())
    if peak > MAX_PEAK:
        raise _bad_clip(f"the clip's samples reach {peak:.3g}, far past full scale (1.0); send a recording whose "
                        f"samples stay within ±{MAX_PEAK:g}", ErrorCode.AUDIO_UNREADABLE)


def _not_audio() -> InvalidRequest:
    return _bad_clip("the clip is not audio in one of wav, mp3, flac or ogg", ErrorCode.AUDIO_UNREADABLE)


def soundfile_clip(data: bytes) -> Clip | None:
    """The clip read by soundfile when it is WAV, FLAC or Ogg; None when it is another container or one
    libsndfile cannot open (PyAV reads it, or says why not)."""
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as sound:
            if sound.format not in SOUNDFILE_CONTAINERS:
                return None
            blocks = sound.blocks(BLOCK_FRAMES, dtype="float32", always_2d=True)
            return Clip(_bounded((block.mean(axis=1) for block in blocks), sound.samplerate), sound.samplerate)
    except RuntimeError:  # libsndfile's errors (LibsndfileError): not a file it reads
        return None


def _pyav_clip(data: bytes) -> Clip:
    try:
        with av.open(io.BytesIO(data)) as container:
            if not CONTAINERS & set(container.format.name.split(",")) or not container.streams.audio:
                raise _not_audio()
            return _decoded(container)
    except (av.error.FFmpegError, ValueError, EOFError):  # what PyAV raises on bytes that are not media
        raise _not_audio() from None


def _bounded(pieces: Iterable[np.ndarray], rate: int) -> np.ndarray:
    """Mono pieces joined, stopping as soon as they are too long: a few compressed bytes can hold hours
    of silence, which must not be decoded into memory."""
    kept: list[np.ndarray] = []
    samples, limit = 0, int(MAX_CLIP_S * rate)
    for piece in pieces:
        kept.append(piece)
        samples += piece.size
        if samples > limit:
            raise _bad_clip(f"the clip is longer than {MAX_CLIP_S:.0f} s; a voice needs {MIN_CLIP_S:.0f} to "
                            f"{MAX_CLIP_S:.0f} s", ErrorCode.AUDIO_TOO_LONG)
    return np.concatenate(kept).astype(np.float32) if kept else np.zeros(0, np.float32)


def _decoded(container) -> Clip:
    """Decoded by PyAV and mixed down."""
    stream = container.streams.audio[0]
    if stream.codec_context is None:  # a header naming no encoding FFmpeg can decode (0 bits per sample, ...)
        raise _bad_clip("the clip's header describes audio that cannot be decoded (its encoding, bits per "
                        "sample or channels); send 16-bit PCM wav, mp3, flac or ogg", ErrorCode.AUDIO_UNREADABLE)
    rate = stream.sample_rate
    if not rate:
        raise ValueError("no sample rate")
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    frames = itertools.chain(container.decode(audio=0), [None])  # None flushes the resampler
    return Clip(_bounded((out.to_ndarray().reshape(-1) for frame in frames for out in resampler.resample(frame)),
                         rate), rate)


def _loudness_dbfs(clip: Clip) -> float:
    """The level of the clip's loudest tenth of 50 ms windows."""
    window = max(1, int(WINDOW_S * clip.sample_rate))
    count = max(1, clip.audio.size // window)
    windows = np.resize(clip.audio, count * window).reshape(count, window).astype(np.float64)
    level = float(np.percentile(np.sqrt(np.mean(windows**2, axis=1)), 90))
    return 20 * np.log10(max(level, 1e-10))


# --- voice prompt files -----------------------------------------------------------------------------


def prompt_path(data_dir: Path, model: str, name: str) -> Path:
    return Path(data_dir) / "voices" / "cloned" / model / f"{name}.safetensors"


def save_prompt(path: Path, latents: np.ndarray, key: str = PROMPT_KEY) -> bytes:
    """The latents as the voice's file; returns its bytes (what the database keeps)."""
    data = save({key: np.ascontiguousarray(latents, dtype=np.float32)})
    write_prompt(path, data)
    return data


def write_prompt(path: Path, data: bytes) -> None:
    """Written beside, then moved into place: a crash never leaves half a file under the voice's name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def load_prompt(path: str | Path) -> np.ndarray:
    """The file's latents, under whichever key its model names them."""
    tensors = load_file(str(path))
    return tensors.get(PROMPT_KEY, next(iter(tensors.values())))


# --- the voices offered -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClonedVoice:
    name: str
    model: str  # the loaded model (engine) that speaks it: its prompt is in that model's codec space
    owner: str  # the caller that made it: "key:<id>" or "ip:<address>"
    public: bool  # usable by everyone (an admin's decision), not only its owner
    path: str  # its voice prompt file
    created_at: datetime | None = None  # of its stored row: a voice made again under its name is another voice
    transcript: str | None = None  # what its clip says, where its maker said (an upstream that clones reads it)

    def usable_by(self, caller: str | None) -> bool:
        return self.public or caller == self.owner


class ClonedVoices:
    """The cloned voices offered, and the names being made. The dict is swapped whole on each change,
    so readers (a catalogue's build, a model's load) take it without the lock."""

    def __init__(self, voices: Iterable[ClonedVoice] = ()):
        self._voices: dict[str, ClonedVoice] = {voice.name: voice for voice in voices}
        self._making: dict[str, str] = {}  # name -> owner, while its clip is encoded and stored
        self._lock = threading.Lock()

    def all(self) -> dict[str, ClonedVoice]:
        return self._voices

    def put(self, voice: ClonedVoice) -> None:
        with self._lock:
            self._voices = {**self._voices, voice.name: voice}

    def drop(self, name: str) -> ClonedVoice | None:
        with self._lock:
            voice = self._voices.get(name)
            self._voices = {known: other for known, other in self._voices.items() if known != name}
            return voice

    def snapshot(self) -> tuple[dict[str, ClonedVoice], set[str]]:
        """The voices offered and the names being made, at one moment."""
        with self._lock:
            return self._voices, set(self._making)

    def swap(self, old: ClonedVoice | None, new: ClonedVoice | None) -> bool:
        """Offer new (None: nothing) under old's name, only if old (None: nothing) is still what is offered
        under it and the name is not being made; False when something changed it meanwhile."""
        name = (old or new).name
        with self._lock:
            if name in self._making or self._voices.get(name) != old:
                return False
            others = {known: other for known, other in self._voices.items() if known != name}
            self._voices = others if new is None else {**others, name: new}
            return True

    @contextmanager
    def reserving(self, name: str, owner: str, catalogue: Catalogue, per_caller: int) -> Iterator[None]:
        """Hold a new voice's name while it is made: 400 for a name that cannot be one, 409 for one
        taken (any voice or alias, or one being made) or when the owner has as many as allowed."""
        if not VOICE_NAME.fullmatch(name):
            raise InvalidRequest("a voice name is 1 to 48 letters, digits, '.', '_' or '-', starting with a "
                                 "letter or digit", "name", ErrorCode.INVALID_NAME)
        with self._lock:
            if name in catalogue.voices or name in catalogue.voice_aliases or name in self._making:
                raise Conflict(f"voice name {name!r} is taken; choose another", "name", ErrorCode.VOICE_EXISTS)
            held = sum(voice.owner == owner for voice in self._voices.values())
            held += sum(maker == owner for made, maker in self._making.items() if made not in self._voices)
            if per_caller and held >= per_caller:
                raise Conflict(f"you have {held} cloned voices, the most one caller may have "
                               "(TTS_MAX_CLONED_VOICES_PER_CALLER); delete one first", "name",
                               ErrorCode.CLONED_VOICE_LIMIT)
            self._making[name] = owner
        try:
            yield
        finally:
            with self._lock:
                self._making.pop(name, None)

    def give_to(self, engine: Engine) -> None:
        """The load hook: a model that has just loaded gets its cloned voices (on the loader's thread,
        before its batcher starts: nothing else calls the engine yet)."""
        for voice in self._voices.values() if engine.capabilities.clones else ():
            if voice.model == engine.name:
                try:
                    engine.add_voice(voice.name, load_prompt(voice.path), voice.transcript)
                except Exception:  # one unreadable file must not keep the model (or its other voices) away
                    log.exception("cloned voice %s could not be given to %s", voice.name, engine.name)


class Cloner:
    """The engine's side of cloning: which model a clone goes to, its clip encoded, the voice added to
    or removed from the engine and the catalogue. `publish` rebuilds the catalogue (blocking: it may
    wait for a registry reload, so it runs in a worker thread)."""

    def __init__(self, pool: ModelPool, voices: ClonedVoices, publish: Callable[[], None], cache: AudioCache):
        self.pool, self.voices, self.publish, self.cache = pool, voices, publish, cache
        self.refusal: str | None = None  # why this process makes no clones (its engines run elsewhere); None: it does

    def models(self) -> list[str]:
        """The models a clone may go to here: none where this process makes no clones, else `speaking`."""
        return [] if self.refusal else self.speaking()

    def speaking(self) -> list[str]:
        """The models that can speak cloned voices: those that can clone (as declared)."""
        return [name for name, slot in self.pool.slots().items() if not slot.retired and slot.spec.capabilities.clones]

    def target(self, model: str, catalogue: Catalogue) -> str:
        """The loaded model a clone for `model` (a model's own name, a model family or an alias) goes to;
        400 (param model) when none can clone."""
        if self.refusal:
            raise InvalidRequest(self.refusal, "model", ErrorCode.MODEL_CANNOT_CLONE)
        slots = {name: slot for name, slot in self.pool.slots().items() if not slot.retired}
        if model in slots:
            candidates = [model]
        else:
            family = catalogue.resolve_model(model)
            candidates = [name for name, slot in slots.items() if any(v.model == family for v in slot.spec.voices)]
        able = [name for name in candidates if slots[name].spec.capabilities.clones]
        if not able:
            raise _cannot_clone(model, self.models())
        return able[0]

    def prompt_key(self, model: str) -> str:
        """What the model's own voice files call their latents."""
        batcher = self.pool.loaded().get(model)
        return getattr(batcher.engine if batcher is not None else None, "prompt_key", PROMPT_KEY)

    async def encode(self, model: str, clip: Clip) -> np.ndarray:
        """The clip's voice prompt, made by the model's codec on its engine's thread (loaded first)."""
        try:
            return await self._on_engine(model, lambda engine: engine.voice_prompt_from_audio(
                clip.audio, clip.sample_rate), load=True, cloning=True)
        except ChorusError:
            raise
        except Exception as error:
            raise SynthesisError(f"the clip could not be encoded: {error}") from error

    async def add(self, voice: ClonedVoice, latents: np.ndarray) -> None:
        """Offer a new voice: to its engine first (a model loading from now on gets it from the load
        hook), then in the catalogue, so no request names it before its engine has it."""
        self.voices.put(voice)
        try:
            await self._on_engine(voice.model, lambda engine: engine.add_voice(voice.name, latents, voice.transcript),
                                  load=True)
        except BaseException:
            self.voices.drop(voice.name)
            raise
        self.cache.drop_voice(voice.name)  # a deleted voice's audio, cached by a request still running then
        await asyncio.to_thread(self.publish)

    async def remove(self, name: str) -> None:
        """Out of the catalogue first (no new request names it), then off its engine if it is loaded.
        Pieces already running in it finish in it; the queued ones are refused at once (_refuse_queued)."""
        voice = self.voices.drop(name)
        await asyncio.to_thread(self.publish)
        self.cache.drop_voice(name)  # a new voice may take the name: it must not get this one's audio
        if voice is not None:
            await self._on_engine(voice.model, lambda engine: engine.remove_voice(name), load=False)
            self._refuse_queued(voice)

    def _refuse_queued(self, voice: ClonedVoice) -> None:
        """A deleted voice's queued pieces refused now, off its engine (a request in it, a dialogue's later turns,
        answers at once that the voice was deleted while it ran), not each as it would have started."""
        loop = self.pool.loaded().get(voice.model)
        if loop is not None:
            loop.refuse_voice(voice.name)

    async def set_public(self, name: str, public: bool) -> None:
        voice = self.voices.all().get(name)
        if voice is not None:
            self.voices.put(replace(voice, public=public))
            await asyncio.to_thread(self.publish)

    async def _on_engine(self, model: str, call: Callable[[Any], Any], load: bool, cloning: bool = False) -> Any:
        """call(engine) on the model's engine thread; the model is loaded first when `load`, else
        nothing is done (None) unless it is loaded. A model unloaded meanwhile is asked for again."""
        if not load:
            future = self._on_loaded(model, call)
            return None if future is None else await asyncio.wrap_future(future)
        slot = self.pool.slots().get(model)
        if cloning and (slot is None or not slot.spec.capabilities.clones):  # as declared: not loaded to find out
            raise _cannot_clone(model, self.models())
        while True:
            batcher = await self.pool.loop(model)
            future = _errand(batcher, call)
            if future is not None:
                return await asyncio.wrap_future(future)

    def _on_loaded(self, model: str, call: Callable[[Any], Any]) -> Future | None:
        """call(engine) handed to the model's engine thread if the model is loaded (its Future), else None."""
        while (batcher := self.pool.loaded().get(model)) is not None:
            future = _errand(batcher, call)
            if future is not None:
                return future
        return None

    # --- what another replica did (from a thread: the refresh of the stored voices) --------------------

    def follow(self, changes: Sequence[tuple[ClonedVoice | None, ClonedVoice | None]]) -> list[ClonedVoice]:
        """Apply what was done through another replica, each change (the voice offered here when it was seen,
        the voice stored now): (None, voice) made, (voice, None) deleted, (voice, voice') made public or
        private. One whose name changed here meanwhile (made or deleted through this replica) is left alone.
        As in add and remove, a new voice's engine has it before the catalogue names it, and a gone one
        leaves the catalogue before its engine; a gone one's file goes too (before the catalogue frees its
        name for another). Blocking: never on the event loop. Returns the new voices their engine
        refused (their file unreadable, or latents not of its shape): not offered."""
        applied = [(old, new) for old, new in changes if self.voices.swap(old, new)]
        made = [new for old, new in applied if old is None]
        refused = self._refused({voice: self._give(voice) for voice in made})
        gone = [old for old, new in applied if new is None]
        for voice in refused:
            self.voices.swap(voice, None)
        for voice in [*gone, *refused]:
            Path(voice.path).unlink(missing_ok=True)
        for voice in [*gone, *made]:
            self.cache.drop_voice(voice.name)  # a gone voice's audio, which one made again must not get
        if applied:
            self.publish()
        removing = [self._on_loaded(voice.model, lambda engine, name=voice.name: engine.remove_voice(name))
                    for voice in gone]
        wait([future for future in removing if future is not None], FOLLOW_WAIT_S)
        for voice in gone:
            self._refuse_queued(voice)
        return refused

    def _give(self, voice: ClonedVoice) -> Future | None:
        """An offered voice to its engine: now if its model is loaded (the Future); once it has loaded if it
        is loading (its load hook may have read the voices before this one was there); else the load hook
        gives it. Its file is read on the engine's thread, as the load hook reads it on the loader's."""

        def add(engine: Any) -> None:
            engine.add_voice(voice.name, load_prompt(voice.path), voice.transcript)

        slot = self.pool.slots().get(voice.model)
        loading = slot.loading if slot is not None else None
        if loading is not None:
            loading.add_done_callback(lambda _: self._on_loaded(voice.model, add))
            return None
        return self._on_loaded(voice.model, add)

    @staticmethod
    def _refused(given: dict[ClonedVoice, Future | None]) -> list[ClonedVoice]:
        """The voices whose engine failed to take them, waiting FOLLOW_WAIT_S at most."""
        futures = [future for future in given.values() if future is not None]
        done, late = wait(futures, FOLLOW_WAIT_S)
        if late:
            log.warning("%d cloned voices made elsewhere are not yet taken by their engine after %.0f s; offered "
                        "anyway", len(late), FOLLOW_WAIT_S)
        refused = []
        for voice, future in given.items():
            if future in done and future.exception() is not None:
                log.error("cloned voice %s could not be given to %s: %s", voice.name, voice.model, future.exception())
                refused.append(voice)
        return refused


def _errand(batcher, call: Callable[[Any], Any]) -> Future | None:
    """call(engine) handed to the batcher's engine thread; None once its loop has ended (unloaded)."""
    try:
        return batcher.run_on_engine(lambda engine=batcher.engine: call(engine))
    except QueueClosed:
        return None


def _cannot_clone(model: str, able: list[str]) -> InvalidRequest:
    return InvalidRequest(f"model {model!r} cannot clone voices; models that can: {', '.join(able) or 'none'}",
                          "model", ErrorCode.MODEL_CANNOT_CLONE)
