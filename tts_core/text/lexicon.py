"""The operator's pronunciation lexicon: per language, a word or phrase said with given IPA (for
phoneme-driven voices) and/or a respelling (for voices that read characters).

`Lexicon` is an immutable snapshot of the entries: whoever reads the stored entries builds a new one
and swaps it in with one assignment, so a request sees one whole lexicon, old or new.

Matching is on words: the text is cut once into tokens (words, single punctuation characters, runs
of white space) and a trie of the entries' tokens is walked from each word, so the work is linear in
the text's length times the longest phrase's token count, whatever the number of entries; the
longest match wins, then the leftmost. A case-insensitive entry matches any casing.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_PHRASE_CHARS = 100
MAX_PRONUNCIATION_CHARS = 200
MAX_IMPORT_LINES = 5000
TSV_COLUMNS = ("language", "phrase", "ipa", "respelling", "case_sensitive")
_APOSTROPHES = frozenset("'’")
_NOT_IN_PRONUNCIATIONS = frozenset("[]/")  # Piper reads [[...]] as raw phonemes; / ends an inline override


def language_code(language: str) -> str:
    """A voice's or an entry's language as the lexicon keys it: "en_US", "en-us", "EN" are "en"."""
    return language.replace("-", "_").split("_")[0].lower()


class LexiconEntry(BaseModel):
    """One entry as an operator writes it (a stored one also has an id, updated_at and updated_by)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    language: str = Field(min_length=2, max_length=16, description='"en"; a region ("en_US") is ignored')
    phrase: str = Field(min_length=1, max_length=MAX_PHRASE_CHARS)
    ipa: str | None = Field(None, max_length=MAX_PRONUNCIATION_CHARS, description="IPA, without slashes")
    respelling: str | None = Field(None, max_length=MAX_PRONUNCIATION_CHARS)
    case_sensitive: bool = False

    @field_validator("language")
    @classmethod
    def _language(cls, value: str) -> str:
        code = language_code(value)
        if not (2 <= len(code) <= 3 and code.isascii() and code.isalpha()):
            raise ValueError("must be a language code of 2 or 3 letters, such as en or deu")
        return code

    @field_validator("phrase")
    @classmethod
    def _phrase(cls, value: str) -> str:
        value = " ".join(unicodedata.normalize("NFKC", value).split())  # as the front end reads the text
        if len(value) > MAX_PHRASE_CHARS:  # NFKC can make it longer ("ﷺ" is 18 letters)
            raise ValueError(f"must be at most {MAX_PHRASE_CHARS} characters once normalised")
        _check_characters(value)
        if not any(char.isalnum() for char in value):
            raise ValueError("must have a letter or a digit")
        return value

    @field_validator("ipa", "respelling")
    @classmethod
    def _pronunciation(cls, value: str | None) -> str | None:
        value = " ".join(value.split()) if value else None
        if value:
            _check_characters(value)
            if _NOT_IN_PRONUNCIATIONS & set(value):
                raise ValueError("must not have [, ] or /")
        return value

    @model_validator(mode="after")
    def _said_somehow(self) -> LexiconEntry:
        if not (self.ipa or self.respelling):
            raise ValueError("give ipa, respelling or both")
        return self


