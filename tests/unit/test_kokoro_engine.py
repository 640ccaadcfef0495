"""The Kokoro engine on a tiny random Kokoro (bench/random_kokoro.py), read through the registry as a real one is:
its voices from the packs' names, a batch the same as each item alone, mixes of packs, word timings from the
predicted durations, and the languages it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.random_kokoro import save_random_kokoro
from tests.pocket_models import registry_spec
from tts_core.engines.base import EngineUnavailable, VoiceSpec, mix_name, voice_mix
from tts_core.engines.contract import EngineInput
from tts_core.engines.kokoro import FRAME_SAMPLES, SAMPLE_RATE, describe_kokoro


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    model = save_random_kokoro(tmp_path_factory.mktemp("kokoro") / "tiny-kokoro", tiny=True)
    packs = {name: torch.load(model / "voices" / f"{name}.pt", weights_only=True) for name in ("af_heart", "am_adam")}
    torch.save((2 * packs["af_heart"] + packs["am_adam"]) / 3, model / "voices" / "af_mix.pt")  # (a mix's pack)
    torch.save(packs["af_heart"], model / "voices" / "jf_alpha.pt")  # a Japanese voice's name
    torch.save(packs["am_adam"], model / "voices" / "narrator.pt")  # a name that says no language
    return model


@pytest.fixture(scope="module")
def spec(folder, tmp_path_factory):
    voices = {"*": {}, "weighted": {"prompt": "voices/af_mix.pt"}, "narrator": {"language": "en-GB"}}
    return registry_spec(folder, voices, tmp_path_factory.mktemp("registry"), engine="kokoro")


@pytest.fixture(scope="module")
def engine(spec):
    return spec.load()


def said(engine, text: str, voice: str, speed: float = 1.0) -> EngineInput:
    [tokens] = engine.tokenize(text, voice)
    return EngineInput(tokens, voice, speed)


def test_mixes_are_read_as_kokoro_fastapi_writes_them():
    assert voice_mix("af_bella") is None
    assert voice_mix("af_bella+af_sky") == [("af_bella", 1.0), ("af_sky", 1.0)]
    assert voice_mix(" af_bella(2) + af_sky(0.5)") == [("af_bella", 2.0), ("af_sky", 0.5)]
    assert mix_name(voice_mix("af_bella (2.0)+af_sky(1)")) == "af_bella(2)+af_sky"
    for weights in ["0.001", "1000", "0.0016", "123.4567", "999.9994"]:  # written back as they are read
        parts = voice_mix(f"af_bella({weights})+af_sky")
        assert voice_mix(mix_name(parts)) == parts
    for bad, part in [("af_bella+", "''"), ("af_bella(0)+af_sky", "'af_bella(0)'"), ("a b+c", "'a b'"),
                      ("af_bella(-1)+af_sky", "'af_bella(-1)'"), ("af_bella(x)", "'af_bella(x)'"),
                      ("af_bella(1001)", "'af_bella(1001)'"), ("af_bella(0.0004)", "'af_bella(0.0004)'")]:
        with pytest.raises(ValueError, match=f"^{part.replace('(', '[(]').replace(')', '[)]')} is not a voice"):
            voice_mix(bad)


def test_the_packs_are_its_voices_with_their_language_and_gender(spec, engine):
    voices = {voice.name: voice for voice in spec.voices}
    # a star leaves out jf_alpha (Japanese) and narrator (no language in its name), which the registry names itself
    assert set(voices) == {"af_heart", "af_bella", "am_adam", "bf_emma", "ff_siwis", "af_mix", "weighted", "narrator"}
    assert (voices["narrator"].language, voices["narrator"].gender) == ("en-GB", None)
    assert (voices["af_heart"].language, voices["af_heart"].gender) == ("en-US", "female")
    assert (voices["am_adam"].language, voices["am_adam"].gender) == ("en-US", "male")
    assert (voices["bf_emma"].language, voices["ff_siwis"].language) == ("en-GB", "fr-FR")
    assert voices["weighted"].language == "en-US" and voices["weighted"].gender == "female"  # its pack's name
    assert all(voice.model == "kokoro" and voice.sample_rate == SAMPLE_RATE for voice in voices.values())
    assert spec.capabilities.mixes_voices and spec.capabilities.times_words
    assert engine.voices() == spec.voices


def test_a_voice_in_a_language_it_cannot_read_offline_is_refused_by_name(folder):
    with pytest.raises(EngineUnavailable, match="'jf_alpha' speaks Japanese, which Chorus cannot phonemize offline"):
        describe_kokoro(str(folder), [VoiceSpec("jf_alpha")])
    with pytest.raises(EngineUnavailable, match="Chorus reads 'ja' for Kokoro with no phonemizer"):
        describe_kokoro(str(folder), [VoiceSpec("af_heart", language="ja")])


def test_a_missing_model_or_pack_is_named(folder, tmp_path):
    with pytest.raises(EngineUnavailable, match=f"model '{tmp_path / 'nowhere'}' could not be loaded"):
        describe_kokoro(str(tmp_path / "nowhere"), [VoiceSpec("af_heart")])
    with pytest.raises(EngineUnavailable, match="voice 'af_nobody': no voice pack"):
        describe_kokoro(str(folder), [VoiceSpec("af_nobody")])


@pytest.mark.slow  # the tiny model generating, over and over: tens of seconds on two cores
def test_each_item_of_a_batch_is_made_as_it_is_alone(engine):
    items = [said(engine, "Hello there.", "af_heart"),
             said(engine, "A longer sentence, with a pause in it, for the padding.", "am_adam"),
             said(engine, "Bonjour le monde.", "ff_siwis"),
             said(engine, "Mixed voices say this.", "af_heart(2)+am_adam"),
             said(engine, "Faster.", "bf_emma", speed=1.5)]
    together = engine.synthesize(items)
    for item, batched in zip(items, together, strict=True):
        [alone] = engine.synthesize([item])
        assert alone.audio.shape == batched.audio.shape
        assert np.abs(alone.audio - batched.audio).max() < 1e-4
        assert np.array_equal(alone.token_samples, batched.token_samples)


def test_the_durations_time_every_token_and_speed_shortens_them(engine):
    [made] = engine.synthesize([said(engine, "Time these words, please.", "af_heart")])
    assert made.token_samples.size == said(engine, "Time these words, please.", "af_heart").length
    assert made.token_samples.sum() == made.audio.size and (made.token_samples % FRAME_SAMPLES == 0).all()
    assert np.all(made.token_samples >= FRAME_SAMPLES) and np.abs(made.audio).max() == pytest.approx(1.0)
    [faster] = engine.synthesize([said(engine, "Time these words, please.", "af_heart", speed=2.0)])
    assert faster.audio.size < 0.7 * made.audio.size


@pytest.mark.slow  # the tiny model generating, over and over: tens of seconds on two cores
def test_a_mix_is_the_weighted_mean_of_its_packs(engine):
    text = "A mix of two voices."
    [mixed, heart, adam, weighted] = [engine.synthesize([said(engine, text, voice)])[0].audio for voice in (
        "af_heart(2)+am_adam(1)", "af_heart", "am_adam", "weighted")]
    assert mixed.shape == weighted.shape and np.abs(mixed - weighted).max() < 1e-4
    for part in (heart, adam):
        assert part.shape != mixed.shape or np.abs(part - mixed).max() > 1e-2


def test_the_same_text_in_the_same_voice_sounds_the_same(engine):
    first, second = (engine.synthesize([said(engine, "Say it again.", "am_adam")])[0].audio for _ in range(2))
    assert np.array_equal(first, second)


def test_long_texts_are_cut_into_pieces_the_model_can_read(engine):
    text = " ".join(["This sentence is here to make a very long text."] * 20)
    pieces = engine.tokenize(text, "af_heart")
    assert len(pieces) > 1 and all(piece.size <= 512 for piece in pieces)
    timed = engine.tokenize_words(text, "af_heart")
    assert [tokens.tolist() for tokens, _ in timed] == [piece.tolist() for piece in pieces]
    said_words = [int(word) for _, owners in timed for word in owners if word >= 0]
    assert said_words == sorted(said_words) and set(said_words) == set(range(len(text.split())))


def test_with_two_copies_a_batch_is_made_as_each_item_alone_and_the_memory_is_counted_twice(engine):
    items = [said(engine, "Hello there.", "af_heart"), said(engine, "A second copy makes this one.", "am_adam"),
             said(engine, "And this.", "bf_emma")]
    alone = [engine.synthesize([item])[0] for item in items]
    one_copy_bytes = engine.memory_bytes()
    assert engine.instance_counts()[:2] == (1, 2)  # (on this CPU: at least two threads)
    engine.use_instances(2)
    try:
        assert engine.instances == 2 and engine.memory_bytes() == 2 * one_copy_bytes
        for made, expected in zip(engine.synthesize(items), alone, strict=True):
            assert made.audio.shape == expected.audio.shape
            assert np.abs(made.audio - expected.audio).max() < 1e-4
    finally:
        engine.use_instances(1)
    assert engine.instances == 1 and engine.memory_bytes() == one_copy_bytes
