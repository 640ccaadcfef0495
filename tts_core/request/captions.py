"""Word timestamps: when each word of the caller's input is spoken, and subtitles made of them.

An engine that times words (Capabilities.times_words) says which word of a chunk each token speaks and how
many samples each token spans; the scheduler numbers the words across their passage (QueuedItem.word_ids). An
engine that does not has its words found in its audio once it is made (aligned or estimated: QueuedItem.said,
tts_core.audio.word_timing). Here those times are carried back through the front end's pieces to the caller's
input: spoken words that say one written thing ("five dollars" for "$5", the words of an SSML <sub> alias) make
one caption word, named as the caller wrote it.
"""

from __future__ import annotations

import bisect
import html
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from ..audio.word_timing import NATIVE, WAYS, combined
from ..engines.base import word_spans
from ..engines.contract import EngineOutput
from ..scheduler.records import QueuedItem
from ..text.chunks import SENTENCE_ENDS, word_bounds
from ..text.frontend import SpokenText
from ..text.frontend.english_words import TITLES
from ..text.frontend.pieces import PRONUNCIATION, TEXT
from ..text.pronunciation import Pronounced
from .script import Script

SUBTITLE_TYPES = {"srt": "application/x-subrip", "vtt": "text/vtt"}  # their media types (text/: utf-8)
SUBTITLE_FORMATS = tuple(SUBTITLE_TYPES)
CUE_MAX_CHARS = 42  # a subtitle line, as broadcasters keep it
CUE_MAX_S = 5.0
CUE_GAP_S = 0.6  # a pause this long starts a new cue
CLOSING_QUOTES = "\"'”’»)"
# Punctuation a subtitle keeps beside a word, as written: sentence and clause marks and quotes. Not brackets,
# asterisks or underscores, which in the input are as often markdown or SSML as text.
PUNCTUATION_AFTER = ".,;:!?…\"'”’»"
PUNCTUATION_BEFORE = "\"'“‘«¿¡"


@dataclass(frozen=True)
class CaptionWord:
    word: str
    start: float  # seconds from the start of the audio
    end: float
    input_start: int  # input[input_start:input_end] is what it names
    input_end: int
    speaker: str | None = None  # a dialogue's: who says it
    shown: str = ""  # the word with the punctuation written beside it, as subtitles show it ("there.")
    timing: str = NATIVE  # how its time was found: native, aligned or estimated (tts_core.audio.word_timing)

    def as_json(self) -> dict:
        said = {"word": self.word, "start": round(self.start, 3), "end": round(self.end, 3)}
        return said if self.speaker is None else {**said, "speaker": self.speaker}


class Timed(NamedTuple):
    passage: int
    word: int  # the spoken word of the passage
    start: float  # seconds in the answer
    end: float
    way: str = NATIVE  # how it was timed (tts_core.audio.word_timing)


def timed_words(item: QueuedItem, output: EngineOutput, start_s: float, audio_rate: int | None = None) -> list[Timed]:
    """The item's words with their times, its speech starting at start_s in the answer: from its output's token
    spans, or (an engine that does not time words) found in its audio, at audio_rate (None: its engine's)."""
    if item.said is not None:
        said = item.said
        timing = said.timer.time_words(said.words, output.audio, audio_rate or item.sample_rate, said.language)
        return [Timed(item.passage, said.first + index, start_s + start, start_s + end, timing.way)
                for index, (start, end) in enumerate(timing.spans)]
    if item.word_ids is None or output.token_samples is None:
        return []
    rate = item.sample_rate
    return [Timed(item.passage, word, start_s + first / rate, start_s + end / rate)
            for word, (first, end) in word_spans(item.word_ids, output.token_samples).items()]


def caption_words(script: Script, text: str, timed: list[Timed]) -> list[CaptionWord]:
    """The caller's words (of `text`, the input as sent) with when they are spoken, in order."""
    layouts: dict[int, _Layout] = {}
    captions: list[CaptionWord] = []
    for passage, word, start, end, way in (Timed(*each) for each in timed):  # (a plain 4-tuple is native)
        layout = layouts.get(passage) or layouts.setdefault(passage, _Layout(script.passages[passage].spoken, text))
        span = layout.source_span(word)
        if span is None:
            continue
        last = captions[-1] if captions else None
        if last is not None and span[0] <= last.input_end and last.input_start < span[1]:
            # the same written word, or one written with no space after the last ("H2O" says "H two O")
            span = min(span[0], last.input_start), max(span[1], last.input_end)
            start, end = last.start, max(end, last.end)
            way = max(way, last.timing, key=WAYS.index)
            captions.pop()
        captions.append(CaptionWord(layout.written.get(span) or _written(text[span[0]:span[1]]), start, end, *span,
                                    timing=way))
    return _punctuated(text, [caption for caption in captions if caption.word])


