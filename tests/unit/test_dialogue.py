"""Dialogue scripts: parsing and each bad script's refusal (naming its line), and the recording a service makes of
one with fake engines of controlled length and loudness: turns joined with conversation pauses, one level."""

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from tests.fakes import SAMPLES_PER_TOKEN, FakeEngine
from tests.serve import wait_until
from tts_core.audio.levels import TARGET_LEVEL, speech_level
from tts_core.audio.playable import JOIN_PAUSE_S
from tts_core.config import Settings
from tts_core.engines.contract import EngineInput, EngineOutput
from tts_core.errors import ErrorCode, InvalidRequest
from tts_core.ops.metrics import Metrics
from tts_core.request.access import Caller, Tier
from tts_core.request.ask import Ask
from tts_core.request.captions import CaptionWord, subtitles
from tts_core.request.dialogue import (
    MAX_SPEAKERS,
    SAME_SPEAKER_PAUSE_S,
    SPEAKER_CHANGE_PAUSE_S,
    Turn,
    parse,
    speakers,
)
from tts_core.request.operating import OperatorSettings
from tts_core.request.script import Reading
from tts_core.service import SpeechService
from tts_core.text.frontend import NormalizationOptions


def test_lines_of_name_and_text_are_the_turns():
    script = "Ann: Hello, Bob.\n\n  Bob :  Hi, Ann. The train leaves at 7:45.\nAnn:Good."
    assert parse(script) == [Turn("Ann", "Hello, Bob.", "line 1"),
                             Turn("Bob", "Hi, Ann. The train leaves at 7:45.", "line 3"),
                             Turn("Ann", "Good.", "line 4")]


def test_a_list_of_speaker_and_text_is_the_turns():
    assert parse([{"speaker": "Ann", "text": "Hello."}, {"speaker": " Bob", "text": "Hi. "}]) == [
        Turn("Ann", "Hello.", "turn 1"), Turn("Bob", "Hi.", "turn 2")]


@pytest.mark.parametrize("script, named", [
    ("", "no turns"), ("\n  \n", "no turns"), ([], "no turns"),
    ("Ann: Hello.\nJust words with no speaker\n", "line 2"),
    ("Ann: Hello.\nBob:   \n", "line 2: Bob's turn is empty"),
    ("Ann: Hello.\n: what\n", "line 2: ': what' is not"), ("Ann: Hi.\n  : what", "line 2: the turn names no speaker"),
    ([{"speaker": "Ann", "text": "Hi."}, {"speaker": "Bob", "text": " "}], "turn 2: Bob's turn is empty"),
])
def test_a_bad_script_is_refused_naming_its_line(script, named):
    with pytest.raises(InvalidRequest) as raised:
        parse(script)
    assert named in raised.value.message
    assert (raised.value.param, raised.value.code) == ("script", ErrorCode.INVALID_DIALOGUE)


@pytest.mark.parametrize("script, named", [
    ("Ann: Hi.\nX\x00Y: Hello there.", "line 2: the speaker's name 'X\\x00Y' holds a control character"),
    ("Ann: Hi.\nA --> B: Hello.", "line 2: the speaker's name 'A --> B' holds '-->'"),
    ("Ann\tB: Hi.", "line 1: the speaker's name 'Ann\\tB' holds a control character"),
    ([{"speaker": "X\n\n99\n00:00:00,000 --> 00:00:09,000", "text": "Hi."}], "turn 1: the speaker's name"),
    ([{"speaker": "Ann\u2028B", "text": "Hi."}], "turn 1: the speaker's name"),
])
def test_a_speaker_name_that_could_forge_a_caption_cue_is_refused_naming_its_turn(script, named):
    with pytest.raises(InvalidRequest) as raised:
        parse(script)
    assert named in raised.value.message, raised.value.message
    assert (raised.value.param, raised.value.code) == ("script", ErrorCode.INVALID_DIALOGUE)


@pytest.mark.parametrize("script, named", [
    ([{"speaker": "Ann", "text": "Hi."}, {"speaker": "Bob"}], "turn 2 (script[1]): text is required"),
    ([{"speaker": "Ann", "text": 5}], "turn 1 (script[0]): text must be a string"),
    ([{"text": "Hi."}], "turn 1 (script[0]): speaker is required"),
    (["Ann: Hi."], "turn 1 (script[0]) must be an object of fields"),
])
def test_a_list_turn_with_a_missing_or_mistyped_field_is_refused_naming_the_turn_and_field(script, named):
    with pytest.raises(InvalidRequest) as raised:
        parse(script)
    assert named in raised.value.message and raised.value.param == "script"


