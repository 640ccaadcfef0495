"""Text that remembers where each of its characters came from in the caller's input.

Every step of the front end (Unicode normalisation, markdown, the language's own rules) reads a
`Mapped` and says which of its characters a spoken piece replaces; the map turns that back into a
slice of what the caller sent, which captions and word timings need.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from ..chunks import TextError

_ALLOWED_CONTROLS = frozenset("\t\n\r")
_LINE_BREAKS = {"\r\n": "\n", "\r": "\n", "\u2028": "\n", "\u2029": "\n"}


@dataclass(frozen=True)
class Mapped:
    """text[i] came from source[starts[i]:ends[i]] (several characters share a span when one source
    character became several, or several became one)."""

    text: str
    starts: tuple[int, ...]
    ends: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.text)

    @staticmethod
    def join(parts: list[Mapped]) -> Mapped:
        return Mapped("".join(part.text for part in parts), tuple(i for part in parts for i in part.starts),
                      tuple(i for part in parts for i in part.ends))

    def slice(self, start: int, end: int) -> Mapped:
        return Mapped(self.text[start:end], self.starts[start:end], self.ends[start:end])

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The source slice that text[start:end] (not empty) came from."""
        return self.starts[start], self.ends[end - 1]

    def position(self, index: int) -> int:
        """The source position of the gap before text[index] (or after the last character)."""
        if index < len(self.starts):
            return self.starts[index]
        return self.ends[-1] if self.ends else 0

    def replaced(self, text: str, start: int, end: int) -> Mapped:
        """`text` standing for text[start:end] (an escape, an entity): every character maps to the whole."""
        source_start, source_end = self.span(start, end)
        return Mapped(text, (source_start,) * len(text), (source_end,) * len(text))

    def without(self, drop) -> Mapped:
        """The characters for which drop(char) is false."""
        kept = [index for index, char in enumerate(self.text) if not drop(char)]
        return Mapped("".join(self.text[index] for index in kept), tuple(self.starts[index] for index in kept),
                      tuple(self.ends[index] for index in kept))


def source_text(text: str) -> Mapped:
    """The caller's input, NFKC-normalised with every line break as "\\n"; control characters refused."""
    for position, char in enumerate(text):
        category = unicodedata.category(char)
        if (category == "Cc" and char not in _ALLOWED_CONTROLS) or category == "Cs":
            raise TextError(f"input contains a control character (U+{ord(char):04X}) at position {position}")
    if unicodedata.is_normalized("NFKC", text) and not any(char in text for char in "\r\u2028\u2029"):
        return Mapped(text, tuple(range(len(text))), tuple(range(1, len(text) + 1)))
    parts, starts, ends = [], [], []
    for start, end in _clusters(text):
        cluster = text[start:end]
        normal = _LINE_BREAKS.get(cluster) or unicodedata.normalize("NFKC", cluster)
        parts.append(normal)
        starts.extend([start] * len(normal))
        ends.extend([end] * len(normal))
    return Mapped("".join(parts), tuple(starts), tuple(ends))


def _clusters(text: str):
    """(start, end) of each character with the combining marks that follow it; "\\r\\n" is one."""
    start = 0
    for index in range(1, len(text) + 1):
        if index < len(text):
            char = text[index]
            if unicodedata.combining(char) or (char == "\n" and index - 1 == start and text[start] == "\r"):
                continue
        yield start, index
        start = index
