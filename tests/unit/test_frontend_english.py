"""The English text front end: what is said for what was written, the map back to the input, the
options, other languages, and linear time on hostile input."""

import gc
import random
import time

import pytest

from tts_core.text.chunks import TextError
from tts_core.text.frontend import LANGUAGES, NormalizationOptions, UnspeakableScript, normalize_text
from tts_core.text.frontend.english import say_as
from tts_core.text.frontend.pieces import BREAK, PRONUNCIATION, SAID, TEXT
from tts_core.text.pronunciation import Pronounced, as_text


def said(text: str, language: str = "en_US", **options) -> str:
    return normalize_text(text, language, NormalizationOptions(**options)).text


def table(*rows):
    return pytest.mark.parametrize("written, spoken", rows)


@table(("I have 12 apples.", "I have twelve apples."), ("0", "zero"), ("1,234,567", "one million two hundred and "
       "thirty-four thousand five hundred and sixty-seven"), ("007", "zero zero seven"),
       ("the 1st, 2nd, 3rd and 21st", "the first, second, third and twenty-first"), ("3.14", "three point one four"),
       ("0.05", "zero point zero five"), ("-5 degrees", "minus five degrees"), ("(-12)", "(minus twelve)"),
       ("pages 5-10", "pages five to ten"), ("1990–2000", "nineteen ninety to two thousand"),
       ("1990 – 2000", "nineteen ninety to two thousand"), ("in 1999", "in nineteen ninety-nine"),
       ("in 2005", "in two thousand and five"), ("the 1990s", "the nineteen nineties"),
       ("the '80s", "the 'eighties"), ("50%", "fifty percent"),
       ("-3.5%", "minus three point five percent"), ("5-10%", "five to ten percent"), ("H2O", "H two O"),
       ("3x faster", "three times faster"), ("COVID-19", "COVID-nineteen"),
       ("1234567890123456789", "one two three four five six seven eight nine zero "
       "one two three four five six seven eight nine"))
def test_numbers(written, spoken):
    assert said(written) == spoken


@table(("1/2 cup", "one half cup"), ("3/4 of it", "three quarters of it"), ("2/3", "two thirds"),
       ("5/8 inch", "five eighths inch"), ("2 1/2 hours", "two and one half hours"), ("1/12", "one twelfth"),
       ("24/7", "twenty-four slash seven"), ("9/10", "nine slash ten"), ("3/2", "three slash two"),
       ("Version 3.10.2", "Version three point ten point two"), ("v1.2.3", "v one point two point three"),
       ("192.168.0.1", "one hundred and ninety-two dot one hundred and sixty-eight dot zero dot one"),
       ("555.123.4567", "five five five, one two three, four five six seven"),
       ("on 30.11.2026", "on November thirtieth, twenty twenty-six"), ("1,234.5", "one thousand two hundred and "
       "thirty-four point five"), ("It ends in 3.14.", "It ends in three point one four."))
def test_fractions_and_dotted_numbers(written, spoken):
    assert said(written) == spoken


@table(("$5", "five dollars"), ("$1", "one dollar"), ("$3.50", "three dollars and fifty cents"),
       ("$0.99", "ninety-nine cents"), ("$1.01", "one dollar and one cent"), ("$1,000", "one thousand dollars"),
       ("€20", "twenty euros"), ("£1.5 million", "one point five million pounds"), ("$2bn", "two billion dollars"),
       ("$5k", "five thousand dollars"), ("¥500", "five hundred yen"), ("-$5", "minus five dollars"),
       ("$5-10", "five to ten dollars"), ("It costs $5.", "It costs five dollars."))
def test_currency(written, spoken):
    assert said(written) == spoken


@table(("2026-11-30", "November thirtieth, twenty twenty-six"),
       ("Nov 30, 2026", "November thirtieth, twenty twenty-six"), ("Nov. 30", "November thirtieth"),
       ("March 3rd", "March third"), ("30 November 2026", "the thirtieth of November, twenty twenty-six"),
       ("1st of May", "the first of May"), ("11/30/2026", "November thirtieth, twenty twenty-six"),
       ("30/11/2026", "November thirtieth, twenty twenty-six"), ("2026-2030", "twenty twenty-six to twenty thirty"))
def test_dates(written, spoken):
    assert said(written) == spoken


@table(("3:30 pm", "three thirty p m"), ("14:05", "fourteen oh five"), ("10:00", "ten o'clock"),
       ("18:00", "eighteen hundred"), ("7am", "seven a m"), ("at 7 p.m. Then", "at seven p m. Then"),
       ("10:30:15", "ten thirty and fifteen seconds"), ("12:00 PM", "twelve p m"))
def test_times(written, spoken):
    assert said(written) == spoken