def word_timings(words: Sequence[CaptionWord]) -> str | None:
    """How an answer's words were timed, as its `word_timings` field and X-Chorus-Word-Timings header say it."""
    return combined([word.timing for word in words])


def _punctuated(text: str, captions: list[CaptionWord]) -> list[CaptionWord]:
    """Each word with the punctuation written right before and after it in the input, inside its span ("7:45
    pm." is one thing said) or beside it; a mark goes to the word before it where two words share it."""
    shown, taken = [], 0
    for caption in captions:
        first, stop = caption.input_start, caption.input_end
        inside = html.unescape(text[first:stop])  # "&amp;" is "&", not a word before a ";"
        while first > taken and text[first - 1] in PUNCTUATION_BEFORE:
            first -= 1
        while stop < len(text) and text[stop] in PUNCTUATION_AFTER:
            stop += 1
        taken = max(taken, stop)
        before = text[first:caption.input_start] + inside[:len(inside) - len(inside.lstrip(PUNCTUATION_BEFORE))]
        after = inside[len(inside.rstrip(PUNCTUATION_AFTER)):] + text[caption.input_end:stop]
        shown.append(replace(caption, shown=before + caption.word + after))
    return shown


class _Layout:
    """Where each word of a passage's spoken text came from in the input."""

    def __init__(self, spoken: SpokenText, text: str):
        self.text = text
        self.words = word_bounds(spoken.text)
        self.pieces = spoken.pieces
        # a pronunciation is named by its word, not by its markup: [Worcester](/ˈwʊstər/) is "Worcester"
        self.written = {(piece.start, piece.end): Pronounced.read(piece.spoken).word
                        for piece in spoken.pieces if piece.kind == PRONUNCIATION}
        self._found: dict[int, list[tuple[tuple[int, int], tuple[int, int] | None]]] = {}
        self.offsets, at = [], 0
        for piece in spoken.pieces:
            self.offsets.append(at)
            at += len(piece.spoken)

    def source_span(self, word: int) -> tuple[int, int] | None:
        if not 0 <= word < len(self.words):
            return None
        first, stop = self.words[word]
        spans = []
        for index in range(max(0, bisect.bisect_right(self.offsets, first) - 1), len(self.pieces)):
            offset, piece = self.offsets[index], self.pieces[index]
            if offset >= stop:
                break
            end = offset + len(piece.spoken)
            if piece.end > piece.start and end > first:
                spans.append(self._in_piece(index, max(first, offset) - offset, min(stop, end) - offset))
        spans = [span for span in spans if span is not None]
        return (min(span[0] for span in spans), max(span[1] for span in spans)) if spans else None

    def _in_piece(self, index: int, first: int, stop: int) -> tuple[int, int] | None:
        """The input a stretch of a piece's spoken text names: in the caller's own text (a TEXT piece),
        the written words it says; elsewhere the whole of what the piece says."""
        piece = self.pieces[index]
        if not piece.spoken[first:stop].strip():
            return None
        if piece.kind != TEXT:
            return piece.start, piece.end
        spans = [span for (start, end), span in self._written_words(index) if start < stop and first < end]
        if not spans:
            return None
        if None in spans:  # a word not found as written (an entity, a character NFKC changed): the whole piece
            return piece.start, piece.end
        return piece.start + spans[0][0], piece.start + spans[-1][1]

    def _written_words(self, index: int) -> list[tuple[tuple[int, int], tuple[int, int] | None]]:
        """Each word of a TEXT piece's spoken text (its bounds there) with where it is in the input (relative
        to the piece), found in order; None for one that is not there as written. A markup tag beside a word
        is not part of it. Worked out once a piece: every word of a long piece asks."""
        if index not in self._found:
            piece = self.pieces[index]
            written, cursor, found = self.text[piece.start:piece.end], 0, []
            for start, end in word_bounds(piece.spoken):
                word = _written(piece.spoken[start:end])  # without its punctuation, which markup may come before
                at = written.find(word, cursor)
                found.append(((start, end), None if at < 0 else (at, at + len(word))))
                cursor = cursor if at < 0 else at + len(word)
            self._found[index] = found
        return self._found[index]


