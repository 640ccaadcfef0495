"""The speak panel: the text, its character counter, speed and format; the Synthesize button, the player
that plays each sentence as it is made, and the words said so far."""

from __future__ import annotations

import asyncio
import html
import re
import time
from collections.abc import Sequence

import gradio as gr
import numpy as np

from tts_core.audio.encoding import encode
from tts_core.errors import ChorusError
from tts_core.request.access import Caller
from tts_core.request.admission import MAX_SPEED, MIN_SPEED
from tts_core.request.ask import Ask
from tts_core.request.assembly import SentenceStream
from tts_core.request.captions import CaptionWord, caption_words, every_subtitle
from tts_core.service import Tally
from tts_core.text.frontend import nothing_to_say

from . import browser, takes
from .context import UiContext, log, refused
from .voices import voice_label

UI_FORMATS = ["mp3", "wav", "opus", "flac", "aac"]  # pcm has no header, so browsers cannot play it
KEEP_FILES_S = 3600  # Gradio deletes files older than this, this often; api/uploads.py counts uploads kept for twice it
PRUNE_EVERY_S = 60  # sweeping the folder on every request would cost a directory scan each time
MIN_PIECE_S = 0.5  # pieces shorter than this (a stepped engine's frames) go to the player together
TRAILING_PUNCTUATION = re.compile(r"[^\w\s]*")
FIELDS = {"voice": 1, "speed": 2, "response_format": 3}  # the synthesis's inputs after the text (0), by param
EMPTY_TEXT = str(nothing_to_say("", ""))  # the server's refusal of an empty text, in its words


def words_html(text: str, words: Sequence[CaptionWord], timed: bool, done: bool = False) -> str:
    """The text as the caller wrote it (its punctuation and line breaks kept), each caption word a span
    with when it is spoken (the player marks the one it plays); escaped, as it is the caller's text. Until
    the take is done, the text up to the last word said (and the punctuation right after it)."""
    if not timed:
        return '<p class="chorus-untimed">This voice cannot time its words.</p>'
    shown = len(text) if done else TRAILING_PUNCTUATION.match(text, words[-1].input_end).end() if words else 0
    parts, at = [], 0
    for word in words:
        start = max(at, word.input_start)
        parts.append(html.escape(text[at:start]))
        parts.append(f'<span class="chorus-word" data-start="{word.start:.3f}" data-end="{word.end:.3f}">'
                     f"{html.escape(text[start:word.input_end])}</span>")
        at = max(at, word.input_end)
    parts.append(html.escape(text[at:max(at, shown)]))
    return f'<p class="chorus-words">{"".join(parts).strip()}</p>'


def counter_html(limit: int, tier: str | None) -> str:
    """What the character counter starts from: the caller's limit (its tier's, within the server's); and what the
    page says of an empty text, as the server would (the page answers it without asking: browser.EMPTY_TEXT_JS)."""
    return (f'<span class="chorus-count" data-limit="{limit}" data-empty="{html.escape(EMPTY_TEXT)}">0</span>'
            f' / {limit:,} characters'
            + (f" ({html.escape(tier)} tier)" if tier else ""))