@table(("5 km", "five kilometers"), ("10kg", "ten kilograms"), ("1 m", "one meter"), ("1.5 m", "one point five meters"),
       ("20°C", "twenty degrees Celsius"), ("90°", "ninety degrees"), ("100 MB", "one hundred megabytes"),
       ("60 km/h", "sixty kilometers per hour"), ("5 in a row", "five in a row"), ("2-3 hrs", "two to three hours"))
def test_units(written, spoken):
    assert said(written) == spoken


@table(("Dr. Smith and Mr. Jones", "Doctor Smith and Mister Jones"),
       ("fruit, e.g. apples", "fruit, for example apples"), ("I.e. this", "that is this"),
       ("apples, pears, etc. Then", "apples, pears, et cetera. Then"),
       ("cats vs. dogs", "cats versus dogs"), ("No. 5", "number five"), ("say no. Fine", "say no. Fine"))
def test_abbreviations(written, spoken):
    assert said(written) == spoken


@table(("Call (555) 123-4567.", "Call five five five, one two three, four five six seven."),
       ("555-123-4567", "five five five, one two three, four five six seven"),
       ("+1 555 123 4567", "plus one, five five five, one two three, four five six seven"),
       ("+44 20 7946 0958", "plus four four, two zero, seven nine four six, zero nine five eight"),
       ("1-800-555-1234", "one, eight zero zero, five five five, one two three four"),
       ("10 20 30 40 50", "ten twenty thirty forty fifty"))
def test_phone_numbers(written, spoken):
    assert said(written) == spoken


@table(("See https://example.com/docs/getting-started?x=1.", "See example dot com slash docs slash getting started."),
       ("www.python.org", "python dot org"), ("example.com", "example dot com"),
       ("http://localhost:8080/api", "localhost colon eight zero eight zero slash api"),
       ("Write to jane.doe@example.com", "Write to jane dot doe at example dot com"),
       ("first_last+tag@my-site.co.uk", "first underscore last plus tag at my dash site dot co dot uk"),
       ("Node.js and e.g. are not addresses", "Node.js and for example are not addresses"))
def test_addresses(written, spoken):
    assert said(written) == spoken


@table(("file(s)", "files"), ("Tom & Jerry", "Tom and Jerry"), ("AT&T", "AT and T"), ("C++", "C plus plus"),
       ("a = b", "a equals b"), ("@home", "at home"), ("#1 fan", "number one fan"),
       ("~5 minutes", "about five minutes"), ("and/or", "and slash or"),
       ("$9.99/month", "nine dollars and ninety-nine cents per month"), ("snake_case", "snake case"), ("a | b", "a b"))
def test_symbols(written, spoken):
    assert said(written) == spoken


@table(("Some **bold** and *em* and ~~gone~~ text.", "Some bold and em and gone text."),
       ("# Title\nBody text", "Title.\nBody text"), ("## Steps:\n", "Steps:"),
       ("Heading\n=======", "Heading."),
       ("- one\n- two\n* three", "one.\ntwo.\nthree."), ("1. first\n2. second", "first.\nsecond."),
       ("Before:\n```python\nprint(1)\n```\nAfter.", "Before:\nAfter."),
       ("Run `pip install` now", "Run pip install now"),
       ("| Name | Age |\n|---|---|\n| Alice | 30 |\n| Bob | |", "Name, Age.\nAlice, thirty.\nBob."),
       ("Read [the docs](https://example.com/docs \"Docs\") now.", "Read the docs now."),
       ("See <https://example.com>", "See example dot com"), ("![a cat](cat.png) sits", "a cat sits"),
       ("> quoted\n> text", "quoted\ntext"), ("a \\*star\\* &amp; more", "a star and more"),
       ("<p>Hello <b>there</b></p>", "Hello there"), ("a<br>b", "a b"), ("Great job 🎉🚀!", "Great job!"),
       ("👍🏽 thanks", "thanks"), ("The price is $**5**.", "The price is five dollars."),
       ("    indented is not code", "indented is not code"), ("Line one\nLine two", "Line one\nLine two"))
def test_markdown_html_and_emoji(written, spoken):
    assert said(written) == spoken


def test_a_pronunciation_override_is_kept_whole_as_a_marked_span():
    text = "Visit [Worcester](/ˈwʊstər/) today."
    spoken = normalize_text(text, "en_US")
    marked = Pronounced("Worcester", "ˈwʊstər").marked()
    assert spoken.text == f"Visit {marked} today." and as_text(spoken.text) == "Visit Worcester today."
    [override] = [piece for piece in spoken.pieces if piece.kind == PRONUNCIATION]
    assert (text[override.start:override.end], override.spoken, override.ipa) == (
        "[Worcester](/ˈwʊstər/)", marked, "ˈwʊstər")
    assert said("[docs](/docs/guide/)") == "docs"  # a path is a link, not an override


