"""VibeVoice speaks a dialogue natively: a tiny random VibeVoice given a two-speaker conversation holds both speakers'
voice prompts in one context (the original processor's multi-speaker layout) and answers one recording, what
transformers' own `generate` makes of the same script and clips."""

import asyncio
from unittest import mock

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformers import LogitsProcessorList

from bench.random_model import piper_speech
from tests.pocket_models import registry_spec
from tests.vibevoice_models import SpeakOn, build_tiny_vibevoice
from tts_core.config import Settings
from tts_core.engines.contract import EngineInput
from tts_core.engines.vibevoice import MAX_SPEAKERS, SYSTEM_PROMPT, cast_voice, conversation_text
from tts_core.engines.vibevoice_parts import DPMSolver, encode_voice
from tts_core.errors import ErrorCode, InvalidRequest
from tts_core.ops.metrics import Metrics
from tts_core.request.ask import Ask
from tts_core.service import SpeechService

pytestmark = pytest.mark.slow  # a tiny model generating, step by step: the full run only (see pytest.ini)

LINES = [(0, "Hi, Bob."), (1, "Hello."), (0, "Bye")]


@pytest.fixture(scope="module")
def clips():
    return {"tiny": piper_speech(24000), "other": piper_speech(24000, "Another voice, for the tests.")}


@pytest.fixture(scope="module")
def engine(tmp_path_factory, clips):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: two intra-op threads only wait on each other on a busy machine
    folder = build_tiny_vibevoice(tmp_path_factory.mktemp("vibevoice") / "tiny-vibevoice")
    from transformers import VibeVoiceAcousticTokenizerFeatureExtractor, VibeVoiceForConditionalGeneration

    tiny = VibeVoiceForConditionalGeneration.from_pretrained(folder)
    other = encode_voice(tiny, VibeVoiceAcousticTokenizerFeatureExtractor(), clips["other"], 24000)
    save_file({"acoustic_latents": torch.from_numpy(other)}, str(folder / "other.safetensors"))
    voices = {"tiny": {"fixed_length": True}, "other": {"prompt": "other.safetensors"}}
    engine = registry_spec(folder, voices, tmp_path_factory.mktemp("registry"), engine="vibevoice").load()
    engine.temperature = 0.0  # no noise: comparable with generate's run from zeros
    yield engine
    torch.set_num_threads(threads)


def conversation(engine) -> EngineInput:
    voice = cast_voice(["tiny", "other"])
    [tokens] = engine.tokenize(conversation_text(LINES), voice)
    return EngineInput(tokens, voice)


def processor_script(processor) -> str:
    """The original processor's script for two speakers, a voice clip each, and the conversation's lines."""
    bos, eos, placeholder = processor.audio_bos_token, processor.audio_eos_token, processor.audio_token
    voices = "".join(f" Speaker {index}:{bos}{placeholder}{eos}\n" for index in range(2))
    lines = "".join(f" Speaker {speaker}: {text}\n" for speaker, text in LINES)
    return f"{SYSTEM_PROMPT} Voice input:\n{voices} Text input:\n{lines} Speech output:\n{bos}"


def test_both_speakers_voice_prompts_are_in_the_one_context(engine, clips):
    item = conversation(engine)
    inputs = engine.processor(text=[processor_script(engine.processor)], audio=[clips["tiny"], clips["other"]],
                              sampling_rate=24000, return_tensors="pt")
    prompt = engine._prompt_ids(item)
    assert inputs["input_ids"][0].tolist() == prompt
    placeholders = sum(len(engine._prompts[name]) for name in ("tiny", "other"))
    assert prompt.count(engine.model.config.audio_token_id) == placeholders
    assert prompt.count(engine.model.config.audio_bos_token_id) == 3  # a voice each, and the speech output's


