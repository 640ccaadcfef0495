"""Word timing on the engine side: which word each token speaks (tokenize_words, through
tts_core.engines.alignment), how much audio each token spans (token_samples) and the word spans
read from both. The VITS engine is the tiny random model of test_vits_engine; the real Piper voice
is checked in tests/integration/test_piper_engine.py."""

import numpy as np
import pytest
import torch

from tests.unit import test_vits_engine as vits_tests
from tts_core.engines.alignment import share_out, unit_words
from tts_core.engines.base import word_spans
from tts_core.text.chunks import words
from tts_core.text.pronunciation import Pronounced

engine, model_dir = vits_tests.engine, vits_tests.model_dir  # the tiny model's fixtures


def check_word_ids(engine, voice: str, text: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """tokenize's ids, each token with a word, the words in order, every word with a token."""
    tokenized = engine.tokenize_words(text, voice)
    assert [ids.tolist() for ids, _ in tokenized] == [ids.tolist() for ids in engine.tokenize(text, voice)]
    assert all(owners.dtype == np.int64 and owners.shape == ids.shape for ids, owners in tokenized)
    said = np.concatenate([owners for _, owners in tokenized])
    said = said[said >= 0]
    assert (np.diff(said) >= 0).all()
    assert set(said.tolist()) == set(range(len(words(text))))
    return tokenized


def labels(text: str, text_words: str, alone=lambda word: list(word.lower())) -> list[int]:
    return unit_words(list(text), text_words.split(), alone).tolist()


def test_groups_between_spaces_are_the_words_and_punctuation_outside_a_word_is_none():
    assert labels("hi, don't go.", "Hi, don't go.") == [0, 0, -1, -1, 1, 1, 1, 1, 1, -1, 2, 2, -1]


def test_a_word_said_in_two_groups_maps_both_by_how_it_is_said_alone():
    alone = {"iPhone": list("i phone"), "now": list("now")}.get
    assert labels("i phone now", "iPhone now", alone) == [0, 0, 0, 0, 0, 0, 0, -1, 1, 1, 1]


def test_a_word_said_as_nothing_takes_the_pause_where_it_was():
    assert labels("a b c", "a - b c") == [0, 1, 2, -1, 3]
    assert labels("a bb", "a bb -") == [0, -1, 1, 2]  # no pause left to take: units shared out


def test_merged_words_share_their_units_by_how_many_each_makes_alone():
    assert labels("waitwhat?", "Wait... what?") == [0, 0, 0, 0, 1, 1, 1, 1, -1]


def test_share_out_is_in_order_proportional_and_leaves_no_word_out():
    assert share_out([1, 3], 8).tolist() == [0, 0, 1, 1, 1, 1, 1, 1]
    assert share_out([0, 10, 0], 5).tolist() == [0, 1, 1, 1, 2]
    assert share_out([0, 0], 3).tolist() == [0, 0, 1]
    assert (np.diff(share_out([5, 1, 1, 1], 2)) >= 0).all()  # fewer units than words: still in order


def test_word_spans_run_from_a_words_first_token_to_its_last():
    spans = word_spans(np.array([-1, 0, 0, -1, 1, 2, 2, -1]), np.array([5, 1, 2, 3, 4, 5, 6, 7]))
    assert spans == {0: (5, 8), 1: (11, 15), 2: (15, 26)}


@pytest.mark.parametrize("text", [
    "hello there.", "It costs twenty-five dollars, don't it? Yes - it does!",
    "say " + Pronounced("Worcester", None, "wuss ter").marked() + " twice.",
    "say " + Pronounced("Worcester").marked() + ", and ÷ then", "a",
])
def test_vits_word_ids(engine, text):
    check_word_ids(engine, "tiny", text)


def test_a_respelling_of_several_words_is_its_spans_one_word(engine):
    (ids, owners), = check_word_ids(engine, "tiny", "say " + Pronounced("Worcester", None, "wuss ter").marked())
    assert owners.tolist().count(1) == len("wuss ter") * 2  # its characters, the space between, their blanks


@pytest.mark.parametrize("speed", [1.0, 1.5])
def test_vits_token_samples_sum_to_each_padded_items_audio(engine, speed):
    batch = vits_tests.items(engine, vits_tests.TEXTS, speed=speed)
    lengths: list[torch.Tensor] = []
    hook = engine.model.register_forward_hook(lambda _module, _args, output: lengths.append(output.sequence_lengths))
    try:
        outputs = engine.synthesize(batch)
    finally:
        hook.remove()
    for item, output, model_length in zip(batch, outputs, lengths[0].tolist()):
        spans = output.token_samples
        assert spans.shape == item.tokens.shape and (spans >= 0).all()
        assert spans.sum() == output.audio.size == model_length
        assert (spans % engine.hop_length == 0).all()