@pytest.mark.parametrize("options, written", [
    ("number_normalization", "I have 12 apples, 50% of 1999."), ("currency_normalization", "It costs $5."),
    ("date_normalization", "On 2026-11-30."), ("time_normalization", "At 14:05."), ("unit_normalization", "Run 5 km."),
    ("abbreviation_normalization", "Dr. Smith, e.g. here"), ("phone_normalization", "Call 555-123-4567."),
    ("url_normalization", "See example.com/docs now"), ("email_normalization", "Mail jane@example.com now"),
    ("optional_pluralization_normalization", "Send file(s)"), ("replace_remaining_symbols", "Tom & Jerry + me"),
    ("markdown_normalization replace_remaining_symbols", "# Some **bold** text"), ("emoji_normalization", "Great 🎉"),
])
def test_an_option_off_leaves_its_kind_as_written(options, written):
    """(Markdown's marks are symbols too: with markdown off they are still read as symbols, unless that is off.)"""
    assert said(written, **dict.fromkeys(options.split(), False)) == written
    assert said(written) != written


def test_normalize_false_speaks_the_text_as_written():
    written = "# Costs $5 on 2026-11-30 😀 at **3:30**  pm\r\n\r\n  Next   line "
    assert said(written, normalize=False) == "# Costs $5 on 2026-11-30 😀 at **3:30** pm\nNext line"


@pytest.mark.parametrize("language", ["en", "en_US", "en-GB", "EN_us"])
def test_english_is_found_by_its_language_code(language):
    assert said("It costs $5.", language) == "It costs five dollars."


def test_a_language_without_rules_gets_the_language_neutral_cleanup_only():
    assert "fr" not in LANGUAGES
    assert said("# Prix\n**5 €** le 30/11/2026 🎉", "fr_FR") == "Prix.\n5 € le 30/11/2026"


MAPPED = [
    "It costs $5 today, on 2026-11-30 at 3:30 pm.",
    "# Title\n\nSome **bold**, *em* and `code`; a [link](http://x.com \"t\") & [Worcester](/ˈwʊstər/) 😀!\n\n"
    "- item 1st\n- item 2\n\n| a | b |\n|---|---|\n| 5 km | $3.50 |\n\n```\ncode\n```\n<b>html</b> \\* &amp; end",
    "ﬁne Ｈｅｌｌｏ １２３ café\r\nnext\u2028line",
    "Dr. Who, e.g. Call (555) 123-4567 or mail a@b.io; see www.x.com/a.",
]


@pytest.mark.parametrize("text", MAPPED)
@pytest.mark.parametrize("normalize", [True, False])
def test_every_piece_maps_to_its_slice_of_the_input_in_order(text, normalize):
    spoken = normalize_text(text, "en_US", NormalizationOptions(normalize=normalize))
    assert spoken.text == "".join(piece.spoken for piece in spoken.pieces)
    previous = (0, 0)
    for piece in spoken.pieces:
        assert 0 <= piece.start <= piece.end <= len(text)
        assert piece.start >= previous[0] and piece.end >= previous[1], (piece, previous)
        previous = (piece.start, piece.end)
        assert (piece.start == piece.end) == (piece.kind == BREAK)
        if piece.kind == TEXT and text.isascii():  # as written: the same words (markup and white space aside)
            assert piece.spoken.split() == text[piece.start:piece.end].split(), piece


PARTS = list("aZ09 .,:;!?-–()[]<>*_`~#|\\/@&+=%$€°'\"") + [
    "\n", "\r\n", "http://", "www.", ".com", "@x.io", "![", "](", "](/ə/)", "\u0301", "😀", "ﬁ", "١", "am", "Nov",
    " km", "e.g.", "Dr.", "| ", "|---|", "```", "> ", "- ", "1. ", "&amp;", "\\*", "<b>", "(s)", "1st", " million",
    "\u200d"]


@pytest.mark.parametrize("seed", range(4))
def test_any_text_keeps_the_map_in_order(seed):
    """Random texts of markdown, numbers and symbols: each is spoken or refused with a TextError, and the
    pieces stay inside the input, in order."""
    rng = random.Random(seed)
    for _ in range(100):
        text = "".join(rng.choice(PARTS) for _ in range(rng.randint(1, 60)))
        try:
            spoken = normalize_text(text, "en_US")
        except TextError:
            continue
        assert spoken.text == spoken.text.strip() and "  " not in spoken.text, text
        starts, ends = [piece.start for piece in spoken.pieces], [piece.end for piece in spoken.pieces]
        assert starts == sorted(starts) and ends == sorted(ends) and 0 <= starts[0] and ends[-1] <= len(text), text


