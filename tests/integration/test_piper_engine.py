"""The real bundled voice through the engine alone: batched output equals solo output, word timing, and its
lower precision (int8)."""

import json

import numpy as np
import onnx
import pytest

from bench.recognition import SENTENCES, Recogniser
from tests.unit.test_word_timing import check_word_ids
from tts_core.engines import piper
from tts_core.engines.base import word_spans
from tts_core.engines.contract import EngineInput
from tts_core.engines.piper import PiperEngine, bundled_voice_path, load_piper_engines
from tts_core.text.pronunciation import Pronounced

TEXTS = ["Hi.", "This sentence is quite a bit longer than the first one.", "A middle one, here."]


@pytest.fixture(scope="module")
def engine():
    return PiperEngine(bundled_voice_path(), noise_scale=0.0, noise_w=0.0)


def items(engine, texts, speed=1.0):
    return [EngineInput(engine.tokenize(text, engine.name)[0], engine.name, speed) for text in texts]


def test_batched_items_equal_solo_items_and_have_no_padded_tail(engine):
    batch = items(engine, TEXTS)
    together = [output.audio for output in engine.synthesize(batch)]
    for item, audio in zip(batch, together):
        alone = engine.synthesize([item])[0].audio
        assert audio.shape == alone.shape  # trimmed to its own length: no padded tail
        assert np.max(np.abs(audio - alone)) < 2e-3
    assert together[0].size < together[2].size < together[1].size
    # The short item's end is as quiet as it is alone, not decoder noise from padding.
    tail = int(0.02 * engine.sample_rate)
    assert np.sqrt(np.mean(together[0][-tail:] ** 2)) < 0.05


def test_output_is_peak_normalised_float32(engine):
    audio = engine.synthesize(items(engine, ["Normalised audio."]))[0].audio
    assert audio.dtype == np.float32 and np.max(np.abs(audio)) == pytest.approx(1.0)


def test_int8_speaks_as_long_and_as_clearly_as_full_precision_and_switches_back(engine):
    batch = items(engine, SENTENCES[:4])
    full = engine.synthesize(batch)
    assert engine.set_low_precision(True)
    try:
        low = engine.synthesize(batch)
    finally:
        assert engine.set_low_precision(False)
    again = engine.synthesize(batch)
    recogniser = Recogniser()
    errors = {name: np.mean([recogniser.error_rate(text, output.audio, engine.sample_rate)
                             for text, output in zip(SENTENCES, outputs)]) for name, outputs in
              (("full", full), ("int8", low))}
    assert errors["int8"] < 0.35 and errors["int8"] <= errors["full"] + 0.1, errors
    for item, full_output, low_output, again_output in zip(batch, full, low, again):
        assert low_output.token_samples.shape == item.tokens.shape
        assert low_output.token_samples.sum() == low_output.audio.size  # trimmed to its own length
        assert abs(low_output.audio.size / full_output.audio.size - 1) < 0.05
        shared = min(low_output.audio.size, full_output.audio.size)
        assert np.max(np.abs(low_output.audio[:shared] - full_output.audio[:shared])) > 1e-3  # another graph ran
        assert np.array_equal(again_output.audio, full_output.audio)  # back to full precision


