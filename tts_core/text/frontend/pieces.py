"""What the front end returns: the text to speak, in pieces that each name the slice of the caller's
input they speak (a caption word is a piece: "$5" reads "five dollars")."""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import groupby

from ..pronunciation import CLOSE, OPEN
from .mapped import Mapped

TEXT = "text"  # the caller's words as written (Unicode-normalised, white space collapsed)
SAID = "said"  # written form replaced by words: numbers, symbols, abbreviations, addresses
PRONUNCIATION = "pronunciation"  # [word](/IPA/) or a lexicon entry: spoken as a marked span (text/pronunciation.py)
BREAK = "break"  # a pause the text's layout implies (a heading's end, a table cell's): no source


_NO_SPACE_BEFORE = frozenset("\n,.;:!?")


@dataclass(frozen=True)
class Piece:
    start: int  # input[start:end] is what this piece speaks (empty for a break)
    end: int
    spoken: str
    kind: str = TEXT
    ipa: str | None = None  # a pronunciation's IPA (an inline override's, between its slashes)
    respelling: str | None = None  # a pronunciation's respelling (lexicon entries only)


@dataclass(frozen=True)
class SpokenText:
    pieces: tuple[Piece, ...]
    text: str  # the pieces' spoken texts joined: what the voice is given


def piece_of(mapped: Mapped, start: int, end: int, spoken: str, kind: str = SAID) -> Piece:
    """The piece saying mapped.text[start:end] (not empty) as `spoken`."""
    source_start, source_end = mapped.span(start, end)
    return Piece(source_start, source_end, spoken, kind)


def as_written(mapped: Mapped) -> list[Piece]:
    """The text as it is: a piece per word and per run of white space (tidy collapses those)."""
    pieces, start = [], 0
    for _, run in groupby(mapped.text, str.isspace):
        end = start + len(list(run))
        pieces.append(piece_of(mapped, start, end, mapped.text[start:end], TEXT))
        start = end
    return pieces


def tidy(pieces: list[Piece]) -> SpokenText:
    """Join pieces into the text to speak: white space collapsed to one space or line break, none at
    either end; a space between a word and a said piece that would run into it ("H2O": "H two O");
    neighbouring pieces of the caller's text merged; pieces left with nothing to say dropped."""
    kept: list[tuple[Piece, list[str]]] = []  # each piece with its spoken text in parts (joined once, at the end)
    for piece in pieces:
        spoken = _collapse(piece.spoken)
        if spoken[:1] in _NO_SPACE_BEFORE:  # "now 😀!" read as "now!", and no space before a line break
            _strip_end(kept, " ")
        before = kept[-1][1][-1][-1] if kept else "\n"
        if before in " \n" and spoken[:1] in (" ", "\n"):
            spoken = spoken[1:]
        elif _wordlike(before) and _wordlike(spoken[:1]) and SAID in (piece.kind, kept[-1][0].kind):
            spoken = " " + spoken
        if not spoken:
            continue
        if kept and piece.kind == TEXT == kept[-1][0].kind and kept[-1][0].end == piece.start:
            kept[-1] = (replace(kept[-1][0], end=piece.end), kept[-1][1])
            kept[-1][1].append(spoken)
        else:
            kept.append((piece, [spoken]))
    _strip_end(kept, " \n")
    joined = tuple(replace(piece, spoken="".join(parts)) for piece, parts in kept)
    return SpokenText(joined, "".join(piece.spoken for piece in joined))


def _wordlike(char: str) -> bool:
    """A letter or digit, or a pronunciation's edge (a word): a said piece next to it needs a space."""
    return char.isalnum() or char in (OPEN, CLOSE)


def _strip_end(kept: list[tuple[Piece, list[str]]], chars: str) -> None:
    while kept and kept[-1][1][-1][-1] in chars:
        parts = kept[-1][1]
        parts[-1] = parts[-1].rstrip(chars)
        if not parts[-1]:
            parts.pop()
        if not parts:
            kept.pop()


def _collapse(text: str) -> str:
    """Each run of white space as one space, or one line break if it has one."""
    return "".join(("\n" if "\n" in run else " ") if space else run
                   for space, run in ((space, "".join(chars)) for space, chars in groupby(text, str.isspace)))