def test_said_pieces_name_what_they_say():
    text = "On **2026-11-30** it cost $5 (about 20°C), see example.com."
    spoken = normalize_text(text, "en_US")
    assert [(text[piece.start:piece.end], piece.spoken.strip()) for piece in spoken.pieces if piece.kind == SAID] == [
        ("2026-11-30", "November thirtieth, twenty twenty-six"), ("$5", "five dollars"),
        ("20°C", "twenty degrees Celsius"), ("example.com", "example dot com")]


@pytest.mark.parametrize("text, message", [("", "empty"), (" \n\t", "empty"), ("😀🎉", "nothing to speak"),
                                           ("```\ncode\n```", "nothing to speak")])
def test_text_with_nothing_to_say_is_refused_with_one_code(text, message):
    with pytest.raises(TextError, match=message) as raised:
        normalize_text(text, "en_US")
    assert raised.value.code == "empty_input"  # empty, blank and nothing left: one kind, one code


def test_a_control_character_is_refused():
    with pytest.raises(TextError, match="control character"):
        normalize_text("bell\x07", "en_US")


def test_letters_of_a_script_the_voice_cannot_speak_are_left_out_not_read_as_their_names():
    spoken = normalize_text("Hello 你好, Привет world.", "en_US")
    assert spoken.text.split() == ["Hello", ",", "world."] or "你" not in spoken.text and "П" not in spoken.text
    assert "Hello" in spoken.text and "world" in spoken.text
    assert normalize_text("你好。", "zh").text.startswith("你好")  # its own script is kept
    assert "Привет" in normalize_text("Привет, Bob.", "ru").text  # and Latin everywhere
    assert "你好" in normalize_text("你好", "xx").text  # a language the table does not know keeps every letter


@pytest.mark.parametrize("text, named", [("你好，世界。", "Chinese characters"), ("Привет!", "Cyrillic"),
                                         ("こんにちは", "Hiragana")])
def test_a_text_only_in_scripts_the_voice_cannot_speak_is_refused_naming_them(text, named):
    with pytest.raises(UnspeakableScript, match=named) as raised:
        normalize_text(text, "en_US")
    assert raised.value.code == "unsupported_script" and "en_US" in str(raised.value)


HOSTILE = {
    "brackets": "[", "links": "[a](", "emphasis": "*a", "backticks": "`", "tags": "<a ", "quotes": "> ", "pipes": "|",
    "escaped pipes": "| \\| ", "digits": "1", "currencies": "$", "ranges": "1-", "abbreviations": "e.g.",
    "addresses": "a@b.", "periods": ".", "times": "1:", "entities": "&amp;", "phone": "+1 ", "images": "![",
    "destinations": "[a](<", "combining": "\u0301", "emoji": "😀", "mixed": "$5 on 2026-11-30 at 3:30 pm, 5 km. ",
}


@pytest.mark.slow  # half a minute in all: a measurement of time, the full run's
@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_input_takes_linear_time(name):
    """Four times the input takes about four times the work (this thread's CPU time, so other load on the machine
    does not count), and 10,000 characters take well under half a second."""
    def cpu_seconds(length: int) -> float:
        text = "a" + HOSTILE[name] * (length // len(HOSTILE[name]))
        gc.collect()
        gc.disable()  # a collection's cost grows with everything the test process holds, not with this text
        started = time.thread_time()
        try:
            normalize_text(text, "en_US")
        except TextError:
            pass
        finally:
            gc.enable()
        return time.thread_time() - started

    small, large = cpu_seconds(2_500), cpu_seconds(10_000)
    assert large < 1.0 and large < 8 * small + 0.05, (small, large)


LONG = "9" * 4400  # past Python's 4,300-digit limit for int()


@pytest.mark.parametrize("text, ends", [
    (f"Total: ${LONG}.50 today.", "nine nine dollars and fifty cents today."),
    (f"Total: ${LONG} today.", "nine nine dollars today."),
    (f"{LONG}.1.2.3 is no address.", "nine point one point two point three is no address."),
    (f"{LONG}th place", "nine nine th place"),
], ids=["money", "whole money", "dotted", "ordinal ending"])
def test_numbers_of_any_length_are_read(text, ends):
    assert normalize_text(text, "en_US").text.endswith(ends)


@pytest.mark.parametrize("written, kind, date_format, ends", [
    (LONG, "ordinal", None, "nine nine ninth"),
    (LONG[:-1] + "2nd", "ordinal", None, "nine nine second"),
    (LONG, "cardinal", None, "nine nine nine"),
    (f"1/{LONG}/2020", "date", "mdy", None),  # no such day: read as written
    (f"{LONG}/2020", "date", "my", None),
    ("²", "ordinal", None, None),  # a digit to Python, no number to read
], ids=["ordinal", "ordinal ending", "cardinal", "day", "month", "superscript"])
def test_say_as_reads_numbers_of_any_length(written, kind, date_format, ends):
    said = say_as(written, kind, date_format)
    assert said == ends if ends is None else said.endswith(ends)