def test_the_conversation_is_one_recording_as_generate_makes_it(engine, clips):
    item = conversation(engine)
    finished = engine.admit([item])
    while item.id not in finished:
        finished = engine.step()
    audio = engine.take_audio(item.id, final=True)
    engine.release(item.id)
    assert audio.size == engine.frames_needed(item) * engine.frame_size
    processor, model = engine.processor, engine.model
    inputs = processor(text=[processor_script(processor)], audio=[clips["tiny"], clips["other"]],
                       sampling_rate=24000, return_tensors="pt")
    zeros = mock.patch.object(torch, "randn", lambda *shape, **options: torch.zeros(*shape, **options))
    with torch.inference_mode(), zeros:
        [expected] = model.generate(**inputs, sample=False, noise_scheduler=DPMSolver(),
                                    logits_processor=LogitsProcessorList([SpeakOn(model.config.audio_token_id)]),
                                    num_diffusion_steps=engine.num_diffusion_steps,
                                    guidance_scale=engine.guidance_scale, max_new_tokens=engine.frames_needed(item))
    expected = expected.reshape(-1).float().numpy()
    assert audio.shape == expected.shape
    assert np.abs(audio - expected).max() <= 1e-5 * max(np.abs(expected).max(), 1e-30)


def test_a_cast_is_at_most_four_voices_and_its_lines_name_one_of_them(engine):
    with pytest.raises(ValueError, match="not `Speaker k: text`"):
        engine.tokenize("Speaker 2: Who am I?", cast_voice(["tiny", "other"]))
    too_many = cast_voice(["tiny", "other"] * 3)
    [tokens] = engine.tokenize("Speaker 0: Hi.", too_many)
    with pytest.raises(ValueError, match=f"takes {MAX_SPEAKERS}"):
        engine._prompt_ids(EngineInput(tokens, too_many))


@pytest.fixture(scope="module")
def service(engine):
    service = SpeechService(Settings(calibration_sizes=[1], voice_aliases={}, model_aliases={}), [engine], Metrics())
    service.start()
    assert service.loops[engine.name].calibrated.wait(60)
    yield service
    service.stop()


def test_a_dialogue_in_its_voices_is_one_conversation_batched_with_other_work(engine, service):
    admitted, made = [], []
    script = "\n".join(f"{'Ann' if speaker == 0 else 'Bob'}: {text}" for speaker, text in LINES)
    real = engine.admit
    with mock.patch.object(engine, "admit", side_effect=lambda items: admitted.extend(items) or real(items)):
        async def both():
            return await asyncio.gather(service.answer(Ask(script=script, voices={"Ann": "tiny", "Bob": "other"},
                                                           response_format="pcm"), on_turn=made.append),
                                        service.synthesize(Ask("Hello you.", "other")))
        spoken, alone = asyncio.run(both())
    [talk] = [item for item in admitted if item.voice == cast_voice(["tiny", "other"])]
    assert talk.tokens.tolist() == conversation(engine).tokens.tolist()  # the whole conversation, one input
    assert spoken.duration_s * engine.sample_rate == engine.frames_needed(talk) * engine.frame_size
    assert [(turn.speaker, turn.voice) for turn in spoken.turns] == [("Ann, Bob", "tiny, other")]
    assert made == [len(LINES)]  # a job's progress: one conversation, its turns all made at once
    assert alone.audio.size and service.status()["engines"][engine.name]["frames_per_step"] > 1  # ran side by side


def test_more_speakers_than_its_context_takes_is_refused_naming_the_line(service):
    script = "\n".join(f"S{n}: Hello." for n in range(MAX_SPEAKERS + 1))
    with pytest.raises(InvalidRequest) as raised:
        asyncio.run(service.answer(Ask(script=script, voices={f"S{n}": "tiny" for n in range(MAX_SPEAKERS + 1)})))
    assert raised.value.code == ErrorCode.TOO_MANY_SPEAKERS and f"line {MAX_SPEAKERS + 1}" in raised.value.message
