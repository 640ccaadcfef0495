"""The VibeVoice stepped engine, on a tiny random model built once and loaded as the server loads it
(a registry file, KINDS["vibevoice"], spec.load()); and served through the real batcher."""

import asyncio
import shutil
import wave

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from bench.random_model import piper_speech
from tests.pocket_models import registry_spec, request
from tests.vibevoice_models import build_tiny_vibevoice, generate_alone, script
from tts_core.config import Settings
from tts_core.engines.base import EngineUnavailable, VoiceSpec
from tts_core.engines.pocket_codec import read_clip
from tts_core.engines.vibevoice import VibeVoiceEngine, describe_vibevoice
from tts_core.engines.vibevoice_parts import DPMSolver, encode_voice
from tts_core.errors import InvalidRequest
from tts_core.ops.metrics import Metrics
from tts_core.request.ask import Ask
from tts_core.scheduler.stepped import synthesize_whole
from tts_core.service import SpeechService

pytestmark = pytest.mark.slow  # a tiny model generating, step by step: the full run only (see pytest.ini)

VOICES = {  # registry name -> entry options
    "tiny": {"fixed_length": True, "max_running": 3},  # no prompt: the shipped default voice
    "other": {"prompt": "other.safetensors"},  # relative to the model folder
    "spoken": {"prompt": "spoken.wav"},  # a clip, encoded at load
}
OTHER_TEXT = "Another voice, for the tests."


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny tensors: two intra-op threads only wait on each other on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def clips():
    """Each voice's clip at 24 kHz (the shipped voice is the builder's Piper speech)."""
    default = piper_speech(24000)
    return {"tiny": default, "default": default, "other": piper_speech(24000, OTHER_TEXT)}


@pytest.fixture(scope="session")
def model(tmp_path_factory, clips):
    folder = build_tiny_vibevoice(tmp_path_factory.mktemp("vibevoice") / "tiny-vibevoice")
    from transformers import VibeVoiceAcousticTokenizerFeatureExtractor, VibeVoiceForConditionalGeneration

    tiny = VibeVoiceForConditionalGeneration.from_pretrained(folder)
    other = encode_voice(tiny, VibeVoiceAcousticTokenizerFeatureExtractor(), clips["other"], 24000)
    save_file({"acoustic_latents": torch.from_numpy(other)}, str(folder / "other.safetensors"))
    speech = (piper_speech(16000)[:32000] * 32767).astype(np.int16)
    with wave.open(str(folder / "spoken.wav"), "wb") as clip:
        clip.setnchannels(1), clip.setsampwidth(2), clip.setframerate(16000)
        clip.writeframes(speech.tobytes())
    clips["spoken"] = read_clip(folder / "spoken.wav", 24000)
    return folder


@pytest.fixture(scope="session")
def loaded(model, tmp_path_factory):
    spec = registry_spec(model, VOICES, tmp_path_factory.mktemp("registry"), engine="vibevoice")
    return spec, spec.load()


@pytest.fixture
def engine(loaded):
    engine = loaded[1]
    engine.temperature, engine.fixed_length = 0.0, True  # no noise, whole budgets, unless a test says otherwise
    yield engine
    for item in engine.running():
        engine.release(item)


def run(engine, joining: dict[int, list], take_every: int = 0, admitted: list = ()):
    """Step the engine as a batcher would: requests join at their step when a row is free; each finished
    one's latents and audio pieces are kept, then it is released. Returns (latents, pieces, most running)."""
    latents, pieces, most, step = {}, {}, 0, 0
    waiting = [(at, item) for at, items in sorted(joining.items()) for item in items]
    named = {item.id: item for item in admitted}  # the inputs by id (`admitted`: those running already)
    while waiting or engine.running():
        due = [item for at, item in waiting if at <= step][: engine.max_running - len(engine.running())]
        waiting = [(at, item) for at, item in waiting if item not in due]
        named.update((item.id, item) for item in due)
        finished = (engine.admit(due) if due else []) + engine.step()
        most = max(most, len(engine.running()))
        for item_id in engine.running():
            if item_id in finished or (take_every and step % take_every == 0):
                pieces.setdefault(named[item_id], []).append(engine.take_audio(item_id, final=item_id in finished))
        for item_id in finished:
            latents[named[item_id]] = engine.latents(item_id)
            engine.release(item_id)
        step += 1
    return latents, pieces, most


