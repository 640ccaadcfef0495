"""Pronunciations inside the text a voice is given: a word (or phrase) with the IPA and/or respelling
it is said with, from an inline override `[Worcester](/ˈwʊstər/)` or the operator's lexicon.

The front end writes each one into the spoken text as one marked span, so that it travels with the
text through chunk splitting (which never cuts inside one) to the engine's `tokenize`, which says it
as the engine can: a phoneme-driven voice (Piper) speaks the IPA, a character-driven one the
respelling, and any voice the word itself when it has nothing better. The marks are control
characters, which the front end refuses in callers' input, so a caller cannot forge one.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN, FIELD, CLOSE = "\x0e", "\x10", "\x0f"  # none of them is white space (str.isspace), unlike \x1c-\x1f


@dataclass(frozen=True)
class Pronounced:
    word: str  # as written in the text
    ipa: str | None = None
    respelling: str | None = None

    def marked(self) -> str:
        return f"{OPEN}{self.word}{FIELD}{self.ipa or ''}{FIELD}{self.respelling or ''}{CLOSE}"

    @property
    def as_text(self) -> str:
        """What a voice that reads characters says: the respelling if there is one, else the word."""
        return self.respelling or self.word


    @staticmethod
    def read(marked: str) -> Pronounced:
        """The pronunciation a marked span (one from `marked`, white space around it allowed) holds."""
        word, ipa, respelling = (marked.strip().strip(OPEN + CLOSE).split(FIELD) + ["", ""])[:3]
        return Pronounced(word, ipa or None, respelling or None)


def split_marked(text: str) -> list[str | Pronounced]:
    """The text's plain runs and its pronunciations, in order (one scan)."""
    parts: list[str | Pronounced] = []
    at = 0
    while (opening := text.find(OPEN, at)) >= 0:
        closing = text.find(CLOSE, opening)
        if closing < 0:
            break
        if opening > at:
            parts.append(text[at:opening])
        parts.append(Pronounced.read(text[opening:closing + 1]))
        at = closing + 1
    if at < len(text):
        parts.append(text[at:])
    return parts


def as_text(text: str) -> str:
    """The text with each pronunciation said as text (respelling, else the word): for voices that read
    characters or words, not phonemes."""
    if OPEN not in text:
        return text
    return "".join(part if isinstance(part, str) else part.as_text for part in split_marked(text))
