"""The SSML subset: what each element says, where each error is, the pauses and voices it makes."""

import asyncio
import time

import numpy as np
import pytest

from tests.fakes import SAMPLES_PER_TOKEN, FakeEngine
from tts_core.audio.playable import JOIN_PAUSE_S
from tts_core.config import Settings
from tts_core.engines.base import Voice
from tts_core.errors import InvalidRequest
from tts_core.ops.metrics import Metrics
from tts_core.request.ask import Ask
from tts_core.request.script import Reading
from tts_core.service import SpeechService
from tts_core.text.frontend import spoken_parts, ssml


def said(text: str) -> list[tuple[str | None, float, float | None, str]]:
    """(voice, rate, pause before, spoken text) of each passage."""
    return [(passage.voice, round(passage.rate, 6), None if passage.pause_before_s is None
             else round(passage.pause_before_s, 6), spoken_parts(passage.parts, "en").text)
            for passage in ssml.parse(text).passages]


@pytest.mark.parametrize("document, expected", [
    ("<speak>Hello world.</speak>", [(None, 1.0, None, "Hello world.")]),
    ('<speak>One <break time="500ms"/> two <break time="1.5s"/>three</speak>',
     [(None, 1.0, None, "One"), (None, 1.0, 0.5, "two"), (None, 1.0, 1.5, "three")]),
    ('<speak>One <break strength="strong"/><break strength="x-weak"/>two<break/>three</speak>',
     [(None, 1.0, None, "One"), (None, 1.0, 0.8, "two"), (None, 1.0, 0.4, "three")]),
    ('<speak>Now <prosody rate="slow">slower <prosody rate="80%">and slower</prosody></prosody>'
     '<prosody rate="+10%">faster</prosody><prosody rate="1.5">fastest</prosody></speak>',
     [(None, 1.0, None, "Now"), (None, 0.75, None, "slower"), (None, 0.6, None, "and slower"),
      (None, 1.1, None, "faster"), (None, 1.5, None, "fastest")]),
    ('<speak>Hi <voice name="amy">there <voice name="bob">you</voice></voice> all</speak>',
     [(None, 1.0, None, "Hi"), ("amy", 1.0, None, "there"), ("bob", 1.0, None, "you"), (None, 1.0, None, "all")]),
    ('<speak><p><s>First one</s><s>second one</s></p><p>A new paragraph</p></speak>',
     [(None, 1.0, None, "First one.\nsecond one.\nA new paragraph.")]),
    ('<speak>Call <say-as interpret-as="telephone">+1 555 123 4567</say-as>.</speak>',
     [(None, 1.0, None, "Call plus one, five five five, one two three, four five six seven.")]),
    ('<speak><say-as interpret-as="characters">NASA</say-as> <say-as interpret-as="spell-out">ab12</say-as>'
     '</speak>', [(None, 1.0, None, "N A S A A B one two")]),
    ('<speak><say-as interpret-as="cardinal">1,234</say-as> <say-as interpret-as="ordinal">3</say-as> '
     '<say-as interpret-as="cardinal">twelve</say-as></speak>',
     [(None, 1.0, None, "one thousand two hundred and thirty-four third twelve")]),
    ('<speak><say-as interpret-as="date" format="dmy">30/11/2026</say-as>, '
     '<say-as interpret-as="date" format="my">11/2026</say-as>, '
     '<say-as interpret-as="date">13/40/2026</say-as></speak>',
     [(None, 1.0, None, "November thirtieth, twenty twenty-six, November twenty twenty-six, 13/40/2026")]),
    ('<speak><sub alias="World Wide Web Consortium">W3C</sub> rules</speak>',
     [(None, 1.0, None, "World Wide Web Consortium rules")]),
    ('<speak><emphasis level="strong">Loud</emphasis> <mark name="m1"/>and <lang xml:lang="fr">clear</lang>'
     '</speak>', [(None, 1.0, None, "Loud and clear")]),
    ('<speak>Fish &amp; chips &lt;3 <![CDATA[a < b]]> caf&#233;</speak>',
     [(None, 1.0, None, "Fish and chips three a b café")]),
])
def test_each_element_says_what_it_should(document, expected):
    assert said(document) == expected