class SpeakPanel:
    def __init__(self, context: UiContext):
        self.context = context
        self.next_prune = 0.0

    def render_inputs(self) -> None:
        """The text, its counter, speed and format (the left column)."""
        limit = self.context.settings.max_chars
        # a hint, not a sample: grey words in the box read as words that will be spoken
        self.text = gr.Textbox(label="Text to speak", lines=6, max_length=limit, elem_id="speech-text",
                               placeholder="Type or paste the text to speak…")
        self.counter = gr.HTML(counter_html(limit, None), elem_id="char-counter",
                               js_on_load=browser.COUNTER_JS + browser.EMPTY_TEXT_JS,
                               css_template=browser.COUNTER_CSS)
        with gr.Row():
            self.speed = gr.Slider(MIN_SPEED, MAX_SPEED, value=1.0, step=0.05, label="Speed", min_width=160)
            self.response_format = gr.Dropdown(UI_FORMATS, value="mp3", label="Format", min_width=120)

    def render_player(self, voice: gr.Dropdown):
        """The button (below both columns, so that a phone, the columns stacked, shows the text, the voice, then
        the button), the player and the words; returns the synthesis's event, for the history to follow."""
        button = gr.Button("Synthesize", variant="primary", elem_id="synthesize")
        self.player = gr.HTML("", html_template=browser.PLAYER_HTML, js_on_load=browser.PLAYER_JS,
                              css_template=browser.PLAYER_CSS, elem_id="speech-player")
        self.captions = gr.HTML(elem_id="speech-words", js_on_load=None, css_template=browser.WORDS_CSS)
        return button.click(self.synthesize, [self.text, voice, self.speed, self.response_format],
                            [self.player, self.captions], api_name="synthesize", concurrency_limit=None,
                            validator=self.check)

    def for_caller(self, caller: Caller | None) -> tuple[gr.Textbox, str]:
        """The text box and counter for the caller's limit (its tier's, within the server's)."""
        limit = self.context.settings.max_chars
        if caller:
            limit = min(caller.tier.max_chars, limit)
        return gr.Textbox(max_length=limit), counter_html(limit, caller.tier_name if caller else None)

    def check(self, text: str, voice: str, speed: float, response_format: str, request: gr.Request) -> list[dict]:
        """The request's text, voice and speed checked before it is queued (Gradio's validator): a refusal is
        one message at the input at fault, and the take before stays in the player."""
        started, caller = time.perf_counter(), self.context.caller_of(request)
        try:
            self.context.service.validate(Ask(text or "", voice, speed=float(speed), caller=caller))
        except ChorusError as error:
            log.info("UI request refused (%d %s): %s", error.status, error.code, error.message)
            client = caller.identity if caller else request.client.host if request and request.client else "unknown"
            self.context.service.account("ui", client, error.status, started, len(text or ""))
            at_fault = FIELDS.get(error.param or "", 0)
            return [gr.validate(index != at_fault, error.message) for index in range(4)]
        return [gr.validate(True, "")] * 4

    async def open_stream(self, text: str, voice: str, speed: float, caller: Caller, tally: Tally
                          ) -> tuple[SentenceStream, bool]:
        """The stream, with its words timed where the voice's model can time them (its declared capabilities);
        True if they are. Its pieces are raw (pcm): the player plays them, the take's file is encoded whole."""
        service = self.context.service
        timed = service.times_words(voice, caller.identity if caller else None)
        ask = Ask(text, voice, speed=speed, response_format="pcm", words=timed, stream=True, caller=caller)
        return await service.answer(ask, tally), timed

    async def new_take(self) -> takes.Take:
        if time.monotonic() >= self.next_prune:
            self.next_prune = time.monotonic() + PRUNE_EVERY_S
            await asyncio.to_thread(takes.prune, self.context.out_dir, KEEP_FILES_S)
        return await asyncio.to_thread(takes.Take, self.context.out_dir)

    async def synthesize(self, text: str, voice: str, speed: float, response_format: str, request: gr.Request):
        """Plays each sentence as it is synthesized, with the words said so far, then offers the whole
        text as a file, and its subtitles."""
        text = text or ""
        client = request.client.host if request and request.client else "unknown"
        try:  # accounted when the block ends: a browser that leaves (or stops the event) is a 499
            with self.context.service.tally("ui", client, len(text)) as tally:
                caller, _ = await self.context.admit(request)
                tally.client = caller.identity
                stream, timing = await self.open_stream(text, voice, float(speed), caller, tally)
                pieces, pending, timed, words = [], [], [], []
                take, rate = await self.new_take(), stream.sample_rate
                async for piece, piece_words in stream.timed():
                    pieces.append(piece)
                    pending.append(piece)
                    timed += piece_words
                    if sum(part.size for part in pending) >= MIN_PIECE_S * rate:
                        words = caption_words(stream.script, text, timed)
                        await asyncio.to_thread(take.add_piece, np.concatenate(pending), rate)
                        pending = []
                        yield take.player(), words_html(text, words, timing)
                if pending:
                    words = caption_words(stream.script, text, timed)
                    await asyncio.to_thread(take.add_piece, np.concatenate(pending), rate)
                audio = np.concatenate(pieces)
                tally.audio_s = audio.size / rate
                data = await asyncio.to_thread(encode, audio, rate, response_format)
                markup = words_html(text, words, timing, done=True)
                captions = every_subtitle(words) if words else {}
                path = await asyncio.to_thread(take.finish, data, takes.file_stem(stream.voice.name, text),
                                               response_format, captions, markup)
                done = take.player(done=True, **takes.downloads(path), text=text[:500],
                                   label=voice_label(stream.voice), at=time.time(), duration_s=round(tally.audio_s, 2))
                yield done, markup
        except ChorusError as error:
            raise refused(error) from None
        except Exception:
            log.exception("UI synthesis failed")
            raise gr.Error("synthesis failed: an internal error (logged on the server)") from None
