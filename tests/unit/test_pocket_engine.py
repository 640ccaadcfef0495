"""The Pocket TTS stepped engine, on a tiny random model built once and loaded as the server loads it
(a registry file, KINDS["pocket_tts"], spec.load())."""

import shutil
import wave

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.utils.mkldnn import MkldnnLinear
from transformers import PocketTTSAudioTokenizerModel, PocketTTSForConditionalGeneration, PocketTTSProcessor

from bench.random_model import piper_speech
from tests.pocket_models import build_tiny_pocket, random_voice, registry_spec, request
from tts_core.engines.base import EngineUnavailable, VoiceSpec
from tts_core.engines.pocket_codec import read_clip
from tts_core.engines.pocket_tts import PocketTTSEngine, describe_pocket_tts
from tts_core.errors import InvalidRequest
from tts_core.scheduler.stepped import synthesize_whole

VOICES = {  # registry name -> entry options
    "tiny": {"fixed_length": True, "max_running": 3},  # no prompt: the shipped default voice
    "other": {"prompt": "other.safetensors"},  # relative to the model folder
    "spoken": {"prompt": "spoken.wav"},  # a clip, encoded at load
}


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny tensors: two intra-op threads only wait on each other on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    folder = build_tiny_pocket(tmp_path_factory.mktemp("pocket") / "tiny-pocket")
    save_file({"audio_prompt_latents": torch.from_numpy(random_voice(20, seed=1))}, str(folder / "other.safetensors"))
    speech = (piper_speech(16000)[:32000] * 32767).astype(np.int16)
    with wave.open(str(folder / "spoken.wav"), "wb") as clip:
        clip.setnchannels(1), clip.setsampwidth(2), clip.setframerate(16000)
        clip.writeframes(speech.tobytes())
    return folder


@pytest.fixture(scope="session")
def loaded(model, tmp_path_factory):
    spec = registry_spec(model, VOICES, tmp_path_factory.mktemp("registry"))
    return spec, spec.load()


@pytest.fixture
def engine(loaded):
    engine = loaded[1]
    engine.temperature, engine.fixed_length = 0.0, True  # greedy, whole budgets, unless a test says otherwise
    yield engine
    for item in engine.running():
        engine.release(item)


def prompt_of(engine, model, voice: str) -> np.ndarray:
    files = {"tiny": "voices/default.safetensors", "default": "voices/default.safetensors",
             "other": "other.safetensors"}
    return load_file(str(model / files[voice]))["audio_prompt_latents"].numpy()


@pytest.fixture(scope="session")
def dense(model):
    """The model as transformers loads it (the engine's Linear layers are prepacked for the CPU)."""
    return PocketTTSForConditionalGeneration.from_pretrained(model, local_files_only=True).eval()


@pytest.fixture(scope="session")
def dense_processor(model):
    """The processor with its codec as transformers loads them."""
    codec = PocketTTSAudioTokenizerModel.from_pretrained(model / "codec", local_files_only=True).eval()
    return PocketTTSProcessor.from_pretrained(model, local_files_only=True, audio_tokenizer=codec)


def generate_alone(dense, engine, text: str, voice: np.ndarray) -> torch.Tensor:
    """What transformers' generate makes for this request alone (greedy), in the codec's space."""
    tokenizer = engine.processor.tokenizer
    prompt = f"{tokenizer.audio_prompt_bos_token}{tokenizer.audio_prompt_token}{text}{tokenizer.audio_bos_token}"
    inputs = engine.processor(text=[prompt], audio_prompt_latents=[torch.from_numpy(voice)], return_tensors="pt")
    never_ends = {"eos_threshold": 1e9} if engine.fixed_length else {}
    with torch.inference_mode():
        out = dense.generate(**inputs, do_sample=False, return_dict_in_generate=True, **never_ends)
    return out.audio_latents[0][out.audio_latents_mask[0].bool()]


def run(engine, joining: dict[int, list], take_every: int = 0, admitted: list = ()):
    """Step the engine as a batcher would: requests join at their step when a row is free; each finished
    one's latents and audio are kept, then it is released. Returns (latents, audio, most running)."""
    latents, audio, most, step = {}, {}, 0, 0
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
                audio.setdefault(named[item_id], []).append(engine.take_audio(item_id, final=item_id in finished))
        for item_id in finished:
            latents[named[item_id]] = engine.latents(item_id)
            engine.release(item_id)
        step += 1
    return latents, audio, most