def _written(text: str) -> str:
    """A caption word as the caller wrote it: entities read, white space single, no punctuation at its edges."""
    text = " ".join(html.unescape(text).split())
    edges = [index for index, char in enumerate(text) if not unicodedata.category(char).startswith("P")]
    return text[edges[0]:edges[-1] + 1] if edges else text


# --- subtitles --------------------------------------------------------------------------------------

def every_subtitle(words: list[CaptionWord]) -> dict[str, str]:
    """The words' cues in each subtitle format, by format: what a take or a job keeps."""
    return {kind: subtitles(words, kind) for kind in SUBTITLE_FORMATS}


def subtitles(words: list[CaptionWord], kind: str) -> str:
    """SubRip ("srt") or WebVTT ("vtt") cues of the words, with their punctuation: a cue is at most a line of
    CUE_MAX_CHARS and CUE_MAX_S long, never spans a sentence's end, and a pause of CUE_GAP_S starts a new one. A
    dialogue's words start a cue where the speaker changes, labelled with who speaks ("Ann: " in SubRip, WebVTT's
    voice tag <v Ann>)."""
    cues: list[list[CaptionWord]] = []
    for word in words:
        cue = cues[-1] if cues else None
        if cue is None or _starts_cue(cue, word):
            cues.append([word])
        else:
            cue.append(word)
    separator = "," if kind == "srt" else "."
    escape = (lambda text: html.escape(text, quote=False)) if kind == "vtt" else str  # WebVTT cue text is markup
    blocks = [f"{_stamp(cue[0].start, separator)} --> {_stamp(cue[-1].end, separator)}\n"
              f"{_label(cue[0].speaker, kind)}{escape(' '.join(_shown(word) for word in cue))}\n" for cue in cues]
    if kind == "srt":
        return "\n".join(f"{number}\n{block}" for number, block in enumerate(blocks, 1))
    return "WEBVTT\n\n" + "\n".join(blocks)


def _starts_cue(cue: list[CaptionWord], word: CaptionWord) -> bool:
    """Whether the word starts a cue of its own after `cue`: another speaker, a pause, a sentence ended, or the
    cue full."""
    return (word.speaker != cue[-1].speaker or word.start - cue[-1].end >= CUE_GAP_S
            or _ends_sentence(cue[-1], word) or word.end - cue[0].start > CUE_MAX_S
            or sum(len(_shown(each)) + 1 for each in cue) + len(_shown(word)) > CUE_MAX_CHARS)


def _ends_sentence(word: CaptionWord, following: CaptionWord) -> bool:
    """Whether a sentence ends after the word: its mark (".", "?", "!", "…", a quote after it allowed) before a
    word that does not start in lower case, and not a title's ("Mr. Smith") or an abbreviation's ("e.g. these")."""
    shown = _shown(word).rstrip(CLOSING_QUOTES)
    return (bool(shown) and shown[-1] in SENTENCE_ENDS and word.word not in TITLES
            and not _shown(following).lstrip(PUNCTUATION_BEFORE)[:1].islower())


def _label(speaker: str | None, kind: str) -> str:
    if speaker is None:
        return ""
    speaker = _plain(speaker)
    if kind == "srt":
        return f"{speaker}: "
    return f"<v {html.escape(speaker.replace('>', ' '), quote=False)}>"  # a voice tag's name ends at ">"


def _shown(word: CaptionWord) -> str:
    return _plain(word.shown or word.word)


def _plain(text: str) -> str:
    """Text that cannot break a cue in either format: no control character (a NUL, a line break ends or forges a
    cue), no "-->" (a cue's timing line); a request's speaker names are refused with those already."""
    text = "".join(" " if unicodedata.category(char) in ("Cc", "Zl", "Zp") else char for char in text)
    while "-->" in text:
        text = text.replace("-->", "->")
    return text


def _stamp(seconds: float, separator: str) -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    return f"{hours:02d}:{minutes:02d}:{millis // 1000:02d}{separator}{millis % 1000:03d}"