def joined(pieces: list[np.ndarray] | None) -> np.ndarray:
    return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)


def assert_close(audio: np.ndarray, expected: np.ndarray) -> None:
    """Random weights make faint audio: compared relative to its peak."""
    assert audio.shape == expected.shape
    assert np.abs(audio - expected).max() <= 1e-5 * max(np.abs(expected).max(), 1e-30)


def test_the_registry_voices_are_what_loads_and_any_voices_run_together(loaded):
    spec, engine = loaded
    assert [voice.name for voice in spec.voices] == ["tiny", "other", "spoken", "default"]  # + the shipped one
    assert engine.voices() == spec.voices and engine.max_running == 3 and engine.fixed_length
    assert all(not voice.speed_control and voice.sample_rate == 24000 for voice in spec.voices)
    assert engine.batch_key("tiny", 1.0) == engine.batch_key("other", 1.0)
    assert engine.frame_rate == 7.5 and engine.frame_size == 3200
    assert engine.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4  # keys and values x 2 layers x 2 heads x 16 dims x fp32


def test_the_prompt_is_the_processors_script(engine, clips):
    item = request(engine, "Hello there.", "other")
    inputs = engine.processor(text=[script(engine.processor, "Hello there.")], audio=[clips["other"]],
                              sampling_rate=24000, return_tensors="pt")
    assert inputs["input_ids"][0].tolist() == engine._prompt_ids(item)
    assert item.length == len(" Speaker 0: Hello there.\n")  # the tiny tokenizer: a token a byte
    assert engine.frames_needed(item) == 78  # ceil((25 tokens / 3 + 2) * 7.5)
    assert engine.context_tokens(item) == len(engine._prompt_ids(item)) + 1 + 2 * 78  # both rows
    assert engine.tokenize("  Two\nlines ", "tiny")[0].tolist() == engine.tokenize("Two lines", "tiny")[0].tolist()


def test_requests_joining_at_different_steps_make_what_generate_makes_alone(engine, clips):
    texts = {"Hi.": "tiny", "Good day, you.": "other", "Hey": "default", "Yo!": "spoken"}
    items = {text: request(engine, text, voice) for text, voice in texts.items()}
    joining = {0: [items["Hi."]], 2: [items["Good day, you."], items["Hey"]], 5: [items["Yo!"]]}
    latents, pieces, most = run(engine, joining)
    assert most == engine.max_running == 3  # the last one waited for a free row
    for text, item in items.items():
        assert len(latents[item]) == engine.frames_needed(item)
        assert_close(joined(pieces[item]), generate_alone(engine, item, text, clips[texts[text]]))


def test_an_end_of_speech_leaves_at_once_and_the_others_stay_exact(engine, clips, monkeypatch):
    engine.fixed_length = False  # random weights: the end of speech comes at once, in generate too
    first = request(engine, "Hi.", "tiny")
    assert engine.admit([first]) == [first.id] and engine.take_audio(first.id).size == 0
    assert generate_alone(engine, first, "Hi.", clips["tiny"]).size == 0
    engine.release(first.id)
    engine.fixed_length = True
    speaking, ending = request(engine, "Hey", "tiny"), request(engine, "Yo!", "other")
    choose = engine._tokens  # `ending` says end of speech after its fourth frame
    monkeypatch.setattr(engine, "_tokens", lambda rows, positive: [
        engine.model.config.eos_token_id if run.item is ending and len(run.latents) == 4 else token
        for run, token in zip(rows, choose(rows, positive))])
    latents, pieces, _ = run(engine, {0: [speaking, ending]})
    assert len(latents[ending]) == 4 and joined(pieces[ending]).size == 4 * engine.frame_size
    assert_close(joined(pieces[speaking]), generate_alone(engine, speaking, "Hey", clips["tiny"]))


