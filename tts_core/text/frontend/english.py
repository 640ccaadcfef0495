"""English: numbers, money, dates, times, units, abbreviations, phone numbers and addresses said as
words (num2words makes the number words).

The text is cut into tokens (lexer.py) and read left to right; at each token the rules below are
tried in order, each looking at most a few tokens ahead, so the work stays linear. A rule returns
how many tokens it read, what they say, and the option that covers it; when that option is off the
tokens are left as written.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import groupby

from .english_words import (
    CURRENCIES,
    DEGREES,
    MAX_CARDINAL_DIGITS,
    MONTH_NAMES,
    MONTHS,
    ORDINAL_ENDINGS,
    PAUSES,
    PHRASES,
    SCALE_SUFFIXES,
    SCALE_WORDS,
    SYMBOLS,
    TITLES,
    UNITS,
    cardinal,
    decade,
    digits,
    is_year,
    number_words,
    ordinal,
    year,
)
from .lexer import (
    DIGITS,
    EMAIL,
    NUMBER,
    SPACE,
    SYMBOL,
    URL,
    WORD,
    Token,
    after_space,
    ends_sentence,
    ends_word,
    integer_at,
    is_at,
    lex,
    starts_word,
)
from .mapped import Mapped
from .options import NormalizationOptions
from .pieces import TEXT, Piece, as_written, piece_of

Found = tuple[int, str, str] | None  # (index after the tokens read, what they say, the option covering it)
MINUS = frozenset("-−")
DASHES = frozenset("-–—")


def verbalize(text: Mapped, options: NormalizationOptions) -> list[Piece]:
    """The pieces that say an English text: each rule's match said, or as written if its option is off."""
    tokens = lex(text.text)
    pieces: list[Piece] = []
    index = 0
    while index < len(tokens):
        found = _first_match(tokens, index)
        if found is None:
            token = tokens[index]
            pieces.append(piece_of(text, token.start, token.end, token.text, TEXT))
            index += 1
            continue
        end, spoken, option = found
        start, stop = tokens[index].start, tokens[end - 1].end
        written = getattr(options, option)
        pieces.extend([piece_of(text, start, stop, spoken)] if written else as_written(text.slice(start, stop)))
        index = end
    return pieces


def _first_match(tokens: list[Token], index: int) -> Found:
    for rule in RULES:
        if (found := rule(tokens, index)) is not None:
            return found
    return None


# --- rules ----------------------------------------------------------------------------------------

def address(tokens: list[Token], index: int) -> Found:
    token = tokens[index]
    if token.kind == URL:
        return index + 1, say_url(token.text), "url_normalization"
    if token.kind == EMAIL:
        local, _, domain = token.text.partition("@")
        spoken = f"{spell(local, {'.': 'dot', '_': 'underscore', '-': 'dash', '+': 'plus'})} at {spell(domain)}"
        return index + 1, spoken, "email_normalization"
    return None


def say_url(url: str) -> str:
    """Host and path; the scheme, "www.", the query and the fragment are not said."""
    rest = url.split("://", 1)[-1]
    rest = rest[4:] if rest.lower().startswith("www.") else rest
    rest = rest.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    host, _, path = rest.partition("/")
    host, _, port = host.partition(":")
    words = [spell(host)] + (["colon", digits(port)] if port and all(char in DIGITS for char in port) else [])
    words += [f"slash {spell(segment, {'.': 'dot'})}" for segment in path.split("/") if segment]
    return " ".join(words)


def spell(part: str, marks: dict[str, str] | None = None) -> str:
    """Letters as they are, digits one by one, marks as words ("." is "dot", "-" "dash"); other marks
    are pauses."""
    marks = {".": "dot", "-": "dash"} if marks is None else marks
    words = []
    for kind, run in groupby(part, lambda char: "digit" if char in DIGITS else "letter" if char.isalnum() else ""):
        run = "".join(run)
        words.append(digits(run) if kind == "digit" else run if kind else " ".join(marks.get(mark, "") for mark in run))
    return " ".join(" ".join(words).split())


def date(tokens: list[Token], index: int) -> Found:
    return _numeric_date(tokens, index) or _month_day(tokens, index) or _day_month(tokens, index)


