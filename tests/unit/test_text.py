import time

import pytest

from tts_core.frontend import NormalizationOptions, normalize_text
from tts_core.text import TextError, complete_sentences, ramp_up, split_chunks


def normalize(text: str) -> str:
    """The text as written: what the front end leaves of it with normalize false."""
    return normalize_text(text, "en", NormalizationOptions(normalize=False)).text


def test_normalize_collapses_space_and_keeps_lines():
    assert normalize("  Hello \t  world.\n\n  Next   line ") == "Hello world.\nNext line"


@pytest.mark.parametrize("text", ["", "   ", "\n\t\n"])
def test_empty_text_is_refused(text):
    with pytest.raises(TextError, match="empty"):
        normalize(text)


@pytest.mark.parametrize("char", ["\x00", "\x07", "\x1b", "\x7f", "\x85", "\ud800"])
def test_control_characters_are_refused(char):
    with pytest.raises(TextError, match="control character"):
        normalize(f"Hello{char} world")


def test_nfkc():
    assert normalize("ﬁne Ｈｅｌｌｏ") == "fine Hello"


def test_sentences_become_chunks():
    assert split_chunks("One. Two! Three? Four", 100) == ["One.", "Two!", "Three?", "Four"]


def test_decimal_points_do_not_split():
    assert split_chunks("It costs 3.50 today. Yes.", 100) == ["It costs 3.50 today.", "Yes."]


def test_long_sentences_split_at_clauses_then_words_never_mid_word():
    sentence = ", ".join(["word " * 6] * 10).strip() + "."
    chunks = split_chunks(sentence, 60)
    assert all(len(chunk) <= 60 for chunk in chunks)
    assert " ".join(chunks).split() == sentence.split()


def test_a_word_longer_than_the_limit_is_cut():
    assert split_chunks("a" * 25, 10) == ["a" * 10, "a" * 10, "a" * 5]


@pytest.mark.parametrize("text", [
    "." * 100_000, "9" * 100_000, "(" * 50_000 + ")" * 50_000, ", " * 50_000,
    "a." * 50_000, "word " * 20_000, "\n" * 100_000 + "x",
])
def test_adversarial_input_is_linear_time(text):
    started = time.perf_counter()
    try:
        split_chunks(normalize(text), 400)
    except TextError:
        pass
    assert time.perf_counter() - started < 2.0


def test_ramp_up_starts_short_and_doubles_without_losing_or_cutting_words():
    text = " ".join(["Alpha beta gamma delta, epsilon zeta eta theta iota kappa lambda mu nu xi omicron."] * 6)
    chunks = ramp_up(split_chunks(text, 120), 24, 120)
    assert " ".join(chunks).split() == text.split()
    assert len(chunks[0]) <= 24 and len(chunks[1]) <= 48 and len(chunks[2]) <= 96
    assert all(len(chunk) <= 120 for chunk in chunks)
    assert chunks[0] == "Alpha beta gamma delta,"  # cut at the clause, not mid-word
    assert ramp_up(["Short."], 24, 120) == ["Short."]


@pytest.mark.parametrize(("text", "cut"), [
    ("One. Two", ("One.", " Two")),
    ("One. Two! Three", ("One. Two!", " Three")),
    ("It costs 3.", ("", "It costs 3.")),  # may yet be 3.14: complete once white space follows
    ("A line\nand more", ("A line\n", "and more")),
    ("", ("", "")),
])
def test_complete_sentences_cut_text_arriving_in_pieces(text, cut):
    assert complete_sentences(text) == cut