def test_streamed_pieces_equal_one_decode_and_synthesize_gives_whole_budgets(engine):
    engine.temperature = 1.0
    items = [request(engine, "Hi.", "tiny"), request(engine, "How are you?", "other")]
    latents, pieces, _ = run(engine, {0: items[:1], 3: items[1:]}, take_every=3)
    tower, scale, bias = engine.model.model.audio_tower, engine.model.model.latent_scaling_factor, \
        engine.model.model.latent_bias_factor
    for item in items:
        streamed = joined(pieces[item])
        with torch.inference_mode():
            whole = tower.decode((latents[item] / scale - bias)[None]).audio.reshape(-1).numpy()
        assert len(pieces[item]) > 3 and streamed.dtype == np.float32
        assert streamed.size == len(latents[item]) * engine.frame_size
        assert_close(streamed, np.clip(whole, -1, 1))
    texts = {"Hi.": "tiny", "Hello you.": "other", "A": "spoken"}
    batch = [request(engine, text, voice) for text, voice in texts.items()]
    for item, out in zip(batch, synthesize_whole(engine, batch)):
        assert out.audio.dtype == np.float32 and np.abs(out.audio).max() <= 1.0
        assert out.audio.size == engine.frames_needed(item) * engine.frame_size
    assert engine.running() == []


def test_a_release_frees_its_rows_at_once_and_leaves_nothing_behind(engine, clips):
    first, second, third, late = (request(engine, text, "tiny") for text in ["One.", "Two.", "Three.", "Four"])
    engine.admit([first, second, third])
    engine.step()
    with pytest.raises(ValueError, match="do not fit"):
        engine.admit([late])
    engine.release(second.id)  # abandoned half-way: the next request takes its rows at the next step
    assert engine.running() == [first.id, third.id]
    assert {layer.cache.shape[0] for layer in engine._streams._layers()} == {2}  # its stream rows went too
    engine.admit([late])
    assert engine.running() == [first.id, third.id, late.id]
    assert engine.context_length(late.id) < engine.context_length(first.id)
    _, pieces, _ = run(engine, {}, admitted=[first, third, late])
    assert_close(joined(pieces[late]), generate_alone(engine, late, "Four", clips["tiny"]))
    assert engine.running() == [] and engine.take_audio(second.id).size == 0
    with pytest.raises(KeyError):
        engine.context_length(second.id)
    engine.release_memory()  # with nothing running the cache goes; the next admission makes a new one
    assert engine._cache.capacity == 0
    assert len(synthesize_whole(engine, [request(engine, "Hi.", "tiny")])[0].audio) == 55 * engine.frame_size


def test_a_voice_made_from_a_clip_is_a_voice_of_its_own(engine, model):
    clip = read_clip(model / "spoken.wav", 16000)
    latents = engine.voice_prompt_from_audio(clip, 16000)  # resampled to 24 kHz
    assert latents.dtype == np.float32 and latents.shape == (15, 16)  # 2 s at 7.5 frames/s, 16-dim latents
    voice = engine.add_voice("clone", latents)
    assert voice in engine.voices() and not voice.speed_control
    clone, spoken, default = (output.audio for output in synthesize_whole(
        engine, [request(engine, "Hi.", name) for name in ["clone", "spoken", "tiny"]]))
    peak = np.abs(spoken).max()
    assert np.abs(clone - spoken).max() < 1e-2 * peak  # the registry's voice from the same clip
    assert np.abs(clone - default).max() > 1e-3 * peak  # tiny random weights barely listen to the voice, but they do
    engine.remove_voice("clone")
    assert "clone" not in {voice.name for voice in engine.voices()}
    with pytest.raises(InvalidRequest, match="no voice 'clone'"):
        engine.admit([request(engine, "Hi.", "clone")])
    with pytest.raises(ValueError, match=r"\(frames, 16\)"):
        engine.add_voice("wrong", np.zeros((4, 32), np.float32))