def _say_date(month: int, day: int, year_written: str | None) -> str | None:
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    spoken = f"{MONTHS[month - 1]} {ordinal(str(day))}"
    return f"{spoken}, {year(year_written)}" if year_written else spoken


def _numeric_date(tokens: list[Token], index: int) -> Found:
    """2026-11-30; 11/30/2026 (month first, as in the US), or 30/11/2026 where the first cannot be a month."""
    numbers = (index, index + 2, index + 4)
    if not (all(integer_at(tokens, at) for at in numbers) and is_at(tokens, index + 1, SYMBOL, ("-", "/"))
            and is_at(tokens, index + 3, SYMBOL, (tokens[index + 1].text,)) and ends_word(tokens, index + 5)):
        return None
    first, second, third = (tokens[at].text for at in numbers)
    if tokens[index + 1].text == "-" and len(first) == 4 and len(second) == len(third) == 2:
        spoken = _say_date(int(second), int(third), first)
    elif tokens[index + 1].text == "/" and len(first) <= 2 and len(second) <= 2 and len(third) == 4:
        month, day = (int(second), int(first)) if int(first) > 12 else (int(first), int(second))
        spoken = _say_date(month, day, third)
    else:
        return None
    return (index + 5, spoken, "date_normalization") if spoken else None


def _day_number(tokens: list[Token], index: int) -> tuple[int, int] | None:
    """A day of the month, "30" or "30th": (the day, the index after it)."""
    if not integer_at(tokens, index, (1, 2)):
        return None
    ordinal_ending = is_at(tokens, index + 1, WORD) and tokens[index + 1].text.lower() in ORDINAL_ENDINGS
    end = index + 2 if ordinal_ending else index + 1
    return (int(tokens[index].text), end) if ends_word(tokens, end) else None


def _year_after(tokens: list[Token], index: int, comma: bool) -> tuple[str | None, int]:
    """An optional year after a date: ", 2026" or " 2026"."""
    at = index + 1 if comma and is_at(tokens, index, SYMBOL, (",",)) else index
    at = after_space(tokens, at)
    if at > index and integer_at(tokens, at, (4,)) and ends_word(tokens, at + 1):
        return tokens[at].text, at + 1
    return None, index


def _month_day(tokens: list[Token], index: int) -> Found:
    """Nov 30, 2026; November 30th; Nov. 30"""
    if not is_at(tokens, index, WORD) or tokens[index].text not in MONTH_NAMES:
        return None
    at = after_space(tokens, index + 2 if is_at(tokens, index + 1, SYMBOL, (".",)) else index + 1)
    day = _day_number(tokens, at) if at > index + 1 else None
    if day is None:
        return None
    year_written, end = _year_after(tokens, day[1], comma=True)
    spoken = _say_date(MONTHS.index(MONTH_NAMES[tokens[index].text]) + 1, day[0], year_written)
    return (end, spoken, "date_normalization") if spoken else None


def _day_month(tokens: list[Token], index: int) -> Found:
    """30 November 2026; 30th of Nov"""
    day = _day_number(tokens, index)
    if day is None:
        return None
    at = after_space(tokens, day[1])
    if is_at(tokens, at, WORD, ("of",)):
        at = after_space(tokens, at + 1)
    if at == day[1] or not is_at(tokens, at, WORD) or tokens[at].text not in MONTH_NAMES:
        return None
    year_written, end = _year_after(tokens, at + 1, comma=False)
    month = MONTH_NAMES[tokens[at].text]
    if not 1 <= day[0] <= 31:
        return None
    spoken = f"the {ordinal(str(day[0]))} of {month}" + (f", {year(year_written)}" if year_written else "")
    return end, spoken, "date_normalization"