def test_a_phoneme_is_a_pronunciation_of_its_word():
    [passage] = ssml.parse('<speak>In <phoneme alphabet="ipa" ph="ˈwʊstər">Worcester</phoneme>.</speak>').passages
    pieces = spoken_parts(passage.parts, "en").pieces
    pronounced = [piece for piece in pieces if piece.kind == "pronunciation"]
    assert [(piece.ipa, piece.spoken.split("\x10")[0].strip("\x0e")) for piece in pronounced] == [
        ("ˈwʊstər", "Worcester")]


def test_every_spoken_piece_names_the_callers_characters():
    """Captions are in the caller's words: a piece maps to the SSML input as written, entities and all."""
    text = '<speak>Fish &amp; chips for <say-as interpret-as="cardinal">12</say-as>, <sub alias="the W three C">' \
           'W3C</sub>.\r\n</speak>'
    [passage] = ssml.parse(text).passages
    pieces = spoken_parts(passage.parts, "en").pieces
    assert [(text[piece.start:piece.end], piece.spoken.strip()) for piece in pieces if piece.spoken.strip()] == [
        ("Fish ", "Fish"), ("&amp;", "and"), (" chips for ", "chips for"), ("12", "twelve"), (", ", ","),
        ("W3C", "the"), ("W3C", "W"), ("W3C", "three"), ("W3C", "C"), (".\r\n", ".")]


@pytest.mark.parametrize("document, where, says", [
    ("<speak>Hello <b>world</speak>", "line 1, column 24", "mismatched tag"),
    ("<speak>Hello\n  <break time='20s'/></speak>", "line 2, column 3", "longer than 10 s"),
    ("<speak>Hello\n<break time='soon'/></speak>", "line 2, column 1", "500ms or 1.5s"),
    ("<speak><break strength='huge'/></speak>", "line 1, column 8", "strength"),
    ("<speak><prosody rate='zoom'>a</prosody></speak>", "line 1, column 8", "prosody rate"),
    ("<speak><say-as interpret-as='verbatim'>a</say-as></speak>", "line 1, column 8", "not supported"),
    ("<speak><phoneme alphabet='x-sampa' ph='a'>a</phoneme></speak>", "line 1, column 8", "ipa"),
    ("<speak><phoneme>a</phoneme></speak>", "line 1, column 8", "ph attribute"),
    ("<speak><sub>a</sub></speak>", "line 1, column 8", "alias"),
    ("<voice>a</voice>", "line 1, column 1", "root element must be <speak>"),
    ("<speak>a</speak>b", "line 1, column 17", "junk after document element"),
    ("<speak>&nbsp;</speak>", "line 1, column 8", "undefined entity"),
    ('<!DOCTYPE speak [<!ENTITY a "aaaa">]><speak>&a;</speak>', "line 1", "document type"),
    ('<!DOCTYPE speak SYSTEM "file:///etc/passwd"><speak>a</speak>', "line 1", "document type"),
    ("<speak>" + "<s>" * 40 + "deep" + "</s>" * 40 + "</speak>", "line 1, column 101", "nested more than 32"),
    ("<speak>" + "<break time='9s'/>" * 7 + "</speak>", "line 1, column 116", "add up to more than 60 s"),
])
def test_malformed_ssml_is_refused_saying_where(document, where, says):
    with pytest.raises(ssml.SsmlError) as refused:
        ssml.parse(document)
    assert f"invalid SSML at {where}" in str(refused.value) and says in str(refused.value)


def test_entity_expansion_is_refused_at_once():
    """The billion laughs: refused at its document type, before any entity is expanded."""
    laughs = '<!DOCTYPE speak [<!ENTITY a "ha">' + "".join(
        f'<!ENTITY {chr(98 + level)} "{("&" + chr(97 + level) + ";") * 10}">' for level in range(9)) + "]>"
    started = time.perf_counter()
    with pytest.raises(ssml.SsmlError, match="document type"):
        ssml.parse(laughs + "<speak>&j;</speak>")
    assert time.perf_counter() - started < 1.0


def test_detection():
    assert ssml.is_ssml("  <speak>hi</speak>") and ssml.is_ssml('<?xml version="1.0"?><speak>hi</speak>')
    assert not ssml.is_ssml("say <speak> out loud")


# --- in the service: pauses, rates and voices in the audio ----------------------------------------

class SlowVoiceEngine(FakeEngine):
    def __init__(self, name: str, voice: str, sample_rate: int, speed_control: bool = True):
        super().__init__(sample_rate=sample_rate, name=name)
        self.voice = Voice(voice, name, "en", sample_rate, speed_control=speed_control)
        self.speeds: list[float] = []

    def voices(self):
        return [self.voice]

    def synthesize(self, batch):
        self.speeds.extend(item.speed for item in batch)
        return super().synthesize(batch)


