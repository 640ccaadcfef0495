"""Long texts: sentences reassembled in order, and long streams never hold up short requests."""

import asyncio
import threading
import time

import numpy as np

from tests.fakes import SAMPLES_PER_TOKEN, FakeEngine
from tts_core.config import Settings
from tts_core.engines.contract import EngineOutput
from tts_core.ops.metrics import Metrics
from tts_core.request.ask import Ask
from tts_core.service import SpeechService


class TaggingEngine(FakeEngine):
    """Each sentence's tokens start with its number (1, 2, ... in the order tokenized), so its
    audio says which it is."""

    tagged = 0

    def tokenize(self, text, voice):
        sentences = super().tokenize(text, voice)
        for tokens in sentences:
            self.tagged += 1
            tokens[0] = self.tagged
        return sentences


def running_service(engine: FakeEngine, **settings) -> SpeechService:
    service = SpeechService(Settings(batch_policy="sequential", calibration_sizes=[1], voice_aliases={},
                                     model_aliases={}, **settings), [engine],
                            Metrics())
    service.start()
    assert service.loops[engine.name].calibrated.wait(10)
    engine.seen.clear()
    return service


def piece_tag(piece: np.ndarray) -> int:
    return round(float(np.abs(piece).max()) * 1000)  # the fake fills audio with tokens[0] / 1000


# Lengths chosen so the queue runs them in another order than they were written (short ones first).
SENTENCES = ["x" * 299 + ".", "x" * 9 + ".", "x" * 199 + ".", "x" * 4 + ".", "x" * 99 + "."]
TEXT = " ".join(SENTENCES)  # one chunk per sentence


def test_sentences_are_joined_in_order_though_the_engine_completes_them_out_of_order():
    engine = TaggingEngine()
    service = running_service(engine, max_chunk_chars=400)
    engine.tagged = 0  # warm-up tokenized too
    try:
        speech = asyncio.run(asyncio.wait_for(service.synthesize(Ask(TEXT, "fake-voice")), 10))
        completed = [batch[0] for batch in engine.seen]
        assert completed == [4, 2, 5, 3, 1]  # the queue ran the short sentences first...
        pause = int(0.12 * engine.sample_rate)
        starts = np.cumsum([0] + [len(sentence) * SAMPLES_PER_TOKEN + pause for sentence in SENTENCES[:-1]])
        assert [round(float(speech.audio[start + 200]) * 1000) for start in starts] == [1, 2, 3, 4, 5]  # ...in order
    finally:
        service.stop()


def test_a_stream_yields_its_sentences_in_order_whatever_order_they_complete_in():
    engine = TaggingEngine()
    # Not started: no batcher runs, the test completes the sentences itself in a shuffled order.
    service = SpeechService(Settings(stream_first_chunk_chars=0, voice_aliases={}, model_aliases={}), [engine],
                            Metrics())

    async def scenario():
        stream = await service.answer(Ask(TEXT, "fake-voice", response_format="pcm", stream=True))
        completion = [3, 1, 4, 0, 2]

        def complete() -> None:
            for index in completion:
                item = stream.items[index]
                tag = item.input.tokens[0] / 1000
                item.future.set_result(EngineOutput(np.full(item.length * SAMPLES_PER_TOKEN, tag, np.float32)))

        threading.Thread(target=complete).start()
        return [piece async for piece in stream]

    pieces = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert [piece_tag(piece) for piece in pieces] == [1, 2, 3, 4, 5]
    lengths = [piece.size - (int(0.12 * engine.sample_rate) if index else 0) for index, piece in enumerate(pieces)]
    assert lengths == [len(sentence) * SAMPLES_PER_TOKEN for sentence in SENTENCES]


def short_request_latencies(fifo: bool) -> tuple[list[float], float]:
    """Four long streams of ten 200-token sentences queued at once, then five short requests
    arriving while they run. Returns the short requests' latencies and when the streams finished."""
    engine = FakeEngine(cost=lambda size, padded: 0.0002 * padded)  # 40 ms a long sentence, 4 ms a short one
    service = running_service(engine, max_chunk_chars=400, queue_order="fifo" if fifo else "fair")
    long_text = " ".join(["y" * 199 + "."] * 10)

    async def stream_all() -> None:
        stream = await service.answer(Ask(long_text, "fake-voice", response_format="pcm", stream=True))
        async for _ in stream:
            pass

    async def short(delay: float) -> float:
        await asyncio.sleep(delay)
        started = time.perf_counter()
        await service.synthesize(Ask("z" * 20, "fake-voice"))
        return time.perf_counter() - started

    async def scenario():
        started = time.perf_counter()
        streams = asyncio.gather(*(stream_all() for _ in range(4)))
        latencies = await asyncio.gather(*(short(0.1 * n) for n in range(1, 6)))
        await streams
        return list(latencies), time.perf_counter() - started

    try:
        return asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        service.stop()


def test_short_requests_do_not_wait_for_long_streams_unlike_fifo():
    chorus, streams_took = short_request_latencies(fifo=False)
    fifo, _ = short_request_latencies(fifo=True)
    assert streams_took > 1.4  # 40 long sentences of 40 ms were in flight the whole time
    assert max(chorus) < 0.2  # at most one long sentence ahead, never the streams
    assert np.mean(fifo) > 0.7  # behind every long sentence queued before them
    assert max(chorus) < 0.25 * min(fifo)


def test_a_text_of_many_short_sentences_fits_the_queue_in_packed_pieces_and_says_every_one():
    engine = FakeEngine()
    service = running_service(engine, max_queue=40, max_queue_per_caller=40)
    text = " ".join(["Yes.", "No.", "Maybe."] * 200)  # 600 sentences: one piece each would be 600 items
    try:
        speech = asyncio.run(asyncio.wait_for(service.synthesize(Ask(text, "fake-voice")), 30))
        assert speech.chunks <= 40  # what the queue holds
        joins = speech.chunks - 1  # a space between pieces is no token; a pause is there instead
        pause = int(0.12 * engine.sample_rate)
        assert speech.audio.size == (len(text) - joins) * SAMPLES_PER_TOKEN + joins * pause  # every sentence said
    finally:
        service.stop()