def test_voices_are_described_without_the_weights_and_a_bad_model_is_named(model, tmp_path, monkeypatch):
    configs_only = tmp_path / "configs-only"
    shutil.copytree(model, configs_only, ignore=shutil.ignore_patterns("*.safetensors"))
    shutil.copytree(model / "voices", configs_only / "voices", dirs_exist_ok=True)
    voices = describe_vibevoice(str(configs_only), [VoiceSpec("a"), VoiceSpec("default", language="zh")])
    assert [(voice.name, voice.language, voice.model) for voice in voices] == [("a", "en", "vibevoice"),
                                                                                ("default", "zh", "vibevoice")]
    with pytest.raises(EngineUnavailable, match="configs-only"):  # the weights are not there
        VibeVoiceEngine(str(configs_only), [], device="cpu")
    with pytest.raises(EngineUnavailable, match="missing.safetensors"):
        describe_vibevoice(str(model), [VoiceSpec("a", prompt="missing.safetensors")])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for source in [str(tmp_path / "nowhere"), "vibevoice/no-such-model"]:
        with pytest.raises(EngineUnavailable, match=source):
            describe_vibevoice(source, [])
        with pytest.raises(EngineUnavailable, match=source):
            VibeVoiceEngine(source, [], device="cpu")
    with pytest.raises(EngineUnavailable, match="needs CUDA"):
        VibeVoiceEngine(str(model), [], device="cpu", dtype="bf16")


def test_the_scheduler_is_diffusers_dpm_solver_as_vibevoice_configures_it():
    diffusers = pytest.importorskip("diffusers")
    for steps in (1, 2, 5, 10, 20):
        reference = diffusers.DPMSolverMultistepScheduler(beta_schedule="squaredcos_cap_v2",
                                                          prediction_type="v_prediction")
        ours = DPMSolver()
        reference.set_timesteps(num_inference_steps=steps)
        ours.set_timesteps(steps)
        assert torch.equal(reference.timesteps, ours.timesteps)
        noise = torch.Generator().manual_seed(steps)
        expected = sample = torch.randn(4, 16, generator=noise)
        for timestep in ours.timesteps:
            velocity = torch.randn(4, 16, generator=noise)
            expected = reference.step(velocity, timestep, expected).prev_sample
            sample = ours.step(velocity, timestep, sample).prev_sample
        assert torch.allclose(sample, expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="prediction_type"):
        DPMSolver.from_config({"prediction_type": "epsilon"})


def test_the_tiny_model_serves_two_requests_at_once_through_the_batcher(loaded):
    engine = loaded[1]
    engine.fixed_length = True
    service = SpeechService(Settings(calibration_sizes=[1], voice_aliases={}, model_aliases={}), [engine], Metrics())
    service.start()
    try:
        assert service.loops[engine.name].calibrated.wait(60)

        async def both():
            return await asyncio.gather(service.synthesize(Ask("Hi.", "tiny")),
                                        service.synthesize(Ask("Hello you.", "other")))

        async def streamed():
            stream = await service.answer(Ask("Hi.", "tiny", response_format="pcm", stream=True))
            return [audio async for audio in stream]

        short, long = asyncio.run(both())
        status = service.status()["engines"][engine.name]
        pieces = asyncio.run(streamed())
    finally:
        service.stop()
    budgets = [engine.frames_needed(request(engine, text, "tiny")) for text in ["Hi.", "Hello you."]]
    assert [short.audio.size, long.audio.size] == [frames * engine.frame_size for frames in budgets]
    assert status["running"] == 0 and status["frames_per_step"] > 1  # they ran in the same steps
    assert len(pieces) > 1 and sum(piece.size for piece in pieces) == short.audio.size  # frames as they came
