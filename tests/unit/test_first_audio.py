"""A stream's first piece is queued as soon as its first sentence is read, and synthesized while the rest of its
text is read (issue 45): event-based, on a fake engine. The whole text's reading still decides every refusal and
whether that piece is its first; a file and a stream are assembled by the same code, so they are the same audio."""

import asyncio
import threading

import numpy as np
import pytest

from tests.fakes import FakeEngine
from tests.serve import wait_until
from tts_core.config import Settings
from tts_core.errors import ErrorCode, InvalidRequest
from tts_core.ops.metrics import Metrics
from tts_core.request.ask import Ask
from tts_core.service import SpeechService
from tts_core.text.chunks import leading_sentence
from tts_core.text.lexicon import Lexicon

FIRST, REST = "One two.", " Three four five. Six seven eight nine."
PATIENCE_S = 10  # only a broken pipeline waits this long: the first piece's audio never came


class FirstSynthesized(FakeEngine):
    """Notes when it first synthesizes once watched (`first`)."""

    def __init__(self):
        super().__init__()
        self.first, self.watched = threading.Event(), False

    def watch(self) -> None:
        self.first.clear()
        self.watched = True

    def synthesize(self, batch):
        self.first.set()
        return super().synthesize(batch)


class WaitingEngine(FirstSynthesized):
    """Tokenizes any sentence but the first only once the first piece has been synthesized (or PATIENCE_S on)."""

    def __init__(self):
        super().__init__()
        self.later_waited: list[bool] = []  # for each later sentence: whether the first piece's audio came first

    def tokenize(self, text, voice):
        if self.watched and text != FIRST:
            self.later_waited.append(self.first.wait(PATIENCE_S))
        return super().tokenize(text, voice)


class WaitingLexicon(Lexicon):
    """The operator's lexicon, which the front end looks every text up in: the rest of the text is looked up only
    once the first piece has been synthesized (or PATIENCE_S on)."""

    def __init__(self, first: threading.Event):
        super().__init__()
        self.first, self.later_waited = first, []

    def matches(self, language, text):
        if "Three" in text:
            self.later_waited.append(self.first.wait(PATIENCE_S))
        return super().matches(language, text)


def started(engine: FakeEngine, **settings) -> SpeechService:
    service = SpeechService(Settings(batch_policy="sequential", **settings), [engine], Metrics())
    service.start()
    assert service.loops[engine.name].calibrated.wait(10)  # warm-up synthesizes: before the test watches
    return service


async def streamed(service: SpeechService, text: str) -> np.ndarray:
    stream = await service.answer(Ask(text, stream=True))
    return np.concatenate([piece async for piece in stream])


def test_the_first_piece_is_synthesized_before_the_later_sentences_are_tokenized():
    engine = WaitingEngine()
    service = started(engine)
    try:
        engine.watch()
        audio = asyncio.run(streamed(service, FIRST + REST))
    finally:
        service.stop()
    assert engine.later_waited == [True, True]  # the first piece's audio came before either was tokenized
    assert audio.size == asyncio.run(_whole(FIRST + REST)).size


def test_the_first_piece_is_synthesized_before_the_rest_of_the_text_goes_through_the_front_end():
    engine = FirstSynthesized()
    service = started(engine)
    service.admission.lexicon = WaitingLexicon(engine.first)
    try:
        engine.watch()
        asyncio.run(streamed(service, FIRST + REST))
    finally:
        service.stop()
    assert service.admission.lexicon.later_waited == [True]  # the whole text was read after the first piece's audio


async def _whole(text: str) -> np.ndarray:
    service = started(FakeEngine())
    try:
        return (await service.synthesize(Ask(text))).audio
    finally:
        service.stop()


@pytest.mark.parametrize("text", [
    FIRST + REST,  # the piece read ahead is the text's first
    "Dr. Smith went home. He slept well.",  # "Dr." alone reads "Doctor.": the whole text's first piece is another
    "Hi. Yes. No. " + "A long sentence, cut by the stream at its clauses, goes on. " * 3,
])
def test_a_stream_is_its_file_sample_for_sample(text):
    """The file is the stream's pieces joined, whether the piece read ahead was the text's first or not."""
    service = started(FakeEngine())
    try:
        stream_audio = asyncio.run(streamed(service, text))
        file_audio = asyncio.run(service.synthesize(Ask(text))).audio
    finally:
        service.stop()
    assert np.array_equal(stream_audio, file_audio)


def test_a_refusal_that_needs_the_whole_text_read_still_comes_before_any_audio_and_leaves_nothing_queued():
    engine = FakeEngine()
    service = started(engine, max_spoken_chars=100)
    engine.gate.clear()  # the piece read ahead stays queued or running while the whole text is read
    try:
        with pytest.raises(InvalidRequest) as raised:
            text = FIRST + " The total was 1234567 and 7654321 and 9999999 dollars."
            asyncio.run(service.answer(Ask(text, stream=True)))
        assert raised.value.code == ErrorCode.SPOKEN_TEXT_ABOVE_MAX_LENGTH
        engine.gate.set()
        assert wait_until(lambda: service.queue_length() == 0 and not service.metrics.window()["running_items"])
    finally:
        engine.gate.set()
        service.stop()


class CountingLexicon(Lexicon):
    """The operator's lexicon, which the front end looks every text up in: counts the look-ups."""

    looked_up = 0

    def matches(self, language, text):
        self.looked_up += 1
        return super().matches(language, text)


def test_refusals_that_need_no_reading_come_before_the_front_end_reads_any_of_the_text():
    """A speed out of range is refused on the request as sent, however long its text: the front end never reads
    it."""
    service = started(FakeEngine())
    service.admission.lexicon = lexicon = CountingLexicon()
    try:
        for stream in (True, False):  # a stream, a file
            with pytest.raises(InvalidRequest) as raised:
                asyncio.run(service.answer(Ask(FIRST + REST, speed=9.0, words=True, stream=stream)))
            assert raised.value.param == "speed"
    finally:
        service.stop()
    assert lexicon.looked_up == 0


def test_the_first_sentence_is_cut_where_one_ends_before_the_text_does():
    assert leading_sentence("One two. Three.") == "One two."
    assert leading_sentence("A heading\nand a line.") == "A heading\n"
    assert leading_sentence("One sentence only.") is None
    assert leading_sentence("3.14 is pi") is None  # an end is followed by white space
    assert leading_sentence("\n\nOne. Two.") == "\n\nOne."  # nothing before a line end is no sentence