def phone(tokens: list[Token], index: int) -> Found:
    """+1 555 123 4567, (555) 123-4567, 555-123-4567, +44 20 7946 0958, 555-1234: digit by digit."""
    plus = is_at(tokens, index, SYMBOL, ("+",))
    at, groups, end = index + 1 if plus else index, [], index
    while at < len(tokens) and len(groups) < 6:
        bracketed = is_at(tokens, at, SYMBOL, ("(",)) and integer_at(tokens, at + 1, (1, 2, 3, 4)) and is_at(
            tokens, at + 2, SYMBOL, (")",))
        if not (bracketed or integer_at(tokens, at, (1, 2, 3, 4))):
            break
        groups.append(tokens[at + 1 if bracketed else at].text)
        at, end = at + (3 if bracketed else 1), at + (3 if bracketed else 1)
        if is_at(tokens, at, SYMBOL, ("-", ".")) or is_at(tokens, at, SPACE, (" ",)):
            at += 1
    if not groups or not ends_word(tokens, end):
        return None
    sizes, total = [len(group) for group in groups], sum(len(group) for group in groups)
    international = plus and len(groups) > 1 and 8 <= total <= 15
    national = len(groups) >= 3 and sizes[-1] == 4 and min(sizes[1:]) >= 3 and total in (10, 11)
    local = sizes == [3, 4] and is_at(tokens, index + 1, SYMBOL, ("-",))
    if not (international or national or local):
        return None
    return end, ("plus " if plus else "") + ", ".join(digits(group) for group in groups), "phone_normalization"


def dotted(tokens: list[Token], index: int) -> Found:
    """Numbers in dotted groups: 30.11.2026 (a date, day first), 555.123.4567 (a phone number),
    192.168.0.1 (an address, "dot"), 3.10.2 (a version, "point")."""
    if not is_at(tokens, index, NUMBER) or tokens[index].text.count(".") < 2:
        return None
    groups = tokens[index].text.split(".")
    sizes = [len(group) for group in groups]
    if len(groups) == 3 and sizes[2] == 4 and max(sizes[:2]) <= 2:
        spoken = _say_date(int(groups[1]), int(groups[0]), groups[2])
        if spoken:
            return index + 1, spoken, "date_normalization"
    if sizes == [3, 3, 4]:
        return index + 1, ", ".join(map(digits, groups)), "phone_normalization"
    if len(groups) == 4 and all(len(group) <= 3 and int(group) <= 255 for group in groups):
        return index + 1, " dot ".join(map(cardinal, groups)), "number_normalization"
    return index + 1, " point ".join(map(cardinal, groups)), "number_normalization"


FRACTION_DENOMINATORS = frozenset({2, 3, 4, 5, 6, 8, 12, 16, 32, 64})  # not 10: 9/10 is often a score


def fraction(tokens: list[Token], index: int) -> Found:
    """1/2, 3/4 cup, 2 1/2 hours: "one half", "three quarters", "two and one half". Only proper fractions
    of the usual denominators (24/7 and 9/11 stay as they are read otherwise)."""
    whole = None
    at = index
    if integer_at(tokens, at) and is_at(tokens, at + 1, SPACE, (" ",)) and _fraction_at(tokens, at + 2):
        whole, at = tokens[at].text, at + 2
    said = _fraction_at(tokens, at) if starts_word(tokens, index) else None
    if said is None:
        return None
    return at + 3, (f"{cardinal(whole)} and {said}" if whole else said), "number_normalization"


def _fraction_at(tokens: list[Token], index: int) -> str | None:
    if not (integer_at(tokens, index, (1, 2)) and is_at(tokens, index + 1, SYMBOL, ("/",))
            and integer_at(tokens, index + 2, (1, 2, 3)) and ends_word(tokens, index + 3)):
        return None
    numerator, denominator = int(tokens[index].text), int(tokens[index + 2].text)
    if not (0 < numerator < denominator and denominator in FRACTION_DENOMINATORS):
        return None
    name = {2: "half", 4: "quarter"}.get(denominator) or ordinal(str(denominator))
    return f"{cardinal(str(numerator))} {name if numerator == 1 else name + 's'}".replace("halfs", "halves")


