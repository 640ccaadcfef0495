"""The text front end heard: sentences with numbers, dates, times and prices, spoken by the real
bundled voice and recognised offline (pocketsphinx), come back with their numbers as words."""

import pytest

from bench.recognition import Recogniser
from tests.audio_check import to_16k_int16

# what is written, and number words the recogniser must hear in it
SENTENCES = [
    ("It costs $25 today.", {"twenty", "five", "dollars"}),
    ("We moved there in 1999.", {"nineteen", "ninety", "nine"}),
    ("The train leaves at 7:45 pm.", {"seven", "forty", "five"}),
    ("The meeting is on 2026-11-30.", {"november", "twenty", "six"}),
]


@pytest.fixture(scope="module")
def heard(speak):
    """The words the recogniser hears in the server's speech of a text (here: "twenty five dollars")."""
    recogniser = Recogniser()

    def heard(text: str, **extra) -> set[str]:
        response = speak(text, "wav", **extra)
        assert response.status_code == 200, response.text
        return set(recogniser.hear(to_16k_int16(response.content)).lower().split())
    return heard


def test_numbers_dates_times_and_prices_are_heard_as_words(heard):
    missed = {text: expected - heard(text) for text, expected in SENTENCES}
    assert sum(len(words) for words in missed.values()) <= 2, missed


def test_without_the_front_end_a_date_is_not_heard_as_one(heard):
    text, expected = SENTENCES[-1]
    assert "november" in heard(text)
    assert "november" not in heard(text, normalize=False)  # the voice alone reads 2026-11-30 as numbers
