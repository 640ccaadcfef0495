"""The Wyoming server (Home Assistant, Rhasspy), driven by the wyoming package's own client over TCP: info lists
the voices, a synthesize answers the voice's audio (the same samples' count as the HTTP API's), the streaming
flow speaks each sentence as it arrives, errors leave the connection usable, and TTS_WYOMING_TIER's limit holds."""

import asyncio
import io
import wave

import httpx
import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped, SynthesizeVoice

from app import create_app
from bench.server import free_port
from tests.fakes import FakeEngine
from tests.serve import metric, serve_in_thread
from tts_core.config import Settings
from tts_core.engines.piper import PiperEngine, bundled_voice_path

WAIT_S = 60  # for any one event
PIPER = "en_US-joe-medium"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(HTTP base, Wyoming port) of a server with a fake voice (exact lengths) and the real bundled one."""
    port = free_port()
    settings = Settings(data_dir=tmp_path_factory.mktemp("wyoming"), host="127.0.0.1", wyoming_port=port,
                        calibration_sizes=[1], model_aliases={}, voice_aliases={},
                        operator_defaults={"anonymous_tier": "enterprise", "degrade_enabled": False})
    engines = [FakeEngine(), PiperEngine(bundled_voice_path(), noise_scale=0.0, noise_w=0.0)]
    with serve_in_thread(create_app(settings, engines=engines)) as base:
        yield base, port


def talk(port: int, conversation):
    """Run conversation(client) against the Wyoming server on a fresh connection."""
    async def run():
        async with AsyncTcpClient("127.0.0.1", port) as client:
            return await conversation(client)
    return asyncio.run(run())


async def next_event(client: AsyncTcpClient) -> Event:
    event = await asyncio.wait_for(client.read_event(), WAIT_S)
    assert event is not None, "the server closed the connection"
    return event


async def utterance(client: AsyncTcpClient) -> tuple[AudioStart, bytes]:
    """audio-start, its chunks (each in its format) and audio-stop: the format and the audio."""
    start = AudioStart.from_event(await next_event(client))
    audio = b""
    while not AudioStop.is_type((event := await next_event(client)).type):
        chunk = AudioChunk.from_event(event)
        assert (chunk.rate, chunk.width, chunk.channels) == (start.rate, 2, 1)
        audio += chunk.audio
    return start, audio


def http_samples(base: str, text: str, voice: str) -> int:
    """What the HTTP API answers for the same text: its samples in a WAV file."""
    model = "fake" if voice == "fake-voice" else "piper"
    response = httpx.post(f"{base}/v1/audio/speech", timeout=WAIT_S,
                          json={"model": model, "input": text, "voice": voice, "response_format": "wav"})
    assert response.status_code == 200, response.text
    with wave.open(io.BytesIO(response.content)) as wav:
        return wav.getnframes()


def test_info_lists_every_voice_with_its_languages(server):
    async def conversation(client):
        await client.write_event(Describe().event())
        return Info.from_event(await next_event(client))

    info = talk(server[1], conversation)
    (program,) = info.tts
    assert program.supports_synthesize_streaming
    assert {voice.name: voice.languages for voice in program.voices} == {"fake-voice": ["en"], PIPER: ["en-us"]}


@pytest.mark.parametrize(("voice", "rate"), [("fake-voice", 16000), (PIPER, 22050)])
def test_synthesize_answers_the_voices_audio(server, voice, rate):
    base, port = server
    text = "Hello there. How are you?"

    async def conversation(client):
        await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name=voice)).event())
        return await utterance(client)

    start, audio = talk(port, conversation)
    assert (start.rate, start.width, start.channels) == (rate, 2, 1)
    assert len(audio) // 2 == http_samples(base, text, voice)


def test_a_long_text_is_as_long_as_the_http_file_though_its_first_sentence_is_cut(server):
    # Wyoming streams: the first sentence is cut into a short first piece and longer ones, joined with no pause
    base, port = server
    text = " ".join(f"Sentence number {n} is long enough, so the stream cuts it into a few pieces." for n in range(4))

    async def conversation(client):
        await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name=PIPER)).event())
        return await utterance(client)

    _, audio = talk(port, conversation)
    assert len(audio) // 2 == pytest.approx(http_samples(base, text, PIPER), rel=0.02)


def test_a_stream_is_spoken_sentence_by_sentence(server):
    base, port = server

    async def conversation(client):
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="fake-voice")).event())
        await client.write_event(SynthesizeChunk(text="One sentence. And").event())
        first = await utterance(client)  # spoken before the rest of the text has been sent
        await client.write_event(SynthesizeChunk(text=" a second one.").event())
        # the whole text again, as streaming clients send it for older servers: not spoken twice
        await client.write_event(Synthesize(text="One sentence. And a second one.").event())
        await client.write_event(SynthesizeStop().event())
        second = await utterance(client)
        assert SynthesizeStopped.is_type((await next_event(client)).type)
        return first, second

    (start, first), (_, second) = talk(port, conversation)
    assert start.rate == 16000
    assert len(first) // 2 == http_samples(base, "One sentence.", "fake-voice")
    assert len(second) // 2 == http_samples(base, "And a second one.", "fake-voice")


def test_errors_are_answered_and_the_connection_stays_usable(server):
    async def error_code(client, event: Event) -> str:
        await client.write_event(event)
        answer = await next_event(client)
        assert Error.is_type(answer.type), answer
        return Error.from_event(answer).code

    async def conversation(client):
        codes = [await error_code(client, Synthesize(text="Hi.", voice=SynthesizeVoice(name="nobody")).event()),
                 await error_code(client, Event(type="synthesize", data={"voice": {"name": "fake-voice"}})),
                 await error_code(client, SynthesizeChunk(text="no stream started").event())]
        client._writer.write(b"this is not an event\n")
        codes.append(Error.from_event(await next_event(client)).code)
        await client.write_event(Event(type="transcribe"))  # for another service: ignored
        await client.write_event(Synthesize(text="Still here.", voice=SynthesizeVoice(name="fake-voice")).event())
        return codes, await utterance(client)

    codes, (start, audio) = talk(server[1], conversation)
    assert codes == ["voice_not_found", "invalid_event", "no_stream", "invalid_event"]
    assert start.rate == 16000 and audio


def test_a_language_picks_a_voice_that_speaks_it(server):
    async def conversation(client):
        await client.write_event(Event(type="synthesize", data={"text": "Hello.", "voice": {"language": "en_US"}}))
        return await utterance(client)

    start, audio = talk(server[1], conversation)
    assert start.rate == 22050 and audio  # the default voice, which speaks en-us


def test_wyoming_callers_get_their_tier_and_its_limit(tmp_path):
    port = free_port()
    tiers = {"free": {"rate_limit": None}, "home": {"rate_limit": "2/minute"}}
    settings = Settings(data_dir=tmp_path, host="127.0.0.1", wyoming_port=port, wyoming_tier="home",
                        calibration_sizes=[1], model_aliases={}, voice_aliases={},
                        operator_defaults={"tiers": tiers, "anonymous_tier": "free", "degrade_enabled": False})

    async def conversation(client):
        answers = []
        for _ in range(3):
            await client.write_event(Synthesize(text="Hi.").event())
            answer = await next_event(client)
            if AudioStart.is_type(answer.type):
                answers.append("audio")
                while not AudioStop.is_type((await next_event(client)).type):
                    pass
            else:
                answers.append(Error.from_event(answer).code)
        return answers

    with serve_in_thread(create_app(settings, engines=[FakeEngine()])) as base:
        assert talk(port, conversation) == ["audio", "audio", "rate_limit_exceeded"]
        assert metric(base, r'tts_requests_total\{source="wyoming",status="200"\}') == 2
        assert metric(base, r'tts_requests_total\{source="wyoming",status="429"\}') == 1
