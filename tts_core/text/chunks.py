"""Sentence and chunk splitting of the text to speak (what the front end, tts_core.text.frontend, made).

Everything here is a single left-to-right scan (no backtracking regular expressions), so the
time taken is linear in the input length whatever the input is. A pronunciation's marked span
(tts_core.text.pronunciation) is never cut: it is one word here, whatever it holds.
"""

from __future__ import annotations

from .pronunciation import CLOSE, OPEN

SENTENCE_ENDS = frozenset(".!?…。！？")
CLAUSE_ENDS = frozenset(",;:—–)")


class TextError(ValueError):
    """The text cannot be spoken as given; the message says why, the code what kind of refusal it is."""

    code: str | None = None

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


def _split_after(text: str, ends: frozenset[str]) -> list[str]:
    """Split after each end character that is followed by white space (or the end)."""
    pieces, start, inside = [], 0, False
    for index, char in enumerate(text):
        inside = (inside or char == OPEN) and char != CLOSE
        at_boundary = not inside and (char == "\n" or (
            char in ends and (index + 1 == len(text) or text[index + 1].isspace())
        ))
        if at_boundary:
            piece = text[start : index + 1].strip()
            if piece:
                pieces.append(piece)
            start = index + 1
    tail = text[start:].strip()
    if tail:
        pieces.append(tail)
    return pieces


def complete_sentences(text: str) -> tuple[str, str]:
    """Text arriving in pieces cut after its last complete sentence: (the complete sentences, the rest).
    A sentence is complete once white space follows its end ("3." may yet become "3.14"), or at a line end."""
    cut = 0
    for index, char in enumerate(text):
        if char == "\n" or (char in SENTENCE_ENDS and index + 1 < len(text) and text[index + 1].isspace()):
            cut = index + 1
    return text[:cut], text[cut:]


def leading_sentence(text: str) -> str | None:
    """The text up to its first sentence's end (an end followed by white space, or a line end), read ahead of the
    rest where a stream's first piece is wanted soon; None if there is no such end before the text's own. Where
    the cut falls inside something read whole (markup, "Dr. Smith"), the first sentence reads otherwise alone:
    the whole text's reading is the judge of that (tts_core.scheduler.dispatch)."""
    for index, char in enumerate(text):
        at_end = char == "\n" or (char in SENTENCE_ENDS and index + 1 < len(text) and text[index + 1].isspace())
        if at_end and text[:index].strip() and text[index + 1:].strip():
            return text[:index + 1]
    return None


def words(text: str) -> list[str]:
    """text.split(), with each pronunciation's span one word."""
    return text.split() if OPEN not in text else [text[start:end] for start, end in word_bounds(text)]


def word_bounds(text: str) -> list[tuple[int, int]]:
    """(start, end) of each of words(text) in text."""
    bounds, start, inside = [], None, False
    for index, char in enumerate(text):
        inside = (inside or char == OPEN) and char != CLOSE
        if char.isspace() and not inside:
            if start is not None:
                bounds.append((start, index))
            start = None
        elif start is None:
            start = index
    if start is not None:
        bounds.append((start, len(text)))
    return bounds


def _pack_words(text: str, max_chars: int) -> list[str]:
    """Greedily pack whole words into pieces of at most max_chars (a longer word is cut, but not a
    pronunciation's span)."""
    pieces: list[str] = []
    current = ""
    for word in words(text):
        while len(word) > max_chars and OPEN not in word:
            if current:
                pieces.append(current)
                current = ""
            pieces.append(word[:max_chars])
            word = word[max_chars:]
        if not word:
            continue
        if current and len(current) + 1 + len(word) > max_chars:
            pieces.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    if current:
        pieces.append(current)
    return pieces


def _pack(pieces: list[str], max_chars: int) -> list[str]:
    """Join consecutive pieces while they fit in max_chars."""
    packed: list[str] = []
    for piece in pieces:
        if packed and len(packed[-1]) + 1 + len(piece) <= max_chars:
            packed[-1] = f"{packed[-1]} {piece}"
        else:
            packed.append(piece)
    return packed


def split_chunks(text: str, max_chars: int, most: int | None = None) -> list[str]:
    """Sentences, each at most max_chars: long sentences are split at clauses, then words. With `most`,
    neighbouring short sentences are packed into one piece (up to max_chars) until there are at most
    `most` pieces, or as few as max_chars allows: a text of many short sentences ("Yes. No. Maybe.")
    becomes a few pieces, not hundreds; a text with no more sentences than `most` is left as it is."""
    chunks: list[str] = []
    for sentence in _split_after(text, SENTENCE_ENDS):
        if len(sentence) <= max_chars:
            chunks.append(sentence)
            continue
        clauses: list[str] = []
        for clause in _split_after(sentence, CLAUSE_ENDS):
            clauses.extend([clause] if len(clause) <= max_chars else _pack_words(clause, max_chars))
        chunks.extend(_pack(clauses, max_chars))
    if most is None or len(chunks) <= most:
        return chunks
    # Greedy packing up to `size` leaves at most about 2 * len(text) / size pieces; the size grows by half
    # (a few passes, each linear) until the pieces are few enough, packing no more than it must.
    size = max(2, len(text) // most)
    while True:
        packed = _pack_sentences(chunks, min(size, max_chars))
        if len(packed) <= most or size >= max_chars:
            return packed
        size += size // 2


def _pack_sentences(sentences: list[str], max_chars: int) -> list[str]:
    """Join neighbouring sentences while they fit in max_chars. A line with no punctuation at its end (an
    item of a list) is joined with a comma, so that it keeps a pause before the next."""
    packed: list[str] = []
    for sentence in sentences:
        joiner = " " if packed and packed[-1][-1] in SENTENCE_ENDS | CLAUSE_ENDS else ", "
        if packed and len(packed[-1]) + len(joiner) + len(sentence) <= max_chars:
            packed[-1] = f"{packed[-1]}{joiner}{sentence}"
        else:
            packed.append(sentence)
    return packed


def ramp_up(chunks: list[str], first_chars: int, max_chars: int) -> list[tuple[str, bool]]:
    """For streaming: the first chunk at most first_chars long, each next one at most twice the
    one before, up to max_chars. The first audio is then ready after a short synthesis, and each
    chunk is synthesized while the shorter one before it plays. Cuts fall only where the text pauses:
    at sentences (a chunk may hold several, packed) and clauses; a first clause longer than the limit
    is one piece. Never between words: a voice says words that end an utterance slower (the stream of
    three sentences cut mid-sentence was 6% longer than their file). Each piece comes with whether it
    continues the chunk before it (a cut made here: no pause added, the clause's own is in its audio)."""
    ramped: list[tuple[str, bool]] = []
    limit = first_chars
    for chunk in chunks:
        continues = False
        while limit < max_chars and len(chunk) > limit:
            pieces = _pack(_split_after(chunk, SENTENCE_ENDS | CLAUSE_ENDS), limit)
            if len(pieces) == 1:  # nowhere to cut
                break
            ramped.append((pieces[0], continues))
            chunk, continues = " ".join(pieces[1:]), True
            limit *= 2
        ramped.append((chunk, continues))
        limit *= 2
    return ramped
