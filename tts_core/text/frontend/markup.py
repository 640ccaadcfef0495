"""Markdown, HTML and emoji read as a listener needs them, whatever the language (markdown-it-py
parses; this module only decides what is said and finds it in the source).

- Emphasis, headers' and lists' markers, tables' pipes, HTML tags: not said; their text is.
- A header, a list item and a table row end as sentences; table cells are read row by row.
- Code blocks are not read at all (a listener cannot use code read aloud); inline code is read
  as text. Indented text is a paragraph, not code: plain text indents too.
- A link reads its text; an image its description. A link to /.../ is Kokoro-FastAPI's
  pronunciation override, `[Worcester](/ˈwʊstər/)`: kept whole, as an `Override`.
- Emoji are left out (`drop_emoji`).

Each inline token's text is found in the source by a forward search from where the last one was
found, so every part keeps its place in the caller's input; the search stops for the rest of a block
if a token is not where it should be, so the work stays linear in the input's length whatever it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from markdown_it import MarkdownIt
from markdown_it.helpers import parseLinkDestination, parseLinkTitle
from markdown_it.token import Token

from .mapped import Mapped

SENTENCE, LINE, CELL = "sentence", "line", "cell"  # Break kinds

_MARKDOWN = MarkdownIt("commonmark").enable(["table", "strikethrough"]).disable("code")
_MARKDOWN.core.ruler.disable("text_join")  # escapes and entities stay tokens of their own: each is found as written
_MARKDOWN.inline.ruler2.disable("fragments_join")  # unused emphasis markers too
_EMPHASIS = frozenset({"em_open", "em_close", "strong_open", "strong_close", "s_open", "s_close"})
_EMOJI = ((0x1F000, 0x1FAFF), (0x2600, 0x27BF), (0x2B00, 0x2BFF), (0x231A, 0x231B), (0x23E9, 0x23FA),
          (0xFE0E, 0xFE0F), (0x200D, 0x200D), (0x20E3, 0x20E3), (0xE0020, 0xE007F))


@dataclass(frozen=True)
class Break:
    """A pause the layout implies at a source position: a sentence's end, a line's, a table cell's."""

    position: int
    kind: str


@dataclass(frozen=True)
class Override:
    """[word](/IPA/), or a lexicon entry's phrase: the word, said as the IPA or respelling says."""

    start: int
    end: int
    word: str
    ipa: str | None
    respelling: str | None = None


Part = Mapped | Break | Override


def is_emoji(char: str) -> bool:
    code = ord(char)
    return any(low <= code <= high for low, high in _EMOJI)


def drop_emoji(text: Mapped) -> Mapped:
    return text.without(is_emoji)


def markdown_parts(source: Mapped) -> list[Part]:
    """The source's text to read, its pauses and overrides, in order."""
    text = source.text
    line_starts = [0] + [index + 1 for index, char in enumerate(text) if char == "\n"] + [len(text)]
    parts: list[Part] = []
    cursor, in_items = 0, 0
    for token in _MARKDOWN.parse(text):
        kind = token.type
        if kind == "inline" and token.map:
            reader = _InlineReader(source, max(cursor, line_starts[token.map[0]]), line_starts[token.map[1]])
            parts.extend(reader.read(token.children or []))
            cursor = reader.cursor
        elif kind == "html_block" and token.map:
            start, end = max(cursor, line_starts[token.map[0]]), line_starts[token.map[1]]
            parts.extend(_without_tags(source, start, end))
            cursor = end
        position = source.position(cursor)
        if kind == "list_item_open":
            in_items += 1
        elif kind == "list_item_close":
            in_items -= 1
        elif kind in ("th_close", "td_close"):
            parts.append(Break(position, CELL))
        elif kind == "tr_close" or kind == "heading_close" or (kind == "paragraph_close" and in_items):
            while parts and isinstance(parts[-1], Break) and parts[-1].kind == CELL:  # a row's last cells
                parts.pop()
            parts.append(Break(position, SENTENCE))
        elif kind in ("paragraph_close", "html_block"):
            parts.append(Break(position, LINE))
    return parts


