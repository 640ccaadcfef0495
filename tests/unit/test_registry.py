"""The voice registry file, and loading the engines it names."""

import sys

import pytest

from bench.random_vits import TINY, save_random_vits
from tests.listener import Listener
from tts_core.config import Settings
from tts_core.engines.base import EngineUnavailable
from tts_core.engines.contract import EngineInput
from tts_core.engines.kinds import KINDS
from tts_core.engines.piper import bundled_voice_path
from tts_core.voices.catalogue import Catalogue
from tts_core.voices.registry import RegistryError, load_voice_engine, model_specs, read_registry


def test_voices_of_one_model_share_one_engine(tmp_path):
    path = tmp_path / "voices.yaml"
    path.write_text("voices:\n"
                    "  a: {engine: vits, model: m1, language: en}\n"
                    "  b: {engine: vits, model: m1, speaker: 2, speed: 1.2}\n"
                    "  c: {engine: piper, model: /v/x.onnx}\n")
    grouped = read_registry(path).by_model()
    assert set(grouped) == {("vits", "m1", None), ("piper", "/v/x.onnx", None)}
    assert grouped[("vits", "m1", None)]["b"].speaker == 2 and grouped[("vits", "m1", None)]["b"].speed == 1.2


def test_an_upstream_model_is_one_per_server_and_its_options_come_from_any_of_its_voices(tmp_path, monkeypatch):
    path = tmp_path / "voices.yaml"
    path.write_text("voices:\n"
                    "  vivian: {engine: upstream, model: qwen3, url: 'http://gpu-a:8091/', language: en}\n"
                    "  ryan: {engine: upstream, model: qwen3, url: 'http://gpu-a:8091/', max_in_flight: 4,\n"
                    "         max_cool_down_s: 5,\n"
                    "         extra_body: {task_type: CustomVoice}, api_key_env: QWEN_KEY, sample_rate: 44100}\n"
                    "  other: {engine: upstream, model: qwen3, url: 'http://gpu-b:8091', upstream_voice: vivian}\n")
    monkeypatch.setenv("QWEN_KEY", "secret")
    specs = model_specs(Settings(voices_file=path, data_dir=tmp_path))
    first, second = [spec for spec in specs if spec.registry]
    assert (first.name, second.name) == ("qwen3", "qwen3-2")  # two servers, two models
    assert [voice.name for voice in first.voices] == ["vivian", "ryan"]
    assert first.capabilities.makes_frames and first.capabilities.max_running == 4
    engine = first.load()
    assert (engine.options.url, engine.options.max_in_flight, engine.sample_rate) == ("http://gpu-a:8091", 4, 44100)
    assert (engine.options.max_cool_down_s, second.load().options.max_cool_down_s) == (5, 60)
    assert engine.request_body(engine_input(engine, "ryan"))["task_type"] == "CustomVoice"
    assert second.load().request_body(engine_input(engine, "other"))["voice"] == "vivian"


def engine_input(engine, voice: str) -> EngineInput:
    return EngineInput(engine.tokenize("Hello.", voice)[0], voice)


@pytest.mark.parametrize("text, fault", [
    ("voices: [unclosed", "not valid YAML"),
    ("voices:\n  a: {engine: tacotron, model: m}\n", "voices.a.engine"),
    ("voices:\n  a: {engine: vits, model: m, colour: red}\n", "voices.a.colour"),
    ("voices:\n  a: {engine: vits, model: m, speed: 9}\n", "voices.a.speed"),
    ("voices:\n  a: {engine: upstream, model: m}\n", "needs the url of its server"),
    ("voices:\n  a: {engine: vits, model: m, url: 'http://x'}\n", "url: only for engine: upstream"),
    ("voices:\n  a: {engine: piper, model: m, max_running: 4}\n", "max_running: only for engine: pocket_tts, "),
    ("voices:\n  a: {engine: kokoro, model: m, fixed_length: true}\n", "fixed_length: only for engine: pocket_tts, "),
    ("voices:\n  a: {engine: vits, model: m, prompt: p.pt}\n", "prompt: only for engine: kokoro, pocket_tts"),
    ("voices:\n  a: {engine: upstream, model: m, url: 'ftp://x'}\n", "voices.a.url"),
    ("voices:\n  a: {engine: upstream, model: m, url: 'http://x', api_key_env: 'sk-123'}\n", "voices.a.api_key_env"),
    ("voices:\n  a: {engine: upstream, model: m, url: 'http://x', max_cool_down_s: 0}\n", "voices.a.max_cool_down_s"),
    ("voices:\n  a-*: {engine: vits, model: m}\n", "a-*: a name with * stands for every voice an upstream lists"),
    ("voices:\n  a-*: {engine: upstream, model: m, url: 'http://x', upstream_voice: b}\n", "no upstream_voice"),
    ("voices:\n  '*-*': {engine: upstream, model: m, url: 'http://x'}\n", "(one *"),
])
def test_a_bad_registry_names_the_file_and_the_fault(tmp_path, text, fault):
    path = tmp_path / "voices.yaml"
    path.write_text(text)
    with pytest.raises(RegistryError) as raised:
        read_registry(path)
    assert str(path) in str(raised.value) and fault in str(raised.value)


