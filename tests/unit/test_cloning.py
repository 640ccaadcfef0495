"""Voice cloning's parts without a server: clips are checked for what they are, the catalogue shows a
cloned voice to its owner only until it is public, names are held while voices are made, and a saved
voice prompt given to an engine as it loads speaks as the clip does."""

import asyncio
import threading
from dataclasses import replace
from datetime import UTC, datetime

import numpy as np
import pytest

from tests.fakes import FakeSteppedEngine
from tts_core.audio.encoding import encode
from tts_core.config import Settings
from tts_core.engines import ModelSpec
from tts_core.engines.contract import Capabilities, Shape
from tts_core.errors import Conflict, ErrorCode, InvalidRequest, voice_deleted
from tts_core.request.access import Caller, Tier
from tts_core.scheduler.stepped import synthesize_whole
from tts_core.voices.catalogue import Catalogue
from tts_core.voices.cloning import ClonedVoice, ClonedVoices, read_clip

# --- clips ----------------------------------------------------------------------------------------

RATE = 22050


def tone(seconds: float, level: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (level * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2).astype(np.float32)


@pytest.mark.parametrize("format_name", ["wav", "mp3", "flac", "opus"])
def test_a_clip_is_decoded_whatever_its_container(format_name):
    clip = read_clip(encode(tone(4.0), RATE, format_name))
    assert clip.duration_s == pytest.approx(4.0, abs=0.1) and clip.audio.dtype == np.float32


@pytest.mark.parametrize("data, code", [
    (encode(tone(1.5), RATE, "wav"), "audio_too_short"),
    (encode(tone(31.0), RATE, "flac"), "audio_too_long"),
    (encode(np.zeros(5 * RATE, np.float32), RATE, "wav"), "audio_silent"),
    (encode(tone(5.0, level=0.001), RATE, "mp3"), "audio_silent"),
    (b"GIF89a" + bytes(range(256)) * 40, "audio_unreadable"),
    (b"", "audio_unreadable"),
    (encode(tone(4.0), RATE, "aac"), "audio_unreadable"),  # audio, but not a container a voice may come in
])
def test_a_clip_that_cannot_make_a_voice_says_why(data, code):
    with pytest.raises(InvalidRequest) as refused:
        read_clip(data)
    assert refused.value.param == "audio" and refused.value.code == code


# --- the catalogue and names ----------------------------------------------------------------------


def catalogue_with(clones: dict[str, ClonedVoice]) -> Catalogue:
    engine = FakeSteppedEngine()
    return Catalogue.build([ModelSpec.loaded(engine)], Settings(voice_aliases={}, model_aliases={}), clones)


def test_a_private_voice_is_its_owners_and_looks_missing_to_others():
    mine = ClonedVoice("mine", "fake-ar", "key:1", False, "/nowhere")
    catalogue = catalogue_with({"mine": mine})
    voice, model = catalogue.resolve("mine", caller="key:1")
    assert (voice.name, voice.model, model) == ("mine", "fake-ar", "fake-ar")
    for stranger in ("key:2", "ip:10.0.0.1", None):
        with pytest.raises(InvalidRequest) as refused:
            catalogue.resolve("mine", caller=stranger)
        assert refused.value.code == "voice_not_found" and "mine" not in refused.value.message.split("available")[1]
        assert "mine" not in [voice.name for voice in catalogue.voice_list(stranger)]
    public = catalogue_with({"mine": ClonedVoice("mine", "fake-ar", "key:1", True, "/nowhere")})
    assert public.resolve("mine", caller="key:2")[0].name == "mine"


def test_a_name_is_held_while_it_is_made_and_each_caller_has_a_cap():
    voices = ClonedVoices([ClonedVoice("mine", "fake-ar", "key:1", False, "/nowhere")])
    catalogue = catalogue_with(voices.all())
    with pytest.raises(Conflict):
        with voices.reserving("fake-ar-voice", "key:1", catalogue, 20):  # a configured voice's name
            pass
    with voices.reserving("new", "key:2", catalogue, 20):
        with pytest.raises(Conflict):
            with voices.reserving("new", "key:3", catalogue, 20):
                pass
    with pytest.raises(Conflict) as capped:
        with voices.reserving("second", "key:1", catalogue, 1):
            pass
    assert capped.value.code == "cloned_voice_limit"
    with pytest.raises(InvalidRequest):
        with voices.reserving("../escape", "key:1", catalogue, 20):
            pass


# --- a real engine: the saved prompt and the load hook ---------------------------------------------


@pytest.fixture
def one_torch_thread():
    """Tiny tensors: two intra-op threads only wait on each other on a busy machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow  # generates with a tiny model
def test_a_saved_prompt_given_at_load_speaks_as_the_clip_does(tmp_path, one_torch_thread):
    """What a restart relies on: the prompt file, given to a freshly loaded engine by the load hook,
    makes the same audio as the latents the clip was encoded to, and not the default voice's."""
    from bench.random_model import piper_speech
    from tests.pocket_models import build_tiny_pocket, request
    from tts_core.engines.pocket_tts import PocketTTSEngine
    from tts_core.voices.cloning import prompt_path, save_prompt

    model = build_tiny_pocket(tmp_path / "tiny-pocket")
    encoder = PocketTTSEngine(str(model), [], device="cpu", temperature=0.0, fixed_length=True)
    latents = encoder.voice_prompt_from_audio(piper_speech(16000)[:64000], 16000)
    path = prompt_path(tmp_path / "data", encoder.name, "cloned")
    save_prompt(path, latents)
    loaded = PocketTTSEngine(str(model), [], device="cpu", temperature=0.0, fixed_length=True)
    voices = ClonedVoices([ClonedVoice("cloned", loaded.name, "key:1", False, str(path))])
    voices.give_to(loaded)
    encoder.add_voice("direct", latents)
    assert "cloned" in [voice.name for voice in loaded.voices()]
    text = "Hello there."
    cloned, direct, default = (synthesize_whole(engine, [request(engine, text, voice)])[0].audio
                               for engine, voice in [(loaded, "cloned"), (encoder, "direct"), (loaded, "default")])
    assert np.allclose(cloned, direct, atol=1e-5) and not np.allclose(cloned, default)


# --- replicas: the stored voices followed by another process on the same database -------------------


class CloningEngine(FakeSteppedEngine):
    """A fake that clones: a clip's prompt is a few of its samples; the voices added are kept."""

    kind_capabilities = Capabilities(shape=Shape.STEPPED, clones=True)

    def __init__(self, **fake):
        super().__init__(**fake)
        self.prompts: dict[str, np.ndarray] = {}

    def voice_prompt_from_audio(self, audio: np.ndarray, sample_rate: int) -> np.ndarray:
        return np.resize(audio, (8, 4)).astype(np.float32)

    def add_voice(self, name: str, latents: np.ndarray, transcript: str | None = None) -> None:
        self.prompts = {**self.prompts, name: np.asarray(latents)}

    def remove_voice(self, name: str) -> None:
        self.prompts = {known: prompt for known, prompt in self.prompts.items() if known != name}

    def context_tokens(self, item) -> int:
        """As the real engines: a voice deleted while the item waited refuses it as it would start."""
        if item.voice not in [*self.prompts, "fake-ar-voice"]:
            raise voice_deleted(self.name, item.voice)
        return super().context_tokens(item)


@pytest.fixture
def replicas(tmp_path):
    """Two replicas' cloned voices (each its engine, its data dir) on one SQLite database."""
    from clones import VoiceClones
    from storage import Storage, sqlite_url
    from tts_core.ops.metrics import Metrics
    from tts_core.service import SpeechService

    url = sqlite_url(tmp_path / "shared.db")
    Storage(url).migrate()
    made = []
    for name in ("here", "there"):
        engine = CloningEngine()
        service = SpeechService(Settings(data_dir=tmp_path / name, calibration_sizes=[1]), [engine], Metrics())
        service.start()
        made.append((VoiceClones(Storage(url), service), engine))
    yield made
    for clones, _ in made:
        clones.service.stop()


OWNER = Caller("key:1", "free", Tier())


def offered_to(clones, caller: str | None = None) -> list[str]:
    return [voice.name for voice in clones.service.catalogue.voice_list(caller) if voice.name != "fake-ar-voice"]


def test_a_voice_cloned_on_one_replica_is_followed_by_another(replicas):
    (here, here_engine), (there, there_engine) = replicas
    asyncio.run(here.create(OWNER, encode(tone(4.0), RATE, "wav"), "alice", "fake-ar", True))
    catalogue = there.service.catalogue
    there.refresh()
    assert offered_to(there, "key:1") == ["alice"] and offered_to(there, "key:2") == []
    assert np.array_equal(there_engine.prompts["alice"], here_engine.prompts["alice"])
    assert (there.data_dir / "voices/cloned/fake-ar/alice.safetensors").is_file()  # written from the row's bytes
    assert there.service.catalogue is not catalogue
    for clones in (here, there):  # nothing changed: nothing done (the one that made it included)
        catalogue = clones.service.catalogue
        clones.refresh()
        assert clones.service.catalogue is catalogue
    asyncio.run(here.set_public("alice", True, "ops"))
    there.refresh()
    assert offered_to(there, "key:2") == ["alice"]
    asyncio.run(here.delete("alice", "ops"))
    there.refresh()
    assert offered_to(there, "key:1") == [] and "alice" not in there_engine.prompts
    assert not (there.data_dir / "voices/cloned/fake-ar/alice.safetensors").exists()


def test_a_voice_made_again_elsewhere_under_its_name_replaces_the_old_one(replicas):
    (here, _), (there, there_engine) = replicas
    asyncio.run(here.create(OWNER, encode(tone(4.0), RATE, "wav"), "alice", "fake-ar", True))
    there.refresh()
    asyncio.run(here.delete("alice", "ops"))
    other = Caller("key:2", "free", Tier())
    asyncio.run(here.create(other, encode(tone(5.0, level=0.5), RATE, "wav"), "alice", "fake-ar", True))
    there.refresh()  # both at once, between two refreshes
    assert offered_to(there, "key:2") == ["alice"] and offered_to(there, "key:1") == []
    assert np.array_equal(there_engine.prompts["alice"], here.service.pool.loaded()["fake-ar"].engine.prompts["alice"])


def test_the_refresh_leaves_a_name_being_made_here_alone(replicas):
    (here, here_engine), (there, _) = replicas
    asyncio.run(there.create(OWNER, encode(tone(4.0), RATE, "wav"), "bob", "fake-ar", True))
    catalogue = here.service.catalogue
    with here.service.clones.reserving("bob", "key:1", catalogue, 20):  # as if made here at the same moment
        here.refresh()
        assert "bob" not in here.service.clones.all() and "bob" not in here_engine.prompts
    here.refresh()
    assert offered_to(here, "key:1") == ["bob"]


def test_a_voice_changed_here_meanwhile_is_not_undone_by_a_refresh():
    seen = ClonedVoice("mine", "fake-ar", "key:1", False, "/nowhere")
    voices = ClonedVoices([seen])
    voices.drop("mine")  # deleted here after the refresh read the voices
    assert not voices.swap(seen, None) and not voices.swap(seen, replace(seen, public=True))
    assert voices.swap(None, seen) and voices.all() == {"mine": seen}
    assert not voices.swap(None, seen)  # made here meanwhile


def test_a_stored_voice_this_replica_cannot_offer_is_logged_once(replicas, caplog):
    (here, _), _ = replicas
    for name, model in (("no-model", "elsewhere-only"), ("no-prompt", "fake-ar")):
        here.storage.cloned_voices.add(name, model, "key:1", 4.0, None, f"voices/cloned/{model}/{name}.safetensors",
                                      datetime.now(UTC), "key:1")
    for _ in range(3):
        here.refresh()
    assert offered_to(here, "key:1") == []
    said = [record.getMessage() for record in caplog.records if "is not offered" in record.getMessage()]
    assert len(said) == 2 and "no-model" in said[0] and "no-prompt" in said[1]


def test_a_failing_refresh_is_logged_once_and_keeps_the_other_refreshes_going(replicas, caplog, monkeypatch):
    (here, _), (there, _) = replicas
    asyncio.run(here.create(OWNER, encode(tone(4.0), RATE, "wav"), "alice", "fake-ar", True))

    def broken(changes):
        raise RuntimeError("a bug")

    monkeypatch.setattr(there.service.cloner, "follow", broken)
    for _ in range(3):
        there.refresh()  # raises nothing: OperatorControl goes on to the settings, keys and lexicon
    assert sum("cloned voices refresh failed" in record.getMessage() for record in caplog.records) == 1
    monkeypatch.undo()
    there.refresh()
    assert offered_to(there, "key:1") == ["alice"]


def test_a_process_that_makes_no_clones_refuses_them_and_still_follows_the_stored_ones(replicas):
    (here, _), (there, there_engine) = replicas
    there.service.cloner.refusal = "this process makes no clones"  # as the Ray Serve ingress says
    with pytest.raises(InvalidRequest) as refused:
        asyncio.run(there.create(OWNER, encode(tone(4.0), RATE, "wav"), "bob", "fake-ar", True))
    assert refused.value.code == "model_cannot_clone" and "makes no clones" in refused.value.message
    assert there.service.cloner.models() == [] and there.service.cloner.speaking() == ["fake-ar"]
    asyncio.run(here.create(OWNER, encode(tone(4.0), RATE, "wav"), "alice", "fake-ar", True))
    there.refresh()
    assert offered_to(there, "key:1") == ["alice"] and "alice" in there_engine.prompts


def test_a_voice_deleted_mid_dialogue_refuses_its_waiting_turns_at_once(tmp_path):
    """Issue 52: a dialogue's later turn in a cloned voice deleted while its first turn runs. The turn still queued is
    refused as the voice is deleted, naming it deleted while the request ran, not when it would have started (after
    15.5 s on Pocket TTS, "deleted before this request started"); the running turn is not waited for."""
    from clones import VoiceClones
    from storage import Storage, sqlite_url
    from tts_core.ops.metrics import Metrics
    from tts_core.request.ask import Ask
    from tts_core.service import SpeechService

    url = sqlite_url(tmp_path / "voices.db")
    Storage(url).migrate()
    engine = CloningEngine(step_cost=lambda running: 0.01, max_running=1)  # one turn at a time, a step each token
    service = SpeechService(Settings(data_dir=tmp_path, calibration_sizes=[1]), [engine], Metrics())
    service.start()
    try:
        assert service.loops["fake-ar"].calibrated.wait(30)
        clones = VoiceClones(Storage(url), service)
        asyncio.run(clones.create(OWNER, encode(tone(4.0), RATE, "wav"), "alice", "fake-ar", True))
        long_turn = "and so it goes on " * 20  # 360 tokens: 360 steps, 3.6 s at least
        script = f"Ann: {long_turn}\nBob: Hello there.\nAnn: And a last word."
        engine.steps_run.clear()
        running = threading.Event()
        engine.on_step = running.set

        async def deleted_mid_dialogue() -> InvalidRequest:
            cast = {"Ann": "alice", "Bob": "fake-ar-voice"}
            answer = asyncio.ensure_future(service.answer(Ask(script=script, voices=cast, response_format="pcm",
                                                              caller=OWNER)))
            assert await asyncio.to_thread(running.wait, 30)  # the first turn runs; the others wait
            await clones.delete("alice", "ops")
            with pytest.raises(InvalidRequest) as refused:
                await answer
            return refused.value

        refused = asyncio.run(deleted_mid_dialogue())
        assert len(engine.steps_run) < len(long_turn) / 2  # answered long before the first turn could have ended
        assert refused.param == "voice" and refused.code == ErrorCode.VOICE_NOT_FOUND
        assert "'alice'" in refused.message and "deleted while this request ran" in refused.message
    finally:
        service.stop()