def time(tokens: list[Token], index: int) -> Found:
    """3:30 pm, 14:05, 10:30:15, 7am, 7 p.m."""
    if not integer_at(tokens, index, (1, 2)):
        return None
    hour, at, minute, second = int(tokens[index].text), index + 1, None, None
    if is_at(tokens, at, SYMBOL, (":",)) and integer_at(tokens, at + 1, (2,)):
        minute, at = int(tokens[at + 1].text), at + 2
        if is_at(tokens, at, SYMBOL, (":",)) and integer_at(tokens, at + 1, (2,)):
            second, at = int(tokens[at + 1].text), at + 2
    period = _period(tokens, at)
    if (minute is None and period is None) or hour > (12 if period else 23) or (minute or 0) > 59 or (
            second or 0) > 59:
        return None
    end = period[0] if period else at
    if not ends_word(tokens, end):
        return None
    words = [cardinal(str(hour))]
    if minute:
        words.append(f"oh {cardinal(str(minute))}" if minute < 10 else cardinal(str(minute)))
    elif minute == 0 and not period:
        words.append("o'clock" if hour <= 12 else "hundred")
    if second:
        words.append(f"and {cardinal(str(second))} second{'s' if second > 1 else ''}")
    if period:
        words.append(period[1])
    return end, " ".join(words), "time_normalization"


def _period(tokens: list[Token], index: int) -> tuple[int, str] | None:
    """am, pm, a.m., P.M. after a time: (the index after it, what it says)."""
    at = after_space(tokens, index)
    if is_at(tokens, at, WORD) and tokens[at].text.lower() in ("am", "pm") and ends_word(tokens, at + 1):
        return at + 1, f"{tokens[at].text[0].lower()} m"
    dotted = [token.text.lower() for token in tokens[at:at + 4]]
    if dotted[:3] in (["a", ".", "m"], ["p", ".", "m"]) and dotted[3:] == ["."]:
        end = at + 4
        return end, f"{dotted[0]} m" + ("." if ends_sentence(tokens, end) else "")
    return None


def money(tokens: list[Token], index: int) -> Found:
    """$5, $3.50, €20, £1.5 million, $2bn, -$5"""
    negative = is_at(tokens, index, SYMBOL, MINUS) and starts_word(tokens, index)
    at = index + 1 if negative else index
    if not (is_at(tokens, at, SYMBOL, CURRENCIES) and is_at(tokens, at + 1, NUMBER)):
        return None
    unit, units, cent, cents = CURRENCIES[tokens[at].text]
    written, end = tokens[at + 1].text, at + 2
    scale, spaced = None, after_space(tokens, end)
    if is_at(tokens, end, WORD, SCALE_SUFFIXES) and ends_word(tokens, end + 1):
        scale, end = SCALE_SUFFIXES[tokens[end].text], end + 1
    elif spaced > end and is_at(tokens, spaced, WORD, SCALE_WORDS):
        scale, end = tokens[spaced].text, spaced + 1
    if not ends_word(tokens, end):
        return None
    whole, _, fraction = written.replace(",", "").partition(".")
    if is_at(tokens, end, SYMBOL, DASHES):  # a range: $5-10, $5–$10
        upper = end + 2 if is_at(tokens, end + 1, SYMBOL, (tokens[at].text,)) else end + 1
        if is_at(tokens, upper, NUMBER) and ends_word(tokens, upper + 1) and not scale:
            spoken = f"{number_words(written)} to {number_words(tokens[upper].text)} {units}"
            return upper + 1, ("minus " if negative else "") + spoken, "currency_normalization"
    if scale:
        spoken = f"{number_words(written)} {scale} {units}"
    elif not fraction or len(fraction) > 2:
        spoken = f"{number_words(written)} {unit if written == '1' else units}"
    else:  # compared as written: int() refuses numbers of over 4,300 digits
        major, minor = whole.lstrip("0"), fraction.ljust(2, "0").lstrip("0")
        said = [f"{cardinal(whole)} {unit if major == '1' else units}"] if major or not minor else []
        said += [f"{cardinal(minor)} {cent if minor == '1' else cents}"] if minor else []
        spoken = " and ".join(said)
    return end, ("minus " if negative else "") + spoken, "currency_normalization"