def test_the_registry_voices_are_what_loads_and_any_voices_run_together(loaded):
    spec, engine = loaded
    assert [voice.name for voice in spec.voices] == ["tiny", "other", "spoken", "default"]  # + the shipped one
    assert engine.voices() == spec.voices and engine.max_running == 3 and engine.fixed_length
    assert all(not voice.speed_control and voice.sample_rate == 24000 for voice in spec.voices)
    assert engine.batch_key("tiny", 1.0) == engine.batch_key("other", 1.0)
    assert engine.kv_bytes_per_token == 2 * 2 * 64 * 4  # keys and values x 2 layers x 64 dims x fp32
    # on the CPU every Linear is prepacked (the frames are still generate's: the tests below compare them)
    layers = [layer for module in (engine.model, engine.codec) for layer in module.modules()]
    assert not [layer for layer in layers if isinstance(layer, torch.nn.Linear)]
    # and no dense copy is kept alive by autograd beside the prepacked one
    assert all(layer.weight.grad_fn is None for layer in layers if isinstance(layer, MkldnnLinear))


def test_the_prompt_is_the_processors(engine, model):
    item = request(engine, "Hello there.", "other")
    tokenizer = engine.processor.tokenizer
    prompt = f"{tokenizer.audio_prompt_bos_token}{tokenizer.audio_prompt_token}Hello there.{tokenizer.audio_bos_token}"
    voice = torch.from_numpy(prompt_of(engine, model, "other"))
    inputs = engine.processor(text=[prompt], audio_prompt_latents=[voice], return_tensors="pt")
    assert engine.context_tokens(item) == inputs["input_ids"].shape[1] + engine.frames_needed(item)
    assert engine.frames_needed(item) == 75  # ceil((12 tokens / 3 + 2) * 12.5)


@pytest.mark.parametrize("fixed_length", [True, False])
def test_requests_joining_at_different_steps_make_what_generate_makes_alone(engine, model, fixed_length, dense):
    engine.fixed_length = fixed_length
    texts = {"Hi.": "tiny", "Good day, you.": "other", "Hey": "default", "Yo!": "other"}
    items = {text: request(engine, text, voice) for text, voice in texts.items()}
    joining = {0: [items["Hi."]], 2: [items["Good day, you."], items["Hey"]], 5: [items["Yo!"]]}
    latents, _, most = run(engine, joining)
    assert most == engine.max_running == 3  # the last one waited for a free row
    for text, item in items.items():
        expected = generate_alone(dense, engine, text, prompt_of(engine, model, texts[text]))
        assert latents[item].shape == expected.shape
        assert torch.abs(latents[item] - expected).max() < 1e-5
        if fixed_length:
            assert len(latents[item]) == engine.frames_needed(item)
        else:  # random weights: the end of speech comes early, the frames after it follow
            assert len(latents[item]) < engine.frames_needed(item)


def test_streamed_pieces_equal_one_decode_and_synthesize_gives_whole_budgets(engine, dense_processor):
    engine.temperature = 0.7
    items = [request(engine, "Hi.", "tiny"), request(engine, "How are you?", "other")]
    latents, audio, _ = run(engine, {0: items[:1], 3: items[1:]}, take_every=3)
    for item in items:
        streamed = np.concatenate(audio[item])
        whole = np.clip(dense_processor.decode(latents[item]).numpy(), -1, 1)  # with the processor's fade-in
        assert len(audio[item]) > 3 and streamed.dtype == np.float32
        assert streamed.shape == whole.shape == (len(latents[item]) * engine.frame_size,)
        assert np.abs(streamed - whole).max() <= 1e-5 * np.abs(whole).max()
    texts = {"Hi.": "tiny", "Hello you.": "other", "A": "spoken"}
    batch = [request(engine, text, voice) for text, voice in texts.items()]
    for item, out in zip(batch, synthesize_whole(engine, batch)):
        assert out.audio.dtype == np.float32 and np.abs(out.audio).max() <= 1.0
        assert out.audio.size == engine.frames_needed(item) * engine.frame_size
    assert engine.running() == []