def test_an_unknown_speaker_is_refused_naming_its_line_and_the_speakers_given():
    turns = parse("Ann: Hello.\nBob: Hi.\nCid: Hey.")
    with pytest.raises(InvalidRequest) as raised:
        speakers(turns, {"Ann": "alloy", "Bob": "echo"})
    assert "line 3" in raised.value.message and "'Cid'" in raised.value.message and "Ann, Bob" in raised.value.message
    assert (raised.value.param, raised.value.code) == ("voices", ErrorCode.UNKNOWN_SPEAKER)


def test_more_speakers_than_a_dialogue_takes_is_refused():
    turns = [Turn(f"S{n}", "Hi.", f"line {n}") for n in range(1, MAX_SPEAKERS + 2)]
    voices = {turn.speaker: "alloy" for turn in turns}
    assert len(speakers(turns[:-1], voices)) == MAX_SPEAKERS
    with pytest.raises(InvalidRequest) as raised:
        speakers(turns, voices)
    assert f"line {MAX_SPEAKERS + 1}" in raised.value.message and raised.value.code == ErrorCode.TOO_MANY_SPEAKERS
    with pytest.raises(InvalidRequest) as raised:
        speakers(turns[:3], voices, most=2)
    assert "line 3" in raised.value.message


def test_subtitles_by_speaker_label_each_cue_and_break_where_the_speaker_changes():
    words = [CaptionWord("Hello", 0.0, 0.4, 0, 5, "Ann"), CaptionWord("Bob", 0.4, 0.7, 7, 10, "Ann"),
             CaptionWord("Hi", 0.9, 1.1, 0, 2, "Bob <the> builder")]
    srt = subtitles(words, "srt")
    assert "00:00:00,000 --> 00:00:00,700\nAnn: Hello Bob\n" in srt
    assert "00:00:00,900 --> 00:00:01,100\nBob <the> builder: Hi\n" in srt
    vtt = subtitles(words, "vtt")
    assert vtt.startswith("WEBVTT\n\n") and "\n<v Ann>Hello Bob\n" in vtt and "\n<v Bob &lt;the  builder>Hi\n" in vtt
    assert words[0].as_json() == {"word": "Hello", "start": 0.0, "end": 0.4, "speaker": "Ann"}


# --- a service's recording, with fake engines -----------------------------------------------------------------

class LoudEngine(FakeEngine):
    """The fake engine at a chosen loudness: its audio is a tone of `amplitude` (the plain fake's is nearly
    silent), SAMPLES_PER_TOKEN samples per character."""

    def __init__(self, amplitude: float, **kwargs):
        super().__init__(**kwargs)
        self.amplitude = amplitude

    def synthesize(self, batch: Sequence[EngineInput]) -> list[EngineOutput]:
        outputs = super().synthesize(batch)
        tone = lambda size: (self.amplitude * np.sin(np.arange(size) * 0.3)).astype(np.float32)  # noqa: E731
        return [EngineOutput(tone(output.audio.size)) for output in outputs]


AS_WRITTEN = Reading(NormalizationOptions(normalize=False))


@pytest.fixture(scope="module")
def service():
    settings = Settings(max_chars=400, batch_policy="sequential", cache_enabled=True)
    engines = [LoudEngine(0.6, name="loud", voice="loud-voice"),
               LoudEngine(0.02, name="quiet", voice="quiet-voice", sample_rate=24000)]
    service = SpeechService(settings, engines, Metrics())
    service.start()
    assert all(loop.calibrated.wait(10) for loop in service.loops.values())
    yield service
    service.stop()


def speak(service, script, voices, **options):
    return asyncio.run(service.answer(Ask(script=script, voices=voices, response_format="pcm", reading=AS_WRITTEN,
                                          **options)))


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768


def test_one_recording_is_the_turns_with_the_pauses_between_them(service):
    script = "Ann: One two.\nBob: Three four five.\nBob: Six.\nAnn: Seven eight."
    spoken = asyncio.run(service.answer(Ask(script=script, voices={"Ann": "loud-voice", "Bob": "loud-voice"},
                                            response_format="wav", reading=AS_WRITTEN)))
    rate = 16000  # the one voice's
    lengths = [len(text) * SAMPLES_PER_TOKEN for text in ("One two.", "Three four five.", "Six.", "Seven eight.")]
    pauses = [SPEAKER_CHANGE_PAUSE_S, SAME_SPEAKER_PAUSE_S, SPEAKER_CHANGE_PAUSE_S]
    assert spoken.duration_s * rate == sum(lengths) + sum(round(pause * rate) for pause in pauses)
    assert [turn.speaker for turn in spoken.turns] == ["Ann", "Bob", "Bob", "Ann"]
    for before, turn, pause, length in zip(spoken.turns[:-1], spoken.turns[1:], pauses, lengths[1:], strict=True):
        assert turn.start - before.end == pytest.approx(pause, abs=1 / rate)
        assert turn.end - turn.start == pytest.approx(length / rate)


