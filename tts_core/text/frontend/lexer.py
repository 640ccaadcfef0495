"""Text cut into tokens a language's rules read: words, numbers, web and e-mail addresses, white
space and single symbols. One left-to-right scan: each character is looked at a bounded number of
times (each run between spaces is classified once), so the work is linear in the text's length.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

SPACE, NUMBER, WORD, URL, EMAIL, SYMBOL = "space", "number", "word", "url", "email", "symbol"

DIGITS = frozenset("0123456789")
_OPENERS = "([{<\"'‘“"
_CLOSERS = ".,;:!?)]}>\"'’”"
_SCHEMES = ("http://", "https://")
# A bare host is taken for a web address only with one of these endings ("example.com"), so that
# "e.g." or "Node.js" are not.
_BARE_TLDS = frozenset({"com", "org", "net", "edu", "gov", "io", "ai", "dev", "app", "co", "uk", "us"})
_EMAIL_LOCAL = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._%+-")


@dataclass(frozen=True)
class Token:
    kind: str
    start: int
    end: int
    text: str


def lex(text: str) -> list[Token]:
    tokens: list[Token] = []
    at, run_end = 0, 0
    while at < len(text):
        if text[at].isspace():
            end = _skip(text, at, str.isspace)
            tokens.append(Token(SPACE, at, end, text[at:end]))
            at = end
            continue
        if at >= run_end:  # the first character of a run between spaces: is the run an address?
            run_end = _skip(text, at, lambda char: not char.isspace())
            core_start, core_end = _core(text, at, run_end)
            kind = address_kind(text[core_start:core_end])
            if kind:
                tokens.extend(Token(SYMBOL, index, index + 1, text[index]) for index in range(at, core_start))
                tokens.append(Token(kind, core_start, core_end, text[core_start:core_end]))
                at = core_end
                continue
        end = _token_end(text, at)
        char = text[at]
        kind = NUMBER if char in DIGITS else WORD if end > at + 1 or _is_word_char(char) else SYMBOL
        tokens.append(Token(kind, at, end, text[at:end]))
        at = end
    return tokens


def _skip(text: str, at: int, keep) -> int:
    while at < len(text) and keep(text[at]):
        at += 1
    return at


def _core(text: str, start: int, end: int) -> tuple[int, int]:
    """A run without the brackets and quotes around it and the punctuation after it."""
    while start < end and text[start] in _OPENERS:
        start += 1
    while end > start and text[end - 1] in _CLOSERS:
        end -= 1
    return start, end


def _is_word_char(char: str) -> bool:
    return (char.isalnum() and char not in DIGITS) or unicodedata.combining(char) > 0


def _token_end(text: str, at: int) -> int:
    if text[at] in DIGITS:
        return number_end(text, at)
    if not _is_word_char(text[at]):
        return at + 1
    end = at + 1
    while end < len(text) and (_is_word_char(text[end]) or (
            text[end] in "'’" and end + 1 < len(text) and _is_word_char(text[end + 1]))):
        end += 1
    return end


def number_end(text: str, at: int) -> int:
    """Digits, with thousands grouped by commas ("1,234,567") and a decimal part ("3.14"), or dotted groups
    ("3.10.2", "192.168.0.1", "555.123.4567", "30.11.2026")."""
    end = _skip(text, at, DIGITS.__contains__)
    if end - at <= 3:
        while (end + 3 < len(text) and text[end] == "," and all(char in DIGITS for char in text[end + 1:end + 4])
               and (end + 4 == len(text) or text[end + 4] not in DIGITS)):
            end += 4
    dotted = end + 1 < len(text) and text[end] == "." and text[end + 1] in DIGITS
    while dotted:
        end = _skip(text, end + 1, DIGITS.__contains__)
        dotted = end + 1 < len(text) and text[end] == "." and text[end + 1] in DIGITS and "," not in text[at:end]
    return end


def address_kind(word: str) -> str | None:
    """URL for a web address (with a scheme, www., or a bare host with a common ending), EMAIL for an
    e-mail address, else None."""
    lower = word.lower()
    if lower.startswith(_SCHEMES):
        host = lower.split("://", 1)[1].split("/", 1)[0]
        return URL if "." in host or host.startswith("localhost") else None
    if "@" in word:
        local, _, domain = word.partition("@")
        labels = domain.split(".")
        if (local and all(char in _EMAIL_LOCAL for char in local) and len(labels) > 1
                and all(_is_label(label) for label in labels) and labels[-1].isalpha() and len(labels[-1]) > 1):
            return EMAIL
        return None
    labels = word.split("/", 1)[0].split(".")
    if len(labels) > 1 and (lower.startswith("www.") or labels[-1].lower() in _BARE_TLDS) and all(
            _is_label(label) for label in labels):
        return URL
    return None


def _is_label(label: str) -> bool:
    return bool(label) and label.isascii() and all(char.isalnum() or char == "-" for char in label)


# --- what rules ask of tokens -------------------------------------------------------------------

def is_at(tokens: list[Token], index: int, kind: str, texts=None) -> bool:
    return index < len(tokens) and tokens[index].kind == kind and (texts is None or tokens[index].text in texts)


def integer_at(tokens: list[Token], index: int, sizes=None) -> bool:
    """A number of digits only (no grouping, no decimals), of one of these lengths if sizes says."""
    return is_at(tokens, index, NUMBER) and tokens[index].text.isdigit() and (
        sizes is None or len(tokens[index].text) in sizes)


def ends_word(tokens: list[Token], index: int) -> bool:
    """Nothing that continues a word or number at tokens[index]."""
    return index >= len(tokens) or tokens[index].kind not in (WORD, NUMBER)


def starts_word(tokens: list[Token], index: int) -> bool:
    return index == 0 or tokens[index - 1].kind in (SPACE, SYMBOL)


def ends_sentence(tokens: list[Token], index: int) -> bool:
    """A period read at tokens[index - 1] ended its sentence (text ends, or a capital follows)."""
    return index >= len(tokens) or (tokens[index].kind == SPACE and (
        index + 1 >= len(tokens) or "\n" in tokens[index].text or tokens[index + 1].text[:1].isupper()))


def after_space(tokens: list[Token], index: int) -> int:
    """Past one plain space at tokens[index], if there is one."""
    return index + 1 if is_at(tokens, index, SPACE, (" ",)) else index
