"""A dialogue: a script of several speakers' turns made into one recording.

A script is lines of `Name: text` (or a list of {speaker, text}); the caller maps each speaker to any voice
Chorus serves (a preset, a mix, a cloned voice). Here a script is parsed, checked (every refusal names the line)
and compiled into one `Script` of passages, a turn's passages after the pause that fits a conversation there,
so its pieces are queued at once through the one queue, batched with everyone else's work, each on its voice's
model. tts_core.audio.levels matches the turns' loudness when they are joined. Where every speaker's voice is of
one model that speaks a conversation in one context (VibeVoice), the script is one passage instead, queued whole:
the cast's voices and the turns as the model's own multi-speaker script (tts_core.engines.vibevoice).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import re
import unicodedata
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace

import numpy as np

from ..audio.levels import gain_for, matched, scaled
from ..audio.playable import join, silence
from ..engines import Voice
from ..engines.contract import EngineOutput
from ..errors import Degraded, ErrorCode, InvalidRequest
from ..ops.metrics import Metrics
from ..scheduler.records import QueuedItem
from ..text.frontend import SpokenText
from ..voices.catalogue import Catalogue
from .access import Caller, Tier
from .admission import Admission
from .assembly import SentenceStream, encoded_stream
from .captions import CaptionWord, Timed, caption_words, timed_words
from .operating import DegradeAction
from .script import Reading, Script

MAX_SPEAKERS = 16  # turn by turn, any number of voices could take turns: this many keeps a script readable
MAX_NAME_CHARS = 64
SPEAKER_CHANGE_PAUSE_S = 0.4  # between two speakers' turns: the gap of a conversation's turn-taking
SAME_SPEAKER_PAUSE_S = 0.25  # a speaker's turn after their own: longer than between sentences (0.12 s)
# `Name: text`; a name is what comes before the first colon (no colon in it), the text what follows
TURN_LINE = re.compile(rf"^\s*([^:]{{1,{MAX_NAME_CHARS}}}?)\s*:(.*)$", re.DOTALL)


ScriptText = str | Sequence[Mapping[str, str]]  # lines of `Name: text`, or a list of {speaker, text}


@dataclass(frozen=True)
class Turn:
    speaker: str
    text: str
    where: str  # how a refusal names it: "line 3" of a written script, "turn 3" of a list


def parse(script: ScriptText) -> list[Turn]:
    """The turns of a script: lines of `Name: text` (blank lines skipped), or a list of {speaker, text}."""
    if isinstance(script, str):
        turns = [_turn_line(line, number) for number, line in enumerate(script.splitlines(), 1) if line.strip()]
    else:
        turns = [_listed_turn(entry, number) for number, entry in enumerate(script, 1)]
    if not turns:
        raise InvalidRequest("the script has no turns: write one `Name: text` line per turn", "script",
                             ErrorCode.INVALID_DIALOGUE)
    return turns


def _turn_line(line: str, number: int) -> Turn:
    found = TURN_LINE.match(line)
    if found is None:
        raise InvalidRequest(f"script line {number}: {_clipped(line)!r} is not `Name: text` (a speaker's name, a "
                             "colon, what they say)", "script", ErrorCode.INVALID_DIALOGUE)
    return _turn(found.group(1), found.group(2), f"line {number}")


def _listed_turn(entry: object, number: int) -> Turn:
    fault = listed_turn_fault(entry, number - 1)
    if fault:
        raise InvalidRequest(f"script {fault}", "script", ErrorCode.INVALID_DIALOGUE)
    return _turn(entry["speaker"], entry["text"], f"turn {number}")


LISTED_FIELDS = ("speaker", "text")


def listed_turn_fault(entry: object, index: int) -> str | None:
    """What is wrong with a list-form turn's fields (None: nothing), naming the turn by number and index, and the
    field: `turn 3 (script[2]): text is required`."""
    where = f"turn {index + 1} (script[{index}])"
    if not isinstance(entry, Mapping):
        return f"{where} must be an object of fields speaker and text"
    for name in LISTED_FIELDS:
        if name not in entry:
            return f"{where}: {name} is required"
        if not isinstance(entry[name], str):
            return f"{where}: {name} must be a string"
    if extra := sorted(str(name) for name in entry if name not in LISTED_FIELDS):
        return f"{where}: {extra[0]!r} is not a field of a turn (speaker, text)"
    if len(entry["speaker"]) > MAX_NAME_CHARS:
        return f"{where}: speaker must be at most {MAX_NAME_CHARS} characters long"
    return None


def _turn(speaker: str, text: str, where: str) -> Turn:
    speaker, text = speaker.strip(), text.strip()
    if not speaker:
        raise InvalidRequest(f"script {where}: the turn names no speaker", "script", ErrorCode.INVALID_DIALOGUE)
    if forged := _forging(speaker):
        raise InvalidRequest(f"script {where}: the speaker's name {_clipped(speaker)!r} holds {forged}, which "
                             "could forge a caption cue", "script", ErrorCode.INVALID_DIALOGUE)
    if not text:
        raise InvalidRequest(f"script {where}: {speaker}'s turn is empty", "script", ErrorCode.INVALID_DIALOGUE)
    return Turn(speaker, text, where)


def _forging(name: str) -> str | None:
    """What in a speaker's name could break or forge a subtitle cue (its label is written into every cue)."""
    if "-->" in name:
        return "'-->'"
    if any(unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp") for char in name):
        return "a control character or line break"
    return None


def _clipped(text: str, most: int = 40) -> str:
    return text if len(text) <= most else text[:most] + "..."


def speakers(turns: Sequence[Turn], voices: Mapping[str, str], most: int = MAX_SPEAKERS) -> list[str]:
    """The speakers in order of their first turn, each with a voice in `voices`, and no more than `most`."""
    named: list[str] = []
    for turn in turns:
        if turn.speaker in named:
            continue
        if turn.speaker not in voices:
            given = ", ".join(sorted(voices)) or "none"
            raise InvalidRequest(f"script {turn.where}: speaker {turn.speaker!r} has no voice in `voices` (given: "
                                 f"{given})", "voices", ErrorCode.UNKNOWN_SPEAKER)
        named.append(turn.speaker)
        if len(named) > most:
            raise InvalidRequest(f"script {turn.where}: {turn.speaker!r} is speaker {len(named)}; a dialogue takes "
                                 f"at most {most}", "script", ErrorCode.TOO_MANY_SPEAKERS)
    return named


# --- compiling --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Dialogue:
    """A checked script: its turns, each turn's own script (the front end's text of it, in its speaker's voice),
    and `script`, every turn's passages in order with the pauses between turns, as it is queued."""

    turns: tuple[Turn, ...]
    voices: tuple[Voice, ...]  # each turn's
    turn_scripts: tuple[Script, ...]
    script: Script  # its voice is the answer's (the highest sample rate of the turns' voices)
    first_passages: tuple[int, ...]  # where each turn's passages start in `script`
    native: bool = False  # one passage, the whole conversation in one context (VibeVoice's): one part, not turns

    @property
    def key(self) -> tuple:
        """Equal for dialogues that sound the same (the cache's key, with the format): every turn's text,
        speaker and voice, and the pauses."""
        return ("dialogue", self.script.key, tuple(turn.speaker for turn in self.turns))

    def turn_of(self, passage: int) -> int:
        """The turn a passage says (the first, for a conversation spoken natively: it says them all)."""
        return 0 if self.native else bisect.bisect_right(self.first_passages, passage) - 1

    def who(self, turn: int) -> tuple[str, str]:
        """The speaker and voice of a part of the recording: a turn's, or a native conversation's cast."""
        if not self.native:
            return self.turns[turn].speaker, self.voices[turn].name
        cast = dict.fromkeys(zip((turn.speaker for turn in self.turns), (voice.name for voice in self.voices)))
        return ", ".join(speaker for speaker, _ in cast), ", ".join(voice for _, voice in cast)


def compile_dialogue(admission: Admission, catalogue: Catalogue, script: ScriptText, voices: Mapping[str, str],
                     model: str | None, speed: float, caller: Caller | None, reading: Reading = Reading(),
                     words: bool = False) -> Dialogue:
    """The script parsed, its turns checked as the speech API checks a text (each turn in its speaker's voice; the
    length limits on the script's whole text) and compiled into one script. Blocking: run it on the text reader."""
    turns = parse(script)
    named = speakers(turns, voices)
    _check_length(admission, sum(len(turn.text) for turn in turns), caller)
    identity = caller.identity if caller else None
    for speaker in named:  # a bad voice is the map's fault, whichever line uses it first
        try:
            catalogue.resolve(voices[speaker], model, identity)
        except InvalidRequest as error:
            raise InvalidRequest(f"voices[{speaker!r}]: {error.message}", "voices", error.code) from None
    scripts = tuple(_turn_script(admission, catalogue, turn, voices[turn.speaker], model, speed, caller, reading,
                                 words) for turn in turns)
    spoken = sum(len(passage.spoken.text) for script in scripts for passage in script.passages)
    if spoken > admission.settings.max_spoken_chars:
        raise InvalidRequest(f"the script is {spoken} characters long once its numbers and symbols are said as "
                             f"words; the limit is {admission.settings.max_spoken_chars}", "script",
                             ErrorCode.SPOKEN_TEXT_ABOVE_MAX_LENGTH)
    dialogue = _conversation(tuple(turns), named, scripts) or _joined_script(tuple(turns), scripts)
    _check_queue_capacity(admission, dialogue.script, caller)
    return dialogue


def _check_queue_capacity(admission: Admission, script: Script, caller: Caller | None) -> None:
    """A script whose pieces on one model could never wait in the queue at once is a 400, as a text's are: each
    passage is at least one piece, and all of them are queued together (a 503 caller_queue_full told it to retry
    for good)."""
    most = admission.most_pieces_queued(caller)
    for model, passages in Counter(passage.model for passage in script.passages).items():
        if passages > most:
            raise InvalidRequest(f"the script makes at least {passages} pieces to synthesize on model {model} (a "
                                 f"piece or more a turn), and at most {most} of one caller's can ever wait in this "
                                 "server's queue at once; send it in shorter parts", "script",
                                 ErrorCode.TEXT_ABOVE_QUEUE_CAPACITY)


def _check_length(admission: Admission, characters: int, caller: Caller | None) -> None:
    """The speech API's length limits (the server's, the tier's, degrade mode's cap), on the whole script."""
    tier, limit = caller.tier if caller else Tier(), admission.settings.max_chars
    if characters > limit:
        raise InvalidRequest(f"the script's turns are {characters} characters long; the limit is {limit}", "script",
                             ErrorCode.STRING_ABOVE_MAX_LENGTH)
    if characters > tier.max_chars:
        raise InvalidRequest(f"the script's turns are {characters} characters long; the {caller.tier_name} tier "
                             f"allows {tier.max_chars}", "script", ErrorCode.TIER_TEXT_LIMIT)
    degrade = admission.degrade
    if DegradeAction.CAP_TEXT in degrade.state.actions and characters > degrade.settings.cap_text_chars:
        admission.metrics.degrade_actions.labels(DegradeAction.CAP_TEXT).inc()
        retry = max(1, round(degrade.expected_end_s()))
        raise Degraded(f"the server is under heavy load: scripts of up to {degrade.settings.cap_text_chars} "
                       f"characters are accepted now (this one has {characters}); longer ones again in about "
                       f"{retry} s", retry, ErrorCode.DEGRADED_TEXT_LIMIT, "script")


def _turn_script(admission: Admission, catalogue: Catalogue, turn: Turn, voice: str, model: str | None, speed: float,
                 caller: Caller | None, reading: Reading, words: bool) -> Script:
    """One turn admitted as a speech request of its own (degrade mode's refusals, the text, word timings)."""
    try:
        return admission.admit(catalogue, turn.text, voice, model, speed, caller, reading, words)
    except InvalidRequest as error:
        param = "voices" if error.param == "voice" else "script" if error.param == "input" else error.param
        raise InvalidRequest(f"script {turn.where} ({turn.speaker}): {error.message}", param, error.code) from None


def _joined_script(turns: tuple[Turn, ...], scripts: tuple[Script, ...]) -> Dialogue:
    """Every turn's passages in one script: a turn starts after the pause that fits who spoke before it."""
    passages, firsts = [], []
    for index, (turn, script) in enumerate(zip(turns, scripts, strict=True)):
        firsts.append(len(passages))
        pause = 0.0 if index == 0 else turn_pause_s(turns[index - 1], turn) + scripts[index - 1].pause_after_s
        first = script.passages[0]
        passages += [replace(first, pause_before_s=pause + (first.pause_before_s or 0.0)), *script.passages[1:]]
    voice = max((script.voice for script in scripts), key=lambda voice: voice.sample_rate)
    model = next(script.model for script in scripts if script.voice == voice)
    return Dialogue(turns, tuple(script.voice for script in scripts), scripts,
                    Script(tuple(passages), voice, model, scripts[-1].pause_after_s), tuple(firsts))


# model families that speak a whole conversation in one context, each speaker's voice prompt in it
CONVERSATION_MODELS = ("vibevoice",)


def _conversation(turns: tuple[Turn, ...], named: list[str], scripts: tuple[Script, ...]) -> Dialogue | None:
    """The dialogue as one conversation, where its speakers' voices are of one model that speaks a conversation in
    one context: one passage, its voice the cast (a speaker each), its lines each turn's text; else None (one
    speaker is a text of several turns, read as any other)."""
    voices = [script.voice for script in scripts]
    if len(named) < 2 or len({script.model for script in scripts}) != 1 or voices[0].model not in CONVERSATION_MODELS:
        return None
    from ..engines.vibevoice import MAX_SPEAKERS as IN_ONE_CONTEXT  # its engine is in use: imported already
    from ..engines.vibevoice import cast_voice, conversation_text

    if len(named) > IN_ONE_CONTEXT:
        extra = next(turn for turn in turns if turn.speaker == named[IN_ONE_CONTEXT])
        raise InvalidRequest(f"script {extra.where}: {extra.speaker!r} is speaker {IN_ONE_CONTEXT + 1}; "
                             f"{voices[0].model} speaks a conversation of at most {IN_ONE_CONTEXT} in one context",
                             "script", ErrorCode.TOO_MANY_SPEAKERS)
    cast = {turn.speaker: voice.name for turn, voice in zip(turns, voices, strict=True)}
    lines = [(named.index(turn.speaker), " ".join(passage.spoken.text for passage in script.passages))
             for turn, script in zip(turns, scripts, strict=True)]
    text = conversation_text(lines)
    passage = replace(scripts[0].passages[0], spoken=SpokenText((), text), voice=replace(voices[0], name=cast_voice(
        [cast[speaker] for speaker in named])), pause_before_s=0.0, whole=True)
    script = Script((passage,), passage.voice, scripts[0].model, scripts[-1].pause_after_s)
    return Dialogue(turns, tuple(voices), scripts, script, (0,) * len(turns), native=True)


def turn_pause_s(before: Turn, turn: Turn) -> float:
    return SAME_SPEAKER_PAUSE_S if before.speaker == turn.speaker else SPEAKER_CHANGE_PAUSE_S


# --- the recording ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TurnSpan:
    speaker: str
    voice: str
    start: float  # seconds from the start of the recording
    end: float

    def as_json(self) -> dict:
        return {"speaker": self.speaker, "voice": self.voice, "start": round(self.start, 3), "end": round(self.end, 3)}


@dataclass(frozen=True)
class Recording:
    """A dialogue's audio, whole: every turn at one speech level, after its pause."""

    audio: np.ndarray  # float32 mono
    sample_rate: int
    turns: tuple[TurnSpan, ...]
    timed: tuple[Timed, ...]  # the words of items queued with their words, timed in the audio

    @property
    def duration_s(self) -> float:
        return self.audio.size / self.sample_rate


def recording(dialogue: Dialogue, items: list[QueuedItem], outputs: list[EngineOutput]) -> Recording:
    """The turns' audio (outputs at the answer's rate, in items' order) joined: each turn's sentences as the speech
    API joins them, the turn scaled to the common level, after the pause before it."""
    rate = dialogue.script.voice.sample_rate
    turns, pauses, spans, timed, at = [], [], [], [], 0
    for turn, indices in enumerate(_turn_indices(dialogue, items)):
        if not indices:  # nothing the voice could say (a turn of "..."): no audio, no pause
            continue
        sentence_pauses = [0.0] + [items[index].pause_s for index in indices[1:]]
        turns.append(matched(join([outputs[index].audio for index in indices], rate, sentence_pauses), rate))
        pauses.append(items[indices[0]].pause_s)
        at += silence(pauses[-1], rate).size
        start = at
        for index, pause in zip(indices, sentence_pauses, strict=True):
            at += silence(pause, rate).size
            timed += timed_words(items[index], outputs[index], at / rate, rate)
            at += outputs[index].audio.size
        spans.append(TurnSpan(*dialogue.who(turn), start / rate, at / rate))
    audio = join([*turns, silence(dialogue.script.pause_after_s, rate)], rate, [*pauses, 0.0])
    return Recording(audio, rate, tuple(spans), tuple(timed))


def _turn_indices(dialogue: Dialogue, items: list[QueuedItem]) -> list[list[int]]:
    """The indices of each turn's items (every turn has some: a turn with nothing to say is refused)."""
    turns: list[list[int]] = [[] for _ in dialogue.turns]
    for index, item in enumerate(items):
        turns[dialogue.turn_of(item.passage)].append(index)
    return turns


class TurnProgress:
    """Tells `on_turn(turns made so far)`, on the event loop it was made on, each time a turn's audio is all made.
    Turns end in whatever order the queue runs them; a conversation spoken natively (one passage) is made all at
    once; a turn with nothing to say is made from the start (and not told)."""

    def __init__(self, dialogue: Dialogue, items: list[QueuedItem], on_turn: Callable[[int], None]):
        self._loop, self._on_turn = asyncio.get_running_loop(), on_turn
        groups = _turn_indices(dialogue, items)
        self._weights = [len(groups)] + [0] * (len(groups) - 1) if dialogue.native else [1] * len(groups)
        self._left = [len(group) for group in groups]
        self.made = sum(weight for weight, left in zip(self._weights, self._left, strict=True) if not left)
        for turn, group in enumerate(groups):
            for index in group:
                items[index].future.add_done_callback(lambda future, turn=turn: self._item_done(future, turn))

    def _item_done(self, future: Future, turn: int) -> None:
        """On the engine's thread (or here, if it was done already): counted on the event loop."""
        if not future.cancelled() and future.exception() is None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: no one is left to tell
                self._loop.call_soon_threadsafe(self._count, turn)

    def _count(self, turn: int) -> None:
        self._left[turn] -= 1
        if self._left[turn] == 0:
            self.made += self._weights[turn]
            self._on_turn(self.made)


def captions(dialogue: Dialogue, timed: Sequence[Timed]) -> list[CaptionWord]:
    """The script's words, each with its speaker and when it is spoken (named as written in its turn)."""
    by_turn: dict[int, list[Timed]] = {}
    for each in (Timed(*each) for each in timed):
        turn = dialogue.turn_of(each.passage)
        by_turn.setdefault(turn, []).append(each._replace(passage=each.passage - dialogue.first_passages[turn]))
    return [replace(word, speaker=dialogue.turns[turn].speaker) for turn, words in sorted(by_turn.items())
            for word in caption_words(dialogue.turn_scripts[turn], dialogue.turns[turn].text, words)]


# --- streamed -----------------------------------------------------------------------------------------------

class _LaterTurn:
    """The metrics a later turn's stream reports to: its audio counts; its first audio is not the request's, nor
    its pieces the request's count."""

    class _Unobserved:
        def observe(self, value: float) -> None:
            pass

    def __init__(self, metrics: Metrics):
        self.audio_seconds = metrics.audio_seconds
        self.chunks_per_request = self._Unobserved()

    def first_audio(self, seconds: float) -> None:
        pass


class DialogueStream:
    """A dialogue's audio as it is made, turn by turn, strictly in order (first audio once the first turn's first
    piece is ready). A turn's level is set by its first piece (the rest is not there yet). Closing it, or leaving
    a loop over it early, takes every turn's pieces not yet synthesized out of the queue."""

    def __init__(self, dialogue: Dialogue, items: list[QueuedItem], started: float, metrics: Metrics,
                 run_allowance_s: float):
        self.dialogue, self.sample_rate = dialogue, dialogue.script.voice.sample_rate
        script = replace(dialogue.script, pause_after_s=0.0)
        self._streams = [SentenceStream(script, [items[index] for index in indices], started,
                                        metrics if turn == 0 else _LaterTurn(metrics), run_allowance_s)
                         for turn, indices in enumerate(_turn_indices(dialogue, items))]

    async def timed(self) -> AsyncIterator[tuple[np.ndarray, list[CaptionWord]]]:
        """The pieces, each with its words (items queued with their words), timed from the stream's start."""
        played = 0
        try:
            for stream in self._streams:
                gain = None
                async for piece, timed in stream.timed():
                    gain = gain_for(piece, self.sample_rate) if gain is None else gain
                    offset = played / self.sample_rate
                    words = captions(self.dialogue, [each._replace(start=each.start + offset, end=each.end + offset)
                                                     for each in timed])
                    played += piece.size
                    yield scaled(piece, gain), words
            if self.dialogue.script.pause_after_s:
                yield silence(self.dialogue.script.pause_after_s, self.sample_rate), []
        finally:
            self.close()

    def close(self) -> None:
        for stream in self._streams:
            stream.close()

    async def encoded(self, response_format: str, sample_rate: int | None = None
                      ) -> AsyncIterator[tuple[bytes, float, list[CaptionWord]]]:
        """The stream encoded as one file (as SentenceStream.encoded): (bytes, seconds of audio, their words)."""
        async for encoded in encoded_stream(self, response_format, sample_rate):
            yield encoded