class _InlineReader:
    """Finds an inline token's children in source.text[cursor:limit], in order. Should one not be
    where it should be (markdown-it rewrote it: an escaped pipe in a table cell), the search stops
    there: the rest of the block's text maps to the source from there to the block's end."""

    def __init__(self, source: Mapped, cursor: int, limit: int):
        self.source, self.text = source, source.text
        self.cursor, self.limit = cursor, limit
        self.lost_from: int | None = None  # where the search stopped, if it did

    def read(self, children: list[Token]) -> list[Part]:
        parts: list[Part] = []
        outer: list[Part] | None = None  # inside a link: the parts before it (parts are the link's text)
        link_start = 0
        for child in children:
            kind = child.type
            if kind == "link_open":
                link_start = self.find("<" if child.markup == "autolink" else "[")
                parts, outer = [], parts
                continue
            if kind == "link_close" and outer is not None:
                inside, parts, outer = parts, outer, None
                parts.extend(self._link(child, link_start, inside))
                continue
            parts.extend(self._child(child))
        return parts

    def _child(self, child: Token) -> list[Part]:
        kind = child.type
        if kind == "text":
            return [self.take(child.content)] if child.content else []
        if kind == "text_special":  # an escape or an entity: its text stands for its markup
            return [self.take(child.markup, child.content)]
        if kind in ("softbreak", "hardbreak"):
            return [self.take("\n")]
        if kind == "code_inline":
            self.find(child.markup)
            code = self.take(child.content)
            self.find(child.markup)
            return [code]
        if kind == "html_inline":  # a tag: a space, so that the words either side stay apart
            return [self.take(child.content, " ")]
        if kind == "image":
            self.find("![")
            description = self.take(child.content)
            self.find("]")
            self._link_end()
            return [description]
        if kind in _EMPHASIS:
            self.find(child.markup)
        return []

    def _link(self, close: Token, start: int, inside: list[Part]) -> list[Part]:
        """A link's text, or its pronunciation override."""
        if close.markup == "autolink":
            self.find(">")
            return inside
        self.find("]")
        target = self._link_end()
        words = [part.text for part in inside if isinstance(part, Mapped)]
        if target and len(target) > 2 and target[0] == target[-1] == "/" and "/" not in target[1:-1] and words:
            source_start, source_end = self.source.position(start), self.source.position(self.cursor)
            return [Override(source_start, source_end, "".join(words).strip(), target[1:-1])]
        return inside

    def _link_end(self) -> str | None:
        """Past an inline link's (destination "title") if one follows, or a reference's [label];
        returns the destination as written."""
        text, at, limit = self.text, self.cursor, self.limit
        if self.lost_from is not None or at >= limit or text[at] not in "([":
            return None
        if text[at] == "[":
            self.find("]")
            return None
        destination = parseLinkDestination(text, self._skip_space(at + 1), limit)
        at = self._skip_space(destination.pos if destination.ok else at + 1)
        title = parseLinkTitle(text, at, limit)
        at = self._skip_space(title.pos if title.ok else at)
        if at < limit and text[at] == ")":
            self.cursor = at + 1
            return destination.str if destination.ok else ""
        self._lose()
        return None

    def _skip_space(self, at: int) -> int:
        while at < self.limit and self.text[at] in " \t\n":
            at += 1
        return at

    def find(self, needle: str) -> int:
        """The position of needle from the cursor on (the cursor moves past it)."""
        if self.lost_from is None:
            found = self.text.find(needle, self.cursor, self.limit)
            if found >= 0:
                self.cursor = found + len(needle)
                return found
            self._lose()
        return self.cursor

    def _lose(self) -> None:
        self.lost_from = max(0, min(self.cursor, self.limit - 1))
        self.cursor = self.limit

    def take(self, written: str, said: str | None = None) -> Mapped:
        """The source's `written` at the cursor on, as `said` (itself if None)."""
        said = written if said is None else said
        start = self.find(written)
        if self.lost_from is None:
            part = self.source.slice(start, self.cursor)
            return part if said == written else part.replaced(said, 0, len(part))
        return self.source.replaced(said, self.lost_from, max(self.limit, self.lost_from + 1))


def _without_tags(source: Mapped, start: int, end: int) -> list[Part]:
    """An HTML block's text: each tag becomes a space."""
    text, parts, at = source.text, [], start
    while at < end:
        opening = text.find("<", at, end)
        if opening < 0 or opening + 1 >= end or not (text[opening + 1].isalpha() or text[opening + 1] in "/!?"):
            stop = end if opening < 0 else opening + 1
            parts.append(source.slice(at, stop))
            at = stop
            continue
        closing = text.find(">", opening, end)
        if closing < 0:  # not a tag after all: the rest is text
            parts.append(source.slice(at, end))
            break
        parts.append(source.slice(at, opening))
        parts.append(source.slice(opening, closing + 1).replaced(" ", 0, closing + 1 - opening))
        at = closing + 1
    return [part for part in parts if len(part)]