def test_load_engines_adds_the_registry_voices_beside_the_bundled_one(tmp_path):
    model = save_random_vits(tmp_path / "tiny-vits", **TINY)
    path = tmp_path / "voices.yaml"
    path.write_text(f"voices:\n"
                    f"  tiny: {{engine: vits, model: '{model}', language: en}}\n"
                    f"  joe: {{engine: piper, model: '{bundled_voice_path()}', speed: 1.1}}\n")
    specs = model_specs(Settings(voices_file=path, data_dir=tmp_path, device="cpu"))
    voices = {voice.name: (spec, voice) for spec in specs for voice in spec.voices}
    assert voices["tiny"][0].name == "tiny-vits" and voices["tiny"][1].language == "en"
    assert voices["tiny"][1].sample_rate == 16000 and not voices["tiny"][0].pinned  # read, not loaded
    assert voices["joe"][0].name == "en_US-joe-medium-2" and voices["joe"][1].speed == 1.1  # its own engine
    assert voices["en_US-joe-medium"][0].pinned  # the bundled voice is still there, loaded
    engine = voices["tiny"][0].load()
    assert engine.voices() == [voices["tiny"][1]]  # what was read is what loads


def test_a_registry_voice_can_be_its_languages_voice_and_torch_missing_is_named(tmp_path, monkeypatch):
    model = save_random_vits(tmp_path / "tiny-vits", **TINY)
    path = tmp_path / "voices.yaml"
    path.write_text(f"voices:\n"
                    f"  anna: {{engine: vits, model: '{model}', language: de}}\n"
                    f"  bernd: {{engine: vits, model: '{model}', language: de, speaker: 1, language_default: true}}\n")
    settings = Settings(voices_file=path, data_dir=tmp_path, device="cpu")
    catalogue = Catalogue.build(model_specs(settings), settings)
    assert catalogue.voice_for_language("de")[0].name == "bernd" and catalogue.voice_for_language("de-AT")[0].name == (
        "bernd")
    overridden = settings.model_copy(update={"language_voices": {"de": "anna"}})
    assert Catalogue.build(model_specs(overridden), overridden).voice_for_language("de")[0].name == "anna"
    monkeypatch.setitem(sys.modules, "torch", None)  # as on a machine without torch
    monkeypatch.delitem(sys.modules, "tts_core.engines.vits", raising=False)
    with pytest.raises(EngineUnavailable, match="needs the Python package 'torch', which is not installed"):
        model_specs(settings)


def test_a_registry_model_that_cannot_load_stops_the_start_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = tmp_path / "voices.yaml"
    path.write_text("voices:\n  ghost: {engine: vits, model: facebook/mms-tts-ghost}\n")
    with pytest.raises(EngineUnavailable, match="facebook/mms-tts-ghost"):
        model_specs(Settings(voices_file=path, data_dir=tmp_path, device="cpu"))


def test_load_voice_engine_loads_the_model_of_a_registry_voice_and_names_an_unknown_one(tmp_path):
    model = save_random_vits(tmp_path / "tiny-vits", **TINY)
    path = tmp_path / "voices.yaml"
    path.write_text(f"voices:\n  tiny: {{engine: vits, model: '{model}', language: en}}\n")
    settings = Settings(voices_file=path, data_dir=tmp_path, device="cpu")
    engine = load_voice_engine(settings, "tiny")
    assert engine.name == "tiny-vits" and [voice.name for voice in engine.voices()] == ["tiny"]
    with pytest.raises(EngineUnavailable, match="'nobody'.*en_US-joe-medium, tiny"):
        load_voice_engine(settings, "nobody")


def test_a_star_names_every_voice_the_upstream_lists_and_the_files_own_entries_win(tmp_path):
    listener = Listener(voices={"voices": ["casual_male", "neutral_female", "not a name"],
                                "uploaded_voices": [{"name": "anna", "consent": "yes"}]})  # vLLM-Omni's shape
    try:
        path = tmp_path / "voices.yaml"
        path.write_text(f"voices:\n"
                        f"  omni-*: {{engine: upstream, model: qwen3, url: '{listener.url}', language: en}}\n"
                        f"  omni-anna: {{engine: upstream, model: qwen3, url: '{listener.url}', language: de}}\n")
        spec = next(spec for spec in model_specs(Settings(voices_file=path, data_dir=tmp_path)) if spec.registry)
        assert {voice.name: voice.language for voice in spec.voices} == {
            "omni-anna": "de", "omni-casual_male": "en", "omni-neutral_female": "en"}  # "not a name" left out
        engine = spec.load()
        assert engine.request_body(engine_input(engine, "omni-casual_male"))["voice"] == "casual_male"
        assert engine.request_body(engine_input(engine, "omni-anna"))["voice"] == "omni-anna"  # its own entry
        listener.voices = {"voices": []}
        path.write_text(path.read_text().split("  omni-anna")[0])
        with pytest.raises(RegistryError, match="omni-\\*: the model lists no voices"):
            model_specs(Settings(voices_file=path, data_dir=tmp_path))
    finally:
        listener.close()


def test_each_entry_is_its_kinds_options_and_another_kinds_field_is_refused_naming_the_kind(tmp_path):
    path = tmp_path / "voices.yaml"
    path.write_text("voices:\n  a: {engine: vits, model: m}\n  b: {engine: upstream, model: m, url: 'http://x'}\n")
    voices = read_registry(path).voices
    assert {name: type(entry) for name, entry in voices.items()} == {
        "a": KINDS["vits"].options, "b": KINDS["upstream"].options}
    assert voices["b"].server == "http://x" and voices["a"].server is None
    path.write_text("voices:\n  a: {engine: kokoro, model: m, max_in_flight: 3, upstream_voice: x}\n")
    with pytest.raises(RegistryError, match="voices.a: Value error, upstream_voice, max_in_flight: only for engine: "
                                            "upstream$"):
        read_registry(path)