def abbreviation(tokens: list[Token], index: int) -> Found:
    """Dr. Smith, e.g., etc., vs., No. 5"""
    if not (is_at(tokens, index, WORD) and starts_word(tokens, index)):
        return None
    key, at = tokens[index].text, index + 1
    if (len(key) == 1 and is_at(tokens, at, SYMBOL, (".",)) and is_at(tokens, at + 1, WORD)
            and len(tokens[at + 1].text) == 1):  # e.g., i.e.
        key, at = f"{key}.{tokens[at + 1].text}", at + 2
    dotted = is_at(tokens, at, SYMBOL, (".",))
    end = at + 1 if dotted else at
    if dotted and key in TITLES:
        return end, TITLES[key], "abbreviation_normalization"
    if key.lower() in PHRASES and (dotted or key.lower() == "vs"):
        spoken = PHRASES[key.lower()] + ("." if dotted and ends_sentence(tokens, end) else "")
        return end, spoken, "abbreviation_normalization"
    if dotted and key in ("No", "no") and integer_at(tokens, after_space(tokens, end)):
        return end, "number", "abbreviation_normalization"
    return None


def optional_plural(tokens: list[Token], index: int) -> Found:
    """file(s) -> files"""
    if (is_at(tokens, index, WORD) and is_at(tokens, index + 1, SYMBOL, ("(",))
            and is_at(tokens, index + 2, WORD, ("s",)) and is_at(tokens, index + 3, SYMBOL, (")",))):
        return index + 4, tokens[index].text + "s", "optional_pluralization_normalization"
    return None


def quantity(tokens: list[Token], index: int) -> Found:
    """A number, with what makes it one thing to say: 12, -5, 3.14, 1st, 1990s, 3x, 5-10, 1990–2000, 50%,
    5 km, 20°C. A four-digit whole number from 1100 to 2099 standing alone reads as a year."""
    negative = is_at(tokens, index, SYMBOL, MINUS) and starts_word(tokens, index) and is_at(tokens, index + 1, NUMBER)
    at = index + 1 if negative else index
    if not is_at(tokens, at, NUMBER):
        return None
    written, end = tokens[at].text, at + 1
    if (integer_at(tokens, at, range(1, MAX_CARDINAL_DIGITS + 1)) and not negative and is_at(tokens, end, WORD)
            and ends_word(tokens, end + 1)):
        ending = tokens[end].text
        if ending.lower() in ORDINAL_ENDINGS:
            return end + 1, ordinal(written), "number_normalization"
        if ending == "s" and (words := decade(written)):
            return end + 1, words, "number_normalization"
        if ending == "x":  # 3x faster
            return end + 1, f"{number_words(written)} times", "number_normalization"
    second = None if negative else _range_end(tokens, end)
    if second is not None:
        other, end = tokens[second].text, second + 1
        say = year if is_year(written) and is_year(other) else number_words
        spoken = f"{say(written)} to {say(other)}"
    else:
        spoken = ("minus " if negative else "") + number_words(written)
    if is_at(tokens, end, SYMBOL, ("%",)):
        return end + 1, f"{spoken} percent", "number_normalization"
    if (unit := _unit(tokens, end)) is not None:
        one = second is None and written == "1"
        return unit[0], f"{spoken} {unit[1][0 if one else 1]}", "unit_normalization"
    if second is None and not negative and is_year(written):
        spoken = year(written)
    return end, spoken, "number_normalization"


def _range_end(tokens: list[Token], index: int) -> int | None:
    """The index of the number ending a range: "5-10", "1990–2000", "1990 – 2000"."""
    if is_at(tokens, index, SYMBOL, DASHES) and is_at(tokens, index + 1, NUMBER):
        return index + 1
    if (is_at(tokens, index, SPACE, (" ",)) and is_at(tokens, index + 1, SYMBOL, ("–", "—"))
            and is_at(tokens, index + 2, SPACE, (" ",)) and is_at(tokens, index + 3, NUMBER)):
        return index + 3
    return None


def _unit(tokens: list[Token], index: int) -> tuple[int, tuple[str, str]] | None:
    """A unit after a number ("km", " kg", "°C", "km/h"): (the index after it, its names)."""
    at = after_space(tokens, index)
    if is_at(tokens, at, SYMBOL, ("°",)):
        scale = tokens[at + 1].text if is_at(tokens, at + 1, WORD, ("C", "F")) else ""
        end = at + 2 if scale else at + 1
        return (end, DEGREES[scale]) if ends_word(tokens, end) else None
    if not is_at(tokens, at, WORD):
        return None
    name, end = tokens[at].text, at + 1
    slashed = is_at(tokens, end, SYMBOL, ("/",)) and is_at(tokens, end + 1, WORD)
    per = f"{name}/{tokens[end + 1].text}" if slashed else ""
    if per in UNITS:  # km/h
        name, end = per, end + 2
    return (end, UNITS[name]) if name in UNITS and ends_word(tokens, end) else None