def test_a_turns_sentences_keep_the_speech_apis_pause(service):
    spoken = speak(service, "Ann: One two|Three.\nBob: Four.", {"Ann": "loud-voice", "Bob": "loud-voice"})
    rate = 16000
    first = spoken.turns[0]
    assert (first.end - first.start) * rate == pytest.approx((len("One two|Three.") - 1) * SAMPLES_PER_TOKEN
                                                             + round(JOIN_PAUSE_S * rate))


def test_voices_of_different_models_and_loudness_are_matched_to_one_level(service):
    voices = {"Ann": "loud-voice", "Bob": "quiet-voice"}
    spoken = speak(service, "Ann: A fairly long sentence.\nBob: Another long sentence here.", voices)
    audio, rate = pcm(spoken.data), 24000  # the higher of the two voices' rates
    assert audio.size == round(spoken.duration_s * rate)
    levels = [speech_level(audio[round(turn.start * rate):round(turn.end * rate)], rate) for turn in spoken.turns]
    assert levels == pytest.approx([TARGET_LEVEL, TARGET_LEVEL], rel=0.05)  # 0.6 and 0.02 before
    gap = audio[round(spoken.turns[0].end * rate) + 5:round(spoken.turns[1].start * rate) - 5]
    assert gap.size and not gap.any()


def test_the_whole_script_is_cached_as_one(service):
    voices = {"Ann": "loud-voice", "Bob": "quiet-voice"}
    first = speak(service, "Ann: Cached.\nBob: Me too.", voices)
    again = speak(service, "Ann: Cached.\nBob: Me too.", voices)
    swapped = speak(service, "Ann: Cached.\nBob: Me too.", {"Ann": "quiet-voice", "Bob": "loud-voice"})
    assert (first.cache, again.cache, swapped.cache) == ("miss", "hit", "miss") and again.data == first.data


def test_streamed_it_is_as_long_as_the_whole_recording_with_turns_at_one_level(service):
    script, voices = "Ann: One two.\nBob: Three four five.", {"Ann": "loud-voice", "Bob": "quiet-voice"}

    async def streamed():
        stream = await service.answer(Ask(script=script, voices=voices, reading=AS_WRITTEN, response_format="pcm",
                                          stream=True))
        return b"".join([data async for data, _, _ in stream.encoded("pcm")])
    whole, rate = speak(service, script, voices), 24000
    audio = pcm(asyncio.run(streamed()))
    assert audio.size == round(whole.duration_s * rate)  # a stream's first sentence may be cut in two: resampled apart
    turns = [audio[round(turn.start * rate):round(turn.end * rate)] for turn in whole.turns]
    assert [speech_level(turn, rate) for turn in turns] == pytest.approx([TARGET_LEVEL, TARGET_LEVEL], rel=0.05)
    assert not audio[round(whole.turns[0].end * rate) + 5:round(whole.turns[1].start * rate) - 5].any()


@pytest.mark.parametrize("script, voices, param, code, named", [
    ("Ann: Hi.\nBob: Hello.", {"Ann": "loud-voice"}, "voices", ErrorCode.UNKNOWN_SPEAKER, "line 2"),
    ("Ann: Hi.", {"Ann": "nobody"}, "voices", ErrorCode.VOICE_NOT_FOUND, "voices['Ann']"),
    ("Ann: Hi.\nBob: \x07", {"Ann": "loud-voice", "Bob": "loud-voice"}, "script", None, "line 2 (Bob)"),
    ("Ann: " + "x" * 300 + "\nBob: " + "y" * 200, {"Ann": "loud-voice", "Bob": "loud-voice"}, "script",
     ErrorCode.STRING_ABOVE_MAX_LENGTH, "500 characters"),
])
def test_a_bad_dialogue_is_refused_before_any_work(service, script, voices, param, code, named):
    with pytest.raises(InvalidRequest) as raised:
        speak(service, script, voices)
    assert (raised.value.param, raised.value.code) == (param, code) and named in raised.value.message