def test_a_release_frees_its_row_at_once_and_leaves_nothing_behind(engine, model, dense):
    first, second, third, late = (request(engine, text, "tiny") for text in ["One.", "Two.", "Three.", "Four"])
    engine.admit([first, second, third])
    engine.step()
    with pytest.raises(ValueError, match="do not fit"):
        engine.admit([late])
    engine.release(second.id)  # abandoned half-way: the next request takes its row at the next step
    assert engine.running() == [first.id, third.id]
    engine.admit([late])
    assert engine.running() == [first.id, third.id, late.id]
    assert engine.context_length(late.id) < engine.context_length(first.id)
    latents, _, _ = run(engine, {}, admitted=[first, third, late])
    expected = generate_alone(dense, engine, "Four", prompt_of(engine, model, "tiny"))
    assert torch.abs(latents[late] - expected).max() < 1e-5
    assert engine.running() == [] and engine.take_audio(second.id).size == 0
    with pytest.raises(KeyError):
        engine.context_length(second.id)
    engine.release_memory()  # with nothing running the cache goes; the next admission makes a new one
    assert engine._cache.capacity == 0
    assert len(synthesize_whole(engine, [request(engine, "Hi.", "tiny")])[0].audio) == 38 * engine.frame_size


def test_a_voice_made_from_a_clip_is_a_voice_of_its_own(engine, model):
    clip = read_clip(model / "spoken.wav", 16000)
    latents = engine.voice_prompt_from_audio(clip, 16000)  # resampled to the codec's 24 kHz
    assert latents.dtype == np.float32 and latents.shape[1] == 32 and 25 <= len(latents) <= 28  # 2 s + a pause
    voice = engine.add_voice("clone", latents)
    assert voice in engine.voices() and not voice.speed_control
    clone, spoken, default = (output.audio for output in synthesize_whole(
        engine, [request(engine, "Hi.", name) for name in ["clone", "spoken", "tiny"]]))
    assert np.abs(clone - spoken).max() < 1e-2  # the registry's voice from the same clip
    assert np.abs(clone - default).max() > 1e-4  # tiny random weights barely listen to the voice, but they do
    engine.remove_voice("clone")
    assert "clone" not in {voice.name for voice in engine.voices()}
    with pytest.raises(InvalidRequest, match="no voice 'clone'"):
        engine.admit([request(engine, "Hi.", "clone")])


def test_voices_are_described_without_the_weights_and_a_bad_model_is_named(model, tmp_path, monkeypatch):
    configs_only = tmp_path / "configs-only"
    shutil.copytree(model, configs_only, ignore=shutil.ignore_patterns("*.safetensors"))
    shutil.copytree(model / "voices", configs_only / "voices", dirs_exist_ok=True)
    voices = describe_pocket_tts(str(configs_only), [VoiceSpec("a"), VoiceSpec("default", language="en_GB")])
    assert [(voice.name, voice.language) for voice in voices] == [("a", "en"), ("default", "en_GB")]
    with pytest.raises(EngineUnavailable, match="configs-only"):  # the weights are not there
        PocketTTSEngine(str(configs_only), [], device="cpu")
    with pytest.raises(EngineUnavailable, match="missing.safetensors"):
        describe_pocket_tts(str(model), [VoiceSpec("a", prompt="missing.safetensors")])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for source in [str(tmp_path / "nowhere"), "kyutai/no-such-pocket"]:
        with pytest.raises(EngineUnavailable, match=source):
            describe_pocket_tts(source, [])
        with pytest.raises(EngineUnavailable, match=source):
            PocketTTSEngine(source, [], device="cpu")
    with pytest.raises(EngineUnavailable, match="needs CUDA"):
        PocketTTSEngine(str(model), [], device="cpu", dtype="bf16")


def test_a_voice_given_a_new_prompt_speaks_with_it_not_with_its_cached_prefix(engine, model, dense):
    run(engine, {0: [request(engine, "Hi.", "other")]})  # the voice's prefix is cached now
    new = random_voice(12, seed=5)
    engine.add_voice("other", new)
    try:
        item = request(engine, "Hi.", "other")
        latents, _, _ = run(engine, {0: [item]})
        assert torch.abs(latents[item] - generate_alone(dense, engine, "Hi.", new)).max() < 1e-5
    finally:
        engine.add_voice("other", prompt_of(engine, model, "other"))