@pytest.fixture
def service():
    engines = [SlowVoiceEngine("fake", "fake-voice", 16000), SlowVoiceEngine("half", "half-voice", 8000),
               SlowVoiceEngine("fixed", "fixed-voice", 16000, speed_control=False)]
    service = SpeechService(Settings(max_chars=2000, batch_policy="sequential"), engines, Metrics())
    service.start()
    for batcher in service.loops.values():
        assert batcher.calibrated.wait(10)
    yield service
    service.stop()


def test_a_break_is_that_much_silence_in_the_file_and_in_the_stream(service):
    text = '<speak><break time="200ms"/>abc<break time="750ms"/>defg. hi<break time="1s"/></speak>'
    speech = asyncio.run(service.synthesize(Ask(text, "fake-voice")))
    rate = speech.sample_rate
    expected = [(0.2, 0), (0, 3), (0.75, 0), (0, 5), (JOIN_PAUSE_S, 0), (0, 2), (1.0, 0)]  # (pause s, tokens)
    assert speech.audio.size == sum(round(pause * rate) + tokens * SAMPLES_PER_TOKEN for pause, tokens in expected)
    silent = np.flatnonzero(speech.audio == 0)
    assert silent[0] == 0 and speech.audio[round(0.2 * rate) + 5] != 0  # the leading break, then speech

    async def streamed():
        stream = await service.answer(Ask(text, "fake-voice", response_format="pcm", stream=True))
        return np.concatenate([piece async for piece in stream])
    assert np.array_equal(asyncio.run(streamed()), speech.audio)


def test_voices_and_rates_switch_and_the_answer_keeps_the_requests_rate(service):
    text = '<speak>abcd <voice name="half-voice">efgh</voice> <prosody rate="fast">ijkl</prosody></speak>'
    speech = asyncio.run(service.synthesize(Ask(text, "fake-voice", speed=2.0)))
    assert speech.sample_rate == 16000 and speech.voice == "fake-voice"
    # the 8 kHz voice's 4 tokens (400 samples) take 800 at 16 kHz; pauses between passages are the usual
    tokens = 4 * SAMPLES_PER_TOKEN
    assert abs(speech.audio.size - (tokens + 2 * tokens + tokens + 2 * round(JOIN_PAUSE_S * 16000))) <= 16
    engines = {batcher.engine.name: batcher.engine for batcher in service.loops.values()}
    assert engines["fake"].speeds[-2:] == [2.0, 2.5] and engines["half"].speeds[-1] == 2.0


@pytest.mark.parametrize("text, voice, says", [
    ('<speak>a <voice name="nobody">b</voice></speak>', "fake-voice", "<voice> at line 1, column 31: voice 'nobody'"),
    ('<speak>a\n<prosody rate="x-fast">b</prosody></speak>', "fixed-voice",
     "<prosody rate> at line 2, column 24: voice 'fixed-voice' (fixed) has no speaking-rate control"),
    ('<speak><prosody rate="300%">b</prosody></speak>', "fake-voice", "speed must be between"),
    ('<speak><break time="1s"/></speak>', "fake-voice", "nothing to speak"),
])
def test_refusals_name_the_place_in_the_input(service, text, voice, says):
    with pytest.raises(InvalidRequest) as refused:
        service.validate(Ask(text, voice, speed=2.0 if "300%" in text else 1.0))
    assert says in refused.value.message and refused.value.param == "input"


def test_input_type_decides_how_the_input_is_read(service):
    document = "<speak>one <break time='1s'/> two</speak>"
    assert len(service.validate(Ask(document, "fake-voice")).passages) == 2
    as_text = service.validate(Ask(document, "fake-voice", reading=Reading(input_type="text")))
    assert [passage.spoken.text for passage in as_text.passages] == ["one two"]
    with pytest.raises(InvalidRequest, match="line 1, column 1: SSML starts with <speak>"):
        service.validate(Ask("plain words", "fake-voice", reading=Reading(input_type="ssml")))
    with pytest.raises(InvalidRequest) as refused:
        service.validate(Ask("<speak>a<b></speak>", "fake-voice"))
    assert refused.value.code == "invalid_ssml"