def test_a_script_whose_pieces_could_never_wait_in_the_queue_at_once_is_a_400_up_front(service):
    caller = Caller("ip:10.0.0.7", "small", Tier(max_queue_share=0.01))  # 5 of the queue's 512 pieces
    voices, ask = {"Ann": "loud-voice", "Bob": "loud-voice"}, Ask(response_format="pcm", reading=AS_WRITTEN)
    for turns in ("Ann: Hi.\nBob: Hi.\n" * 3, [{"speaker": "Ann", "text": "Hi."}] * 6):
        with pytest.raises(InvalidRequest) as raised:  # it answered 503 with a Retry-After, for good
            speak(service, turns, voices, caller=caller)
        assert (raised.value.param, raised.value.code) == ("script", ErrorCode.TEXT_ABOVE_QUEUE_CAPACITY)
        assert "at least 6 pieces" in raised.value.message and "at most 5" in raised.value.message
        with pytest.raises(InvalidRequest):  # a dialogue job is refused as it is submitted
            asyncio.run(service.dialogue_turns(replace(ask, script=turns, voices=voices, caller=caller)))
    assert speak(service, "Ann: Hi.\nBob: Hi.\n" * 2 + "Ann: Hi.", voices, caller=caller).duration_s > 0


def test_a_tiers_limit_counts_the_whole_script_not_each_turn(service):
    caller = Caller("ip:10.0.0.9", "free", Tier(max_chars=50))
    voices = {"Ann": "loud-voice", "Bob": "loud-voice"}
    with pytest.raises(InvalidRequest) as raised:  # 30 + 30 characters: each turn within the limit
        speak(service, "Ann: " + "a" * 30 + "\nBob: " + "b" * 30, voices, caller=caller)
    assert (raised.value.param, raised.value.code) == ("script", ErrorCode.TIER_TEXT_LIMIT)
    assert "60 characters" in raised.value.message and "free tier allows 50" in raised.value.message
    assert speak(service, "Ann: " + "a" * 20 + "\nBob: " + "b" * 20, voices, caller=caller).duration_s > 0


def test_all_turns_are_queued_at_once_beside_other_callers_work(service):
    """Held behind a running piece, the dialogue's turns and another caller's text wait in the one queue together:
    each turn is a piece there (batched by the policy like any other), none waits for the turn before it."""
    engine, loop = service.loops["loud"].engine, service.loops["loud"]
    engine.gate.clear()  # hold the engine so the queue fills
    engine.calls_started = threading.Semaphore(0)  # count the calls from here on

    async def scenario():
        blocker = asyncio.ensure_future(service.synthesize(Ask("hold", "loud-voice")))
        assert await asyncio.to_thread(engine.calls_started.acquire, True, 5)  # "hold" runs
        talk = asyncio.ensure_future(service.answer(Ask(script="Ann: One.\nBob: Two.\nAnn: Three.",
                                                        voices={"Ann": "loud-voice", "Bob": "loud-voice"},
                                                        response_format="pcm", reading=AS_WRITTEN)))
        other = asyncio.ensure_future(service.synthesize(Ask("other", "loud-voice")))
        assert await asyncio.to_thread(wait_until, lambda: loop.queue_length == 4, 5)  # 3 turns + the other text
        engine.gate.set()
        spoken = (await asyncio.gather(blocker, talk, other))[1]
        assert [turn.speaker for turn in spoken.turns] == ["Ann", "Bob", "Ann"]
    try:
        asyncio.run(scenario())
    finally:
        engine.gate.set()


def test_a_long_dialogue_is_checked_on_its_first_turns_wait_not_refused_for_its_own_turns():
    """40 turns of 50 ms each (2 s of work) against a 0.5 s wait target, on an idle server: accepted, as a long text
    of 40 sentences is; each later turn waits behind the dialogue's own earlier ones, no reason to refuse it."""
    engine = FakeEngine(cost=lambda size, padded: 0.05)
    service = SpeechService(Settings(batch_policy="sequential", calibration_sizes=[1], voice_aliases={},
                                     model_aliases={}), [engine], Metrics())
    service.start()
    try:
        assert service.loops["fake"].calibrated.wait(10)
        service.degrade.configure(OperatorSettings(queue_wait_target_s=0.5, exit_hold_s=0))
        script = "\n".join(f"{'Ann' if n % 2 else 'Bob'}: Turn number {n} is here." for n in range(40))
        spoken = asyncio.run(service.answer(Ask(script=script, voices={"Ann": "fake-voice", "Bob": "fake-voice"},
                                                response_format="pcm", caller=Caller("ip:a", "open", Tier()))))
        assert len(spoken.turns) == 40
    finally:
        service.stop()