def test_the_int8_graph_quantizes_the_decoders_convolutions_and_is_made_once_per_machine(tmp_path, monkeypatch):
    """Static quantization: the decoder's 20 convolutions run as QLinearConv, calibrated on the voice's own speech;
    the graph is kept in the cache folder, and the next load reads it instead of calibrating again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    made = []
    real = piper._int8
    monkeypatch.setattr(piper, "_int8", lambda *args: made.append(1) or real(*args))
    first = PiperEngine(bundled_voice_path())
    [kept] = (tmp_path / "chorus" / "piper-int8").glob("*.onnx")
    graph = onnx.load(str(kept))
    quantized = [node.name for node in graph.graph.node if node.op_type == "QLinearConv"]
    assert len(quantized) == 20 and all(name.startswith("/dec/") for name in quantized), quantized
    assert sum(node.op_type == "Conv" for node in graph.graph.node) > 0  # the rest stay float
    second = PiperEngine(bundled_voice_path())
    assert made == [1]  # the second load read the kept graph
    second.set_low_precision(True)
    [item] = items(second, ["Made once, read after."])
    assert second.synthesize([item])[0].audio.size > 0.5 * second.sample_rate
    del first


def test_memory_counts_both_precisions(engine):
    assert engine.memory_bytes() > 1.2 * bundled_voice_path().stat().st_size


def test_with_two_copies_a_batch_is_made_as_each_item_alone_at_either_precision_and_memory_counts_them(engine):
    batch = items(engine, TEXTS)
    alone = [engine.synthesize([item])[0].audio for item in batch]
    one_copy_bytes = engine.memory_bytes()
    assert engine.instance_counts()[:2] == (1, 2)  # (on this CPU: at least two cores)
    engine.use_instances(2)
    try:
        assert engine.instances == 2 and engine.memory_bytes() == 3 * one_copy_bytes  # and the whole one: a lone item
        assert np.max(np.abs(engine.synthesize(batch[:1])[0].audio - alone[0])) < 2e-3
        for made, expected in zip(engine.synthesize(batch), alone, strict=True):
            assert made.audio.shape == expected.shape and np.max(np.abs(made.audio - expected)) < 2e-3
        engine.set_low_precision(True)
        low = engine.synthesize(batch)
        assert all(abs(made.audio.size / expected.size - 1) < 0.05 for made, expected in zip(low, alone, strict=True))
    finally:
        engine.set_low_precision(False)
        engine.use_instances(1)
    assert engine.instances == 1 and engine.memory_bytes() == one_copy_bytes
    with pytest.raises(ValueError, match="copies"):
        engine.use_instances(3)


def test_speed_is_part_of_the_batch_key(engine):
    assert engine.batch_key(engine.name, 1.0) != engine.batch_key(engine.name, 1.5)
    with pytest.raises(ValueError):
        engine.synthesize(items(engine, TEXTS[:1]) + items(engine, TEXTS[1:2], speed=1.5))


def test_voices_folder_adds_voices_and_skips_broken_ones(tmp_path, caplog):
    source = bundled_voice_path()
    (tmp_path / "en_US-copy-medium.onnx").symlink_to(source)
    (tmp_path / "en_US-copy-medium.onnx.json").write_bytes(source.with_name(source.name + ".json").read_bytes())
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    (tmp_path / "broken.onnx.json").write_text("{}")
    (tmp_path / "lonely.onnx").write_bytes(b"no json beside me")
    names = [engine.name for engine in load_piper_engines(tmp_path)]
    assert names == ["en_US-joe-medium", "en_US-copy-medium"]
    assert "broken" in caplog.text


# Texts as the front end leaves them (numbers are words), with the three of 32 measured whose
# espeak words are not the text's words: a merge ("Wait... what?"), a split ("iPhone"), a dash.
WORDED = ["Hello, world!", "It costs twenty-five dollars.", "The state-of-the-art model works.",
          "Mister Smith went to Washington. I don't know what you mean!", 'She said, "Let\'s go home."',
          "Wait... what?", "iPhone and iPad users rejoice.", "This is a test - a simple one.",
          "Say " + Pronounced("Worcester", "ˈwʊs tər").marked() + " twice, " + Pronounced("Leicester").marked() + "."]


@pytest.mark.parametrize("text", WORDED)
def test_every_word_gets_tokens_in_order(engine, text):
    assert engine.capabilities.times_words
    check_word_ids(engine, engine.name, text)


def test_token_samples_sum_to_each_padded_items_audio(engine):
    batch = items(engine, TEXTS)
    for item, output in zip(batch, engine.synthesize(batch)):
        assert output.token_samples.shape == item.tokens.shape and output.token_samples.sum() == output.audio.size
        assert (output.token_samples[[0, -1]] > 0).all()  # the last token is real, not padding


def spans(engine, text):
    (ids, owners), = engine.tokenize_words(text, engine.name)
    [output] = engine.synthesize([EngineInput(ids, engine.name)])
    return output.audio, {word: span for word, span in
                          zip(text.split(), word_spans(owners, output.token_samples).values())}


def test_word_spans_hold_the_words_speech_in_order(engine):
    audio, found = spans(engine, "One, two, three.")
    start = found["One,"][0]
    assert list(found) == ["One,", "two,", "three."] and start > 0
    edges = [edge for span in found.values() for edge in span]
    assert edges == sorted(edges) and edges[-1] <= audio.size
    quiet = np.sqrt(np.mean(audio[:start] ** 2))  # before the first word: the sentence start's silence
    for start, end in found.values():
        assert np.sqrt(np.mean(audio[start:end] ** 2)) > max(0.05, 5 * quiet)
    for end, start in zip(edges[1:-1:2], edges[2::2]):  # the commas' pauses between the words
        assert start - end > 0.05 * engine.sample_rate and np.sqrt(np.mean(audio[end:start] ** 2)) < 0.05


def test_longer_words_get_longer_spans(engine):
    examples = [("A wonderful day.", "A", "wonderful"), ("The extraordinary cat.", "cat.", "extraordinary")]
    for text, short, long in examples:
        found = spans(engine, text)[1]
        assert np.diff(found[long]) > 1.5 * np.diff(found[short])


def test_a_voice_that_reads_characters_times_words_too(tmp_path):
    source = bundled_voice_path()
    (tmp_path / "chars.onnx").symlink_to(source)
    config = json.loads(source.with_name(source.name + ".json").read_text())
    (tmp_path / "chars.onnx.json").write_text(json.dumps({**config, "phoneme_type": "text"}))
    characters = PiperEngine(tmp_path / "chars.onnx")
    assert characters.capabilities.times_words
    for text in ["hello, world! again", "a - b", "Say " + Pronounced("Worcester", None, "wuss ter").marked()]:
        check_word_ids(characters, characters.name, text)
