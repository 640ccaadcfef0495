"""An SSML subset, read into passages the rest of the front end says (one voice and rate each, a
pause before each).

    <speak> <break time|strength> <prosody rate> <say-as interpret-as format> <phoneme alphabet="ipa" ph>
    <sub alias> <voice name> <p> <s>

Other elements are dropped and their text kept (<emphasis>, <lang>, <mark>, ...); other attributes
are ignored (pitch, volume). Parsed by expat, safely: a document type (and with it every entity but
XML's five) is refused, nesting is capped, and the input's length is the caller's text limit. Every
character of text keeps its place in the caller's input (through entities, CDATA and line breaks),
so captions name the caller's words; every error says where it is, as "line L, column C".
"""

from __future__ import annotations

import re
import xml.parsers.expat as expat
from dataclasses import dataclass, field

from ...errors import ErrorCode
from ..chunks import TextError
from .mapped import Mapped, source_text
from .markup import SENTENCE, Break, Override

MAX_DEPTH = 32
MAX_BREAK_S = 10.0  # one break
MAX_BREAKS_S = 60.0  # all the breaks of one input
BREAK_STRENGTHS = {"none": 0.0, "x-weak": 0.1, "weak": 0.25, "medium": 0.4, "strong": 0.7, "x-strong": 1.0}
RATES = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "default": 1.0, "fast": 1.25, "x-fast": 1.75}
SAY_AS = frozenset({"characters", "spell-out", "cardinal", "number", "ordinal", "date", "telephone"})
_TIME = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*")  # a fixed pattern, linear
_RATE = re.compile(r"\s*([+-]?\d+(?:\.\d+)?)\s*(%?)\s*")


class SsmlError(TextError):
    code = ErrorCode.INVALID_SSML


@dataclass(frozen=True)
class SayAs:
    """Text said as the language reads a kind of thing: a number, a date, letters one by one."""

    text: Mapped
    interpret_as: str
    format: str | None = None


Part = Mapped | Break | Override | SayAs


@dataclass
class Passage:
    """What one voice says at one rate, after a pause (None: the usual pause between sentences, or none
    at the start)."""

    voice: str | None  # None: the request's voice
    rate: float  # times the request's speed
    pause_before_s: float | None
    at: str  # where it starts, for errors about its voice or rate: "line 2, column 5"
    parts: list[Part] = field(default_factory=list)


@dataclass(frozen=True)
class Script:
    passages: tuple[Passage, ...]
    pause_after_s: float  # a break at the very end


def is_ssml(text: str) -> bool:
    """Input that starts as an SSML document (white space and an XML declaration may come first)."""
    head = text.lstrip()
    return head.startswith("<speak") or head.startswith("<?xml")


def parse(text: str) -> Script:
    """The passages of an SSML document. Raises SsmlError saying what is wrong and where."""
    if not text.lstrip().startswith("<"):
        raise SsmlError("invalid SSML at line 1, column 1: SSML starts with <speak>")
    return _Reader(text).read()


@dataclass
class _Open:
    name: str
    start: int  # the source position just after its start tag
    voice: str | None
    rate: float
    attributes: dict[str, str]
    passage: Passage | None  # the passage its content began in, and where in its parts (say-as, sub, phoneme)
    parts_from: int