def _check_characters(value: str) -> None:
    if any(unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co", "Cn") for char in value):
        raise ValueError("must not have control or unassigned characters")


# --- matching --------------------------------------------------------------------------------------

_END = ""  # a trie node's key for the entry ending there (no token is empty)


def _tokens(text: str) -> list[tuple[int, int]]:
    """(start, end) of each word, each other character but white space, and each run of white space.
    A word is letters and digits, with apostrophes inside ("don't" is one word, so an entry "Don"
    does not match it), but for a possessive's ("Worcester's" is "Worcester", "'", "s")."""
    spans, at, size = [], 0, len(text)
    while at < size:
        end = at + 1
        if text[at].isalnum():
            while end < size and (text[end].isalnum() or (text[end] in _APOSTROPHES and _inner(text, end))):
                end += 1
        elif text[at].isspace():
            while end < size and text[end].isspace():
                end += 1
        spans.append((at, end))
        at = end
    return spans


def _inner(text: str, at: int) -> bool:
    """The apostrophe at text[at] is inside a word, not a possessive's 's."""
    after = text[at + 1:at + 3]
    return bool(after[:1].isalnum()) and not (after[:1] in "sS" and not after[1:2].isalnum())


def _keys(text: str, spans: list[tuple[int, int]], fold: bool) -> list[str]:
    keys = [" " if text[start].isspace() else text[start:end] for start, end in spans]
    return [key.casefold() for key in keys] if fold else keys


class _Trie:
    def __init__(self, entries: Iterable[LexiconEntry], fold: bool):
        self.fold, self.root = fold, {}
        for entry in entries:
            node = self.root
            for key in _keys(entry.phrase, _tokens(entry.phrase), fold):
                node = node.setdefault(key, {})
            node.setdefault(_END, entry)  # the first of entries that fold alike wins

    def longest(self, keys: list[str], first: int) -> tuple[int, LexiconEntry | None]:
        """The number of tokens of the longest entry that keys[first:] starts with, and that entry."""
        node, best = self.root, (0, None)
        for index in range(first, len(keys)):
            node = node.get(keys[index])
            if node is None:
                break
            if _END in node:
                best = (index + 1 - first, node[_END])
        return best


class Lexicon:
    """An immutable snapshot of the entries, by language."""

    def __init__(self, entries: Iterable[LexiconEntry] = ()):
        self.entries = tuple(entries)
        by_language: dict[str, list[LexiconEntry]] = {}
        for entry in self.entries:
            by_language.setdefault(entry.language, []).append(entry)
        self._tries = {language: (_Trie((e for e in listed if e.case_sensitive), False),
                                  _Trie((e for e in listed if not e.case_sensitive), True))
                       for language, listed in by_language.items()}

    def __len__(self) -> int:
        return len(self.entries)

    def matches(self, language: str, text: str) -> list[tuple[int, int, LexiconEntry]]:
        """(start, end, entry) of each phrase found in text, in order, none overlapping."""
        tries = self._tries.get(language_code(language))
        if tries is None:
            return []
        spans = _tokens(text)
        exact, folded = _keys(text, spans, False), _keys(text, spans, True)
        found, index = [], 0
        while index < len(spans):
            if text[spans[index][0]].isspace():
                index += 1
                continue
            sensitive, insensitive = tries[0].longest(exact, index), tries[1].longest(folded, index)
            length, entry = max(sensitive, insensitive, key=lambda match: match[0])  # a tie: case-sensitive
            if entry is None:
                index += 1
                continue
            found.append((spans[index][0], spans[index + length - 1][1], entry))
            index += length
        return found


# --- TSV -------------------------------------------------------------------------------------------


class LexiconFileError(ValueError):
    """Lines of a TSV file that are not entries: (line number, why) each."""

    def __init__(self, problems: list[tuple[int, str]]):
        self.problems = problems
        shown = "; ".join(f"line {number}: {why}" for number, why in problems[:20])
        more = f"; and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{len(problems)} bad line(s): {shown}{more}")


def to_tsv(entries: Iterable[LexiconEntry]) -> str:
    """A header line, then one line per entry: language, phrase, ipa, respelling, case_sensitive."""
    lines = ["\t".join(TSV_COLUMNS)]
    lines += ["\t".join((entry.language, entry.phrase, entry.ipa or "", entry.respelling or "",
                         "true" if entry.case_sensitive else "false")) for entry in entries]
    return "\n".join(lines) + "\n"


def from_tsv(text: str) -> list[LexiconEntry]:
    """Every entry of a TSV file as to_tsv writes it (the header line, blank lines and lines starting
    with # are skipped; the last fields may be left out: no respelling, not case-sensitive). Raises
    LexiconFileError naming every bad line, or the file's size if it has more than MAX_IMPORT_LINES lines."""
    lines = text.splitlines()
    if len(lines) > MAX_IMPORT_LINES + 1:
        raise LexiconFileError([(MAX_IMPORT_LINES + 2, f"a file has at most {MAX_IMPORT_LINES} entries")])
    entries, problems, seen = [], [], {}
    for number, line in enumerate(lines, 1):
        header = number == 1 and line.split("\t")[:2] == ["language", "phrase"]
        if not line.strip() or line.startswith("#") or header:
            continue
        try:
            entry = _entry_of(line.split("\t"))
        except ValueError as error:
            problems.append((number, _reason(error)))
            continue
        key = (entry.language, entry.phrase)
        if key in seen:
            problems.append((number, f"{entry.phrase!r} ({entry.language}) is on line {seen[key]} too"))
            continue
        seen[key] = number
        entries.append(entry)
    if problems:
        raise LexiconFileError(problems)
    return entries


def _entry_of(fields: list[str]) -> LexiconEntry:
    if not 3 <= len(fields) <= len(TSV_COLUMNS):
        raise ValueError(f"expected 3 to {len(TSV_COLUMNS)} tab-separated fields ({', '.join(TSV_COLUMNS)}), "
                         f"found {len(fields)}")
    language, phrase, ipa, respelling, flag = fields + [""] * (len(TSV_COLUMNS) - len(fields))
    if flag.strip().lower() not in ("", "true", "false"):
        raise ValueError("case_sensitive must be true or false")
    return LexiconEntry(language=language.strip(), phrase=phrase, ipa=ipa or None, respelling=respelling or None,
                        case_sensitive=flag.strip().lower() == "true")


def _reason(error: ValueError) -> str:
    errors = getattr(error, "errors", None)
    if callable(errors):  # pydantic's: each field and why
        return "; ".join(f"{'.'.join(map(str, item['loc'])) or 'entry'}: {item['msg']}" for item in errors())
    return str(error)
