import time

import pytest

from tts_core.text.chunks import TextError, complete_sentences, ramp_up, split_chunks
from tts_core.text.frontend import NormalizationOptions, normalize_text


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


HOSTILE = {  # each text of about n characters
    "dots": lambda n: "." * n, "digits": lambda n: "9" * n, "brackets": lambda n: "(" * (n // 2) + ")" * (n // 2),
    "commas": lambda n: ", " * (n // 2), "abbreviations": lambda n: "a." * (n // 2),
    "words": lambda n: "word " * (n // 5), "newlines": lambda n: "\n" * n + "x",
}


def read_cost(text: str, tries: int) -> float:
    """CPU seconds this process spent reading text (the least of some tries): CPU time, not the wall clock,
    so that other processes on a busy machine do not count."""
    costs = []
    for _ in range(tries):
        started = time.process_time()
        try:
            split_chunks(normalize(text), 400)
        except TextError:
            pass
        costs.append(time.process_time() - started)
    return min(costs)


@pytest.mark.parametrize("make", HOSTILE.values(), ids=HOSTILE.keys())
def test_adversarial_input_is_linear_time(make):
    """Four times the text costs about four times as much (a quadratic front end: sixteen), measured side by side."""
    small, large = read_cost(make(25_000), tries=3), read_cost(make(100_000), tries=2)
    print(f"{small * 1000:.1f} ms, four times the text {large * 1000:.1f} ms")
    assert large <= 8 * max(small, 0.002), (small, large)


def test_ramp_up_starts_short_and_doubles_cutting_only_where_the_text_pauses():
    text = " ".join(["Alpha beta gamma delta, epsilon zeta eta theta iota kappa lambda mu nu xi omicron."] * 6)
    ramped = ramp_up(split_chunks(text, 120), 24, 120)
    chunks = [chunk for chunk, _ in ramped]
    assert " ".join(chunks).split() == text.split()
    assert all(len(chunk) <= 120 for chunk in chunks)
    assert chunks[0] == "Alpha beta gamma delta,"  # cut at the clause
    # the clause after it is longer than the next limit (48), and is one piece: a cut between words would make
    # the voice end an utterance there, slower than it says the words inside one
    assert chunks[1] == "epsilon zeta eta theta iota kappa lambda mu nu xi omicron."
    assert ramp_up(["No clause in this sentence at all, or one."], 10, 120) == [
        ("No clause in this sentence at all,", False), ("or one.", True)]
    assert ramp_up(["Words and no pause in this long sentence."], 10, 120) == [
        ("Words and no pause in this long sentence.", False)]
    # a piece cut from its sentence continues it (no pause); the next sentence does not
    assert [continues for _, continues in ramped[:2]] == [False, True]
    assert sum(not continues for _, continues in ramped) == 6  # each sentence starts a piece of its own
    assert ramp_up(["Short."], 24, 120) == [("Short.", False)]


SHORT_SENTENCES = " ".join(["Yes.", "No.", "Maybe.", "Sure!", "Why?"] * 120)  # 600 sentences, 2,999 characters


def test_many_short_sentences_are_packed_into_few_pieces_losing_no_word():
    chunks = split_chunks(SHORT_SENTENCES, 400, most=32)
    assert len(chunks) <= 32 and all(len(chunk) <= 400 for chunk in chunks)
    assert " ".join(chunks).split() == SHORT_SENTENCES.split()
    assert all(chunk.endswith((".", "!", "?")) for chunk in chunks)  # packed whole sentences


def test_texts_with_few_sentences_are_not_packed():
    assert split_chunks("One. Two! Three? Four", 100, most=32) == ["One.", "Two!", "Three?", "Four"]


def test_packed_lines_keep_a_pause_between_them():
    lines = "\n".join(f"Item {number}" for number in range(100))
    chunks = split_chunks(lines, 400, most=10)
    assert len(chunks) <= 10 and chunks[0].startswith("Item 0, Item 1, Item 2")


def test_as_few_pieces_as_the_size_allows_when_the_budget_cannot_be_met():
    chunks = split_chunks(SHORT_SENTENCES, 400, most=2)
    assert all(len(chunk) <= 400 for chunk in chunks) and len(chunks) <= 2 * len(SHORT_SENTENCES) // 400 + 1


def test_a_stream_cuts_its_first_packed_piece_at_a_sentence():
    chunks = [chunk for chunk, _ in ramp_up(split_chunks(SHORT_SENTENCES, 400, most=32), 24, 400)]
    assert chunks[0] == "Yes. No. Maybe. Sure!"
    assert " ".join(chunks).split() == SHORT_SENTENCES.split()


@pytest.mark.parametrize(("text", "cut"), [
    ("One. Two", ("One.", " Two")),
    ("One. Two! Three", ("One. Two!", " Three")),
    ("It costs 3.", ("", "It costs 3.")),  # may yet be 3.14: complete once white space follows
    ("A line\nand more", ("A line\n", "and more")),
    ("", ("", "")),
])
def test_complete_sentences_cut_text_arriving_in_pieces(text, cut):
    assert complete_sentences(text) == cut