class _Reader:
    def __init__(self, text: str):
        self.text = text
        source_text(text)  # refuses control characters, as for plain text
        encoded = text.encode("utf-8")
        self.char_at = [0] * (len(encoded) + 1)  # byte offset -> character index
        offset = 0
        for index, char in enumerate(text):
            width = len(char.encode("utf-8"))
            self.char_at[offset:offset + width] = [index] * width
            offset += width
        self.char_at[offset] = len(text)
        self.encoded = encoded
        self.stack: list[_Open] = []
        self.passages: list[Passage] = []
        self.pending_pause: float | None = None
        self.breaks_s = 0.0
        self.parser = expat.ParserCreate("UTF-8")
        self.parser.buffer_text = False
        self.parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        self.parser.StartDoctypeDeclHandler = self._doctype
        self.parser.EntityDeclHandler = self._doctype
        self.parser.StartElementHandler = self._start
        self.parser.EndElementHandler = self._end
        self.parser.CharacterDataHandler = self._characters
        self.in_cdata = False
        self.parser.StartCdataSectionHandler = lambda: setattr(self, "in_cdata", True)
        self.parser.EndCdataSectionHandler = lambda: setattr(self, "in_cdata", False)

    def read(self) -> Script:
        try:
            self.parser.Parse(self.encoded, True)
        except expat.ExpatError as error:
            message = expat.ErrorString(error.code)
            raise SsmlError(f"invalid SSML at line {error.lineno}, column {error.offset + 1}: {message}") from None
        passages = tuple(passage for passage in self.passages if passage.parts)
        return Script(passages, self.pending_pause or 0.0)

    # --- positions -----------------------------------------------------------------------------

    def _here(self) -> int:
        return self.char_at[self.parser.CurrentByteIndex]

    def _where(self, position: int) -> str:
        line = self.text.count("\n", 0, position) + 1
        return f"line {line}, column {position - (self.text.rfind(chr(10), 0, position) + 1) + 1}"

    def _error(self, message: str, position: int | None = None) -> SsmlError:
        return SsmlError(f"invalid SSML at {self._where(self._here() if position is None else position)}: {message}")

    # --- handlers ------------------------------------------------------------------------------

    def _doctype(self, *_args) -> None:
        raise self._error("a document type or entity declaration is not allowed")

    def _start(self, name: str, attributes: dict[str, str]) -> None:
        position = self._here()
        if not self.stack and name != "speak":
            raise self._error(f"the root element must be <speak>, not <{name}>", position)
        if len(self.stack) >= MAX_DEPTH:
            raise self._error(f"elements are nested more than {MAX_DEPTH} deep", position)
        outer = self.stack[-1] if self.stack else None
        voice, rate = (outer.voice, outer.rate) if outer else (None, 1.0)
        if name == "voice":
            voice = attributes.get("name") or voice
        elif name == "prosody" and "rate" in attributes:
            rate *= self._rate(attributes["rate"], position)
        elif name == "break":
            self._pause(self._break_s(attributes, position), position)
        elif name in ("p", "s"):
            self._sentence_end(position)
        elif name == "say-as":
            kind = attributes.get("interpret-as", "")
            if kind not in SAY_AS:
                raise self._error(f"<say-as interpret-as={kind!r}> is not supported; use one of "
                                  f"{', '.join(sorted(SAY_AS))}", position)
        elif name == "phoneme":
            if attributes.get("alphabet", "ipa") != "ipa":
                raise self._error(f"<phoneme alphabet={attributes['alphabet']!r}> is not supported; use \"ipa\"",
                                  position)
            if not attributes.get("ph", "").strip():
                raise self._error("<phoneme> needs a ph attribute (its IPA)", position)
        elif name == "sub" and "alias" not in attributes:
            raise self._error("<sub> needs an alias attribute", position)
        end_of_tag = self.char_at[self.parser.CurrentByteIndex + self._tag_length()]
        current = self.passages[-1] if self.passages else None
        self.stack.append(_Open(name, end_of_tag, voice, rate, attributes, current,
                                len(current.parts) if current else 0))

    def _tag_length(self) -> int:
        """The length in bytes of the start tag being read (expat tells where it starts, not its end)."""
        at = self.parser.CurrentByteIndex
        quote, index = None, at
        while index < len(self.encoded):
            byte = self.encoded[index:index + 1]
            if quote:
                quote = None if byte == quote else quote
            elif byte in (b'"', b"'"):
                quote = byte
            elif byte == b">":
                return index + 1 - at
            index += 1
        return len(self.encoded) - at

    def _end(self, name: str) -> None:
        opened = self.stack.pop()
        position = self._here()
        if name not in ("say-as", "sub", "phoneme"):
            if name in ("p", "s"):
                self._sentence_end(position)
            return
        passage = self._passage(position)
        parts_from = opened.parts_from if passage is opened.passage else 0
        content = passage.parts[parts_from:]
        del passage.parts[parts_from:]
        if name == "say-as":
            text = Mapped.join([part for part in content if isinstance(part, Mapped)])
            if len(text.text.strip()):
                passage.parts.append(SayAs(text, opened.attributes["interpret-as"], opened.attributes.get("format")))
        elif name == "sub":
            alias = opened.attributes["alias"]
            if alias.strip():
                passage.parts.append(Mapped(alias, (opened.start,) * len(alias), (position,) * len(alias)))
        else:
            word = "".join(part.text for part in content if isinstance(part, Mapped)).strip()
            passage.parts.append(Override(opened.start, position, word or opened.attributes["ph"],
                                          opened.attributes["ph"].strip()))

    def _characters(self, data: str) -> None:
        position = self._here()
        if not self.stack:
            return
        self._passage(position).parts.append(self._mapped(data, position))

    def _mapped(self, data: str, position: int) -> Mapped:
        """data, which expat read at `position`, NFKC-normalised, with each character's place in the input:
        an entity or character reference maps whole, a line break expat made of "\\r\\n" to both."""
        text = self.text
        if text.startswith("&", position) and not self.in_cdata:  # XML text has no other "&"
            end = text.find(";", position) + 1
            return Mapped(data, (position,) * len(data), (end,) * len(data))
        starts, ends, at = [], [], position
        for char in data:
            end = at + (2 if text.startswith("\r\n", at) else 1) if char == "\n" else at + 1
            starts.append(at)
            ends.append(end)
            at = end
        normal = source_text(data)  # positions in data
        return Mapped(normal.text, tuple(starts[index] for index in normal.starts),
                      tuple(ends[index - 1] for index in normal.ends))

    # --- passages ------------------------------------------------------------------------------

    def _passage(self, position: int) -> Passage:
        """The passage text goes to now: a new one after a break or when the voice or rate changes."""
        voice, rate = (self.stack[-1].voice, self.stack[-1].rate) if self.stack else (None, 1.0)
        last = self.passages[-1] if self.passages else None
        if last is None or self.pending_pause is not None or (last.voice, last.rate) != (voice, rate):
            last = Passage(voice, rate, self.pending_pause, self._where(position))
            self.passages.append(last)
            self.pending_pause = None
        return last

    def _pause(self, seconds: float, position: int) -> None:
        self.breaks_s += seconds
        if self.breaks_s > MAX_BREAKS_S:
            raise self._error(f"the breaks add up to more than {MAX_BREAKS_S:g} s", position)
        self.pending_pause = (self.pending_pause or 0.0) + seconds

    def _sentence_end(self, position: int) -> None:
        if self.passages and self.pending_pause is None:
            self.passages[-1].parts.append(Break(position, SENTENCE))

    def _break_s(self, attributes: dict[str, str], position: int) -> float:
        if "time" in attributes:
            found = _TIME.fullmatch(attributes["time"])
            if not found:
                raise self._error(f"<break time={attributes['time']!r}>: write it as 500ms or 1.5s", position)
            seconds = float(found[1]) / (1000 if found[2] == "ms" else 1)
            if seconds > MAX_BREAK_S:
                raise self._error(f"<break time={attributes['time']!r}> is longer than {MAX_BREAK_S:g} s", position)
            return seconds
        strength = attributes.get("strength", "medium")
        if strength not in BREAK_STRENGTHS:
            raise self._error(f"<break strength={strength!r}>: use one of {', '.join(BREAK_STRENGTHS)}", position)
        return BREAK_STRENGTHS[strength]

    def _rate(self, written: str, position: int) -> float:
        if written in RATES:
            return RATES[written]
        found = _RATE.fullmatch(written)
        if found:
            value = float(found[1])
            rate = (1 + value / 100 if found[1][0] in "+-" else value / 100) if found[2] else value
            if rate > 0:
                return rate
        raise self._error(f"<prosody rate={written!r}>: use {', '.join(RATES)}, a percentage (80%, +10%) or "
                          "a multiple (1.2)", position)