def symbol(tokens: list[Token], index: int) -> Found:
    """& + = @ / % as words ("/" after a number, before a word, is "per": $9.99/month); # and ~ before
    a number as "number" and "about"; markup left over as a pause."""
    if not is_at(tokens, index, SYMBOL):
        return None
    mark = tokens[index].text
    if mark == "/" and index and tokens[index - 1].kind == NUMBER and is_at(tokens, index + 1, WORD):
        return index + 1, "per", "replace_remaining_symbols"
    if mark in SYMBOLS:
        return index + 1, SYMBOLS[mark], "replace_remaining_symbols"
    if mark in "#~" and is_at(tokens, index + 1, NUMBER):
        return index + 1, "number" if mark == "#" else "about", "replace_remaining_symbols"
    if mark in PAUSES:
        return index + 1, " ", "replace_remaining_symbols"
    return None


RULES: tuple[Callable[[list[Token], int], Found], ...] = (
    address, date, dotted, phone, fraction, time, money, abbreviation, optional_plural, quantity, symbol)


# --- SSML <say-as> ----------------------------------------------------------------------------------

DATE_FORMATS = frozenset({"mdy", "dmy", "ymd", "md", "dm", "ym", "my", "y", "m", "d"})


def say_as(written: str, interpret_as: str, date_format: str | None) -> str | None:
    """What <say-as interpret-as="..."> says for `written`; None when it is not one of those (a
    "cardinal" that is no number): then it is read as written."""
    written = written.strip()
    if interpret_as in ("characters", "spell-out"):
        return " ".join(digits(char) if char in DIGITS else char.upper() for char in written if char.isalnum())
    numeric = written.replace(",", "")
    if interpret_as in ("cardinal", "number"):
        negative = numeric[:1] in MINUS
        number = numeric[1:] if negative else numeric
        if _ascii_digits(number.replace(".", "", 1)) and number[:1] in DIGITS:
            return ("minus " if negative else "") + number_words(number)
        return None
    if interpret_as == "ordinal":
        number = numeric.rstrip(".").removesuffix("th").removesuffix("st").removesuffix("nd").removesuffix("rd")
        return ordinal(number) if _ascii_digits(number) else None
    if interpret_as == "telephone":
        groups = [group for group in "".join(char if char in DIGITS else " " for char in written).split()]
        return ("plus " if written.startswith("+") else "") + ", ".join(map(digits, groups)) if groups else None
    if interpret_as == "date":
        return _say_as_date(written, date_format or "mdy")
    return None


def _ascii_digits(written: str) -> bool:
    """0-9 only, at least one ("²".isdigit() is true too, and no number words can say it)."""
    return bool(written) and all(char in DIGITS for char in written)


def _say_as_date(written: str, date_format: str) -> str | None:
    """A date whose numbers come in the format's order (mdy: 11/30/2026; ymd: 2026-11-30; my: 11/2026)."""
    if date_format not in DATE_FORMATS:
        return None
    numbers = "".join(char if char in DIGITS else " " for char in written).split()
    if len(numbers) != len(date_format):
        return None
    values = dict(zip(date_format, numbers))
    if any(len(values.get(part, "")) > 2 for part in "md"):
        return None
    month = int(values["m"]) if "m" in values else None
    if month is not None and not 1 <= month <= 12:
        return None
    if "d" in values and not 1 <= int(values["d"]) <= 31:
        return None
    said = []
    if "d" in values and month is not None:
        said.append(f"{MONTHS[month - 1]} {ordinal(values['d'])}")
    elif "d" in values:
        said.append(f"the {ordinal(values['d'])}")
    elif month is not None:
        said.append(MONTHS[month - 1])
    if "y" in values:
        said.append(year(values["y"]) if len(values["y"]) == 4 else cardinal(values["y"]))
    return ", ".join(said) if "d" in values and "y" in values else " ".join(said)
