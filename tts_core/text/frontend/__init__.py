"""The text front end: from what a caller wrote to what a voice is given to say.

    normalize_text(text, language, options) -> SpokenText

1. The input is checked (no control characters) and NFKC-normalised, keeping a map back to it (mapped.py).
2. Markdown and HTML are read as a listener needs them (markup.py), emoji left out: any language.
3. The language's rules say numbers, money, dates, units, symbols and addresses as words. A language
   plugs in by adding its `verbalize` to LANGUAGES; one without rules gets its text as written.
   Before that, the operator's lexicon (tts_core.text.lexicon) turns the phrases it knows into pronunciations,
   as an inline `[word](/IPA/)` is: each is written into the spoken text as one marked span
   (tts_core.text.pronunciation) that the voice's engine says as it can.
4. The pieces are tidied and joined (pieces.py); each names the slice of the input it speaks.

With options.normalize false only step 1, the lexicon and the tidying run: the text is spoken as written.
SSML (ssml.py) is read into passages of parts instead of step 2; each passage's parts go through 3 and 4.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...errors import ErrorCode
from ..chunks import SENTENCE_ENDS, TextError
from ..lexicon import Lexicon, language_code
from ..pronunciation import Pronounced
from . import english
from .mapped import Mapped, source_text
from .markup import CELL, LINE, SENTENCE, Break, Override, drop_emoji, markdown_parts
from .options import NormalizationOptions, requested
from .pieces import BREAK, PRONUNCIATION, Piece, SpokenText, as_written, piece_of, tidy
from .scripts import foreign_scripts, foreign_to, script_name
from .ssml import Part, SayAs

__all__ = ["LANGUAGES", "NormalizationOptions", "Piece", "SpokenText", "UnspeakableScript", "normalize_text",
           "nothing_to_say", "requested", "says_something", "spoken_parts"]


@dataclass(frozen=True)
class Language:
    verbalize: Callable[[Mapped, NormalizationOptions], list[Piece]]  # numbers, symbols, ... as words
    say_as: Callable[[str, str, str | None], str | None]  # SSML <say-as>: (written, interpret_as, format)


def _as_written(text: Mapped, options: NormalizationOptions) -> list[Piece]:
    return as_written(text)


def _spelt(written: str, interpret_as: str, _format: str | None) -> str | None:
    """<say-as> where a language has no rules: letters one by one; anything else as written."""
    return " ".join(char for char in written if char.isalnum()) if interpret_as in ("characters", "spell-out") else None


LANGUAGES: dict[str, Language] = {"en": Language(english.verbalize, english.say_as)}  # by code: "en_US" is "en"
_NO_RULES = Language(_as_written, _spelt)

_PUNCTUATION = frozenset(SENTENCE_ENDS | set(",;:"))


_EMPTY = Lexicon()


def normalize_text(text: str, language: str, options: NormalizationOptions = NormalizationOptions(),
                   lexicon: Lexicon = _EMPTY) -> SpokenText:
    """What to say for `text` in a voice of `language` ("en_US", "en-us", "fr"): the spoken text and
    its pieces. Raises TextError for control characters, or when nothing is left to say."""
    source = source_text(text)
    parts = markdown_parts(source) if options.normalize and options.markdown_normalization else [source]
    spoken = spoken_parts(parts, language, options, lexicon)
    if not says_something(spoken.text):
        raise nothing_to_say(text, language)
    return spoken


def says_something(spoken: str) -> bool:
    """Whether a spoken text has a word or a number in it (punctuation alone says nothing)."""
    return any(char.isalnum() for char in spoken)


class UnspeakableScript(TextError):
    """Nothing is left to say once the letters of scripts the voice's language is not written in are left out."""

    def __init__(self, language: str, scripts: set[str]):
        self.scripts = scripts
        self.written_in = f"input is written in {', '.join(sorted(script_name(script) for script in scripts))}"
        super().__init__(f"{self.written_in}, which a voice of language {language} cannot speak",
                         ErrorCode.UNSUPPORTED_SCRIPT)


def nothing_to_say(text: str, language: str) -> TextError:
    """Why a text (plain, or an SSML document's) gives a voice of `language` nothing to say."""
    if not text.strip():
        return TextError("input is empty", ErrorCode.EMPTY_INPUT)
    if scripts := foreign_scripts(text, language):
        return UnspeakableScript(language, scripts)
    return TextError("input has nothing to speak once normalised (markup, code and emoji are not read)",
                     ErrorCode.EMPTY_INPUT)


def spoken_parts(parts: list[Part], language: str, options: NormalizationOptions = NormalizationOptions(),
                 lexicon: Lexicon = _EMPTY) -> SpokenText:
    """What a text's parts say (plain text's, markdown's, an SSML passage's); may be empty. With
    options.normalize false the text is said as written, but for pronunciations and <say-as>."""
    rules = LANGUAGES.get(language_code(language), _NO_RULES)
    verbalize = rules.verbalize if options.normalize else _as_written
    drop = options.normalize and options.emoji_normalization
    foreign = foreign_to(language)  # always left out: a voice reads them, if at all, as their names
    pieces: list[Piece] = []
    run: list[Mapped] = []  # text parts next to each other are read as one (a rule may span them: "$**5**")
    for part in [*parts, None]:
        if isinstance(part, Mapped):
            run.append(part)
            continue
        if run:
            text = Mapped.join(run)
            text = text.without(foreign) if foreign else text
            for found in _looked_up(drop_emoji(text) if drop else text, language, lexicon):
                pieces.extend(verbalize(found, options) if isinstance(found, Mapped) else [_pronounced(found)])
            run = []
        if isinstance(part, Override):
            pieces.append(_pronounced(part))
        elif isinstance(part, Break):
            pieces.append(_break(part, pieces))
        elif isinstance(part, SayAs):
            said = rules.say_as(part.text.text, part.interpret_as, part.format)
            pieces.extend(as_written(part.text) if said is None else
                          [piece_of(part.text, 0, len(part.text), said)])
    return tidy(pieces)


def _looked_up(text: Mapped, language: str, lexicon: Lexicon) -> list[Mapped | Override]:
    """The text with each phrase the lexicon has for the language as an Override."""
    parts: list[Mapped | Override] = []
    at = 0
    for start, end, entry in lexicon.matches(language, text.text):
        if start > at:
            parts.append(text.slice(at, start))
        parts.append(Override(*text.span(start, end), text.text[start:end], entry.ipa, entry.respelling))
        at = end
    if at < len(text):
        parts.append(text.slice(at, len(text)))
    return parts


def _pronounced(override: Override) -> Piece:
    marked = Pronounced(override.word, override.ipa, override.respelling).marked()
    return Piece(override.start, override.end, marked, PRONUNCIATION, override.ipa, override.respelling)


def _break(part: Break, before: list[Piece]) -> Piece:
    """A line break; a table cell's comma; a sentence's end: a period and a line break. No comma or
    period after punctuation, or where nothing was said since the last break (an empty cell)."""
    last = next((piece for piece in reversed(before) if piece.kind == BREAK or piece.spoken.strip()), None)
    said = last is not None and last.kind != BREAK and last.spoken.rstrip()[-1] not in _PUNCTUATION
    spoken = {LINE: "\n", CELL: ", " if said else " ", SENTENCE: ".\n" if said else "\n"}[part.kind]
    return Piece(part.position, part.position, spoken, BREAK)
