"""The Gradio synthesis tab. It submits through the same SpeechService (and batcher) as the API, and
clones voices through the same VoiceClones; the voice list is the browser's caller's (its own cloned
voices, and the public ones). The player, the counter and the lists' buttons run in the browser
(ui/browser.py); each synthesis's files and the history are in ui/takes.py."""

from __future__ import annotations

import asyncio
import base64
import html
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import gradio as gr
import numpy as np
import pydantic_core

from api.accounting import account
from clones import VoiceClones
from storage import StorageError
from storage.request_log import RequestLogWriter
from tts_core.access import Caller
from tts_core.admission import MAX_SPEED, MIN_SPEED
from tts_core.audio import encode
from tts_core.captions import SUBTITLE_FORMATS, CaptionWord, caption_words, subtitles
from tts_core.engines import Capabilities
from tts_core.errors import ChorusError, InvalidRequest, StorageUnavailable
from tts_core.scheduling import SentenceStream
from tts_core.service import SpeechService

from . import browser, takes
from .voices import language_choices, sample_text, voice_choices, voice_label, voice_list_html

log = logging.getLogger(__name__)
UI_FORMATS = ["mp3", "wav", "opus", "flac", "aac"]  # pcm has no header, so browsers cannot play it
KEEP_FILES_S = 3600  # Gradio deletes files older than this, this often; api/uploads.py counts uploads kept for twice it
PRUNE_EVERY_S = 60  # sweeping the folder on every request would cost a directory scan each time
MIN_PIECE_S = 0.5  # pieces shorter than this (a stepped engine's frames) go to the player together
PREVIEWS_KEPT = 64  # voice samples kept in memory
TRAILING_PUNCTUATION = re.compile(r"[^\w\s]*")
FIELDS = {"voice": 1, "speed": 2, "response_format": 3}  # the synthesis's inputs after the text (0), by param


def refused(error: ChorusError) -> gr.Error:
    """An expected refusal (a limit, a bad input) shown to the user, and one line in the log: no traceback."""
    log.info("UI request refused (%d %s): %s", error.status, error.code, error.message)
    return gr.Error(error.message, print_exception=False)


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
    """What the character counter starts from: the caller's limit (its tier's, within the server's)."""
    return (f'<span class="chorus-count" data-limit="{limit}">0</span> / {limit:,} characters'
            + (f" ({html.escape(tier)} tier)" if tier else ""))


Admit = Callable[[gr.Request], Awaitable[tuple[Caller, object]]]  # identifies and rate-limits a UI caller
Identify = Callable[[gr.Request], Caller]  # identifies a UI caller (counting nothing)


def _read_upload(path: str, limit: int) -> bytes:
    """The clip Gradio kept; its upload was bounded already, this keeps a recording to the API's limit."""
    if Path(path).stat().st_size > limit:
        raise InvalidRequest(f"the clip is larger than {limit} bytes (TTS_MAX_BODY_BYTES)", "audio", "body_too_large")
    return Path(path).read_bytes()


def build_ui(service: SpeechService, admit: Admit, identify: Identify, clones: VoiceClones,
             request_log: RequestLogWriter | None = None, extra_tabs: Sequence[Callable[[], None]] = ()) -> gr.Blocks:
    """The app's page: the synthesis tab, then each extra tab (the composition root adds Admin)."""
    out_dir = (service.settings.data_dir / "ui").resolve()  # kept with the server's other data (a volume)
    out_dir.mkdir(parents=True, exist_ok=True)
    gr.set_static_paths([out_dir])  # the player fetches the pieces from it, the history links the files
    metrics = service.metrics
    next_prune = 0.0
    previews: dict[tuple, str] = {}  # (voice, its clone record) -> its sample, mp3 in base64

    async def open_stream(text: str, voice: str, speed: float, caller: Caller) -> tuple[SentenceStream, bool]:
        """The stream, with its words timed where the voice's model can time them (its declared capabilities);
        True if they are."""
        catalogue = service.catalogue
        _, model = catalogue.resolve_voice(voice, None, caller.identity if caller else None)
        timed = catalogue.capabilities.get(model, Capabilities()).times_words
        return await service.stream_pieces(text, voice, None, speed, caller, words=timed), timed

    async def new_take() -> takes.Take:
        nonlocal next_prune
        if time.monotonic() >= next_prune:
            next_prune = time.monotonic() + PRUNE_EVERY_S
            await asyncio.to_thread(takes.prune, out_dir, KEEP_FILES_S)
        return await asyncio.to_thread(takes.Take, out_dir)

    def answered(status: int, started: float, client: str, characters: int, audio_s: float = 0.0, **details):
        account(metrics, request_log, source="ui", client=client, status=status, started=started,
                characters=characters, audio_s=audio_s, **details)

    def check(text: str, voice: str, speed: float, response_format: str, request: gr.Request) -> list[dict]:
        """The request's text, voice and speed checked before it is queued (Gradio's validator): a refusal is
        one message at the input at fault, and the take before stays in the player."""
        started, caller = time.perf_counter(), caller_of(request)
        try:
            service.validate(text or "", voice, None, float(speed), caller)
        except ChorusError as error:
            log.info("UI request refused (%d %s): %s", error.status, error.code, error.message)
            client = caller.identity if caller else request.client.host if request and request.client else "unknown"
            answered(error.status, started, client, len(text or ""))
            at_fault = FIELDS.get(error.param or "", 0)
            return [gr.validate(index != at_fault, error.message) for index in range(4)]
        return [gr.validate(True, "")] * 4

    async def synthesize(text: str, voice: str, speed: float, response_format: str, request: gr.Request):
        """Plays each sentence as it is synthesized, with the words said so far, then offers the whole
        text as a file, and its subtitles."""
        started, status, details, audio_s = time.perf_counter(), 200, {}, 0.0
        client = request.client.host if request and request.client else "unknown"
        text = text or ""
        try:
            caller, _ = await admit(request)
            client = caller.identity
            stream, timing = await open_stream(text, voice, float(speed), caller)
            details, pieces, pending, timed, words = {"voice": stream.voice.name}, [], [], [], []
            take, rate = await new_take(), stream.sample_rate
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
            audio_s = audio.size / rate
            data = await asyncio.to_thread(encode, audio, rate, response_format)
            markup = words_html(text, words, timing, done=True)
            captions = {kind: subtitles(words, kind) for kind in SUBTITLE_FORMATS} if words else {}
            path = await asyncio.to_thread(take.finish, data, takes.file_stem(stream.voice.name, text),
                                           response_format, captions, markup)
            done = take.player(done=True, **takes.downloads(path), text=text[:500], label=voice_label(stream.voice),
                               at=time.time(), duration_s=round(audio_s, 2))
            yield done, markup
        except ChorusError as error:
            status = error.status
            raise refused(error) from None
        except (asyncio.CancelledError, GeneratorExit):  # the browser left (or stopped the event)
            status = 499
            raise
        except Exception:
            status = 500
            log.exception("UI synthesis failed")
            raise gr.Error("synthesis failed: an internal error (logged on the server)") from None
        finally:
            answered(status, started, client, len(text), audio_s, **details)

    def remember(player: str, history: list):
        """The take just made, first in the browser's history."""
        try:  # the browser's word; pydantic's parser bounds nesting (json.loads recurses until the stack runs out)
            value = pydantic_core.from_json(player or "{}")
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise gr.Error("that take could not be kept in the history", print_exception=False)
        entry = {key: value.get(key) for key in ("take", "name", "text", "label", "at", "duration_s")}
        kept = takes.entries([entry, *(history or [])], out_dir)
        return kept, takes.history_html(kept, out_dir)

    def replay(history: list, event: gr.EventData) -> tuple[str, str]:
        take = getattr(event, "take", None)
        entry = next((entry for entry in takes.entries(history, out_dir) if entry["take"] == take), None)
        if entry is None:
            raise gr.Error("that synthesis is gone (files are kept for an hour)", print_exception=False)
        return takes.replay(entry, out_dir)

    def forget(history: list, event: gr.EventData) -> tuple[list, str]:
        kept = takes.forget(history, getattr(event, "take", None), out_dir)
        return kept, takes.history_html(kept, out_dir)

    def readiness() -> str:
        if service.ready:
            return "", gr.Timer(active=False)
        return "**Warming up:** requests wait until the voices are loaded and warmed up.", gr.Timer(active=True)

    def caller_of(request: gr.Request) -> Caller | None:
        try:
            return identify(request)
        except ChorusError:  # no key where keys are required: the voices everyone may use
            return None

    def identity_of(request: gr.Request) -> str | None:
        caller = caller_of(request)
        return caller.identity if caller else None

    def pick_language(language: str, request: gr.Request) -> gr.Dropdown:
        """The voices that speak the language, the language's own voice chosen (every voice for "")."""
        caller, catalogue = identity_of(request), service.catalogue
        chosen = catalogue.voice_for_language(language, None, caller)[0].name if language else catalogue.default_voice
        return gr.Dropdown(choices=voice_choices(catalogue, caller, language), value=chosen)

    def show_voices(language: str, chosen: str, request: gr.Request) -> str:
        return voice_list_html(service.catalogue, identity_of(request), language or "", chosen)

    def choose(event: gr.EventData) -> str:
        return getattr(event, "voice", None) or gr.skip()

    async def preview(event: gr.EventData, request: gr.Request) -> str:
        """A short sample of the voice, made once (and counted against the caller's limit then)."""
        name, catalogue = str(getattr(event, "voice", "")), service.catalogue
        try:
            found = catalogue.voices.get(name) if catalogue.visible(name, identity_of(request)) else None
            if found is None:
                raise InvalidRequest(f"voice {name!r} does not exist", "voice", "voice_not_found")
            key = (name, catalogue.clones.get(name))  # a clone made again under its name is a new voice
            if key not in previews:
                caller, _ = await admit(request)
                spoken = await service.speak(sample_text(found[0]), name, caller=caller, response_format="mp3")
                if len(previews) >= PREVIEWS_KEPT:
                    previews.pop(next(iter(previews)))
                previews[key] = base64.b64encode(spoken.data).decode()
        except ChorusError as error:
            raise refused(error) from None
        return (f'<p>{html.escape(voice_label(found[0]))}: “{html.escape(sample_text(found[0]))}”</p>'
                f'<audio controls autoplay data-at="{time.time()}" src="data:audio/mpeg;base64,{previews[key]}">'
                "</audio>")

    async def clone(clip: str | None, name: str, model: str | None, transcript: str, consent: bool,
                    request: gr.Request):
        """A voice from the clip, then the caller's voice list with it chosen."""
        try:
            caller, _ = await admit(request)
            if not clip:
                raise InvalidRequest("record or upload a clip of the voice first", "audio")
            data = await asyncio.to_thread(_read_upload, clip, service.settings.max_body_bytes)
            record = await clones.create(caller, data, (name or "").strip(), model or "", bool(consent),
                                         (transcript or "").strip() or None)
        except ChorusError as error:
            raise refused(error) from None
        except StorageError:
            raise refused(StorageUnavailable()) from None
        return (f"Voice **{record['name']}** is ready ({record['duration_s']:.1f} s clip); it is yours to use "
                "until an admin makes it public.",
                gr.Dropdown(choices=voice_choices(service.catalogue, caller.identity), value=record["name"]))

    def render_cloning(voice: gr.Dropdown) -> gr.Dropdown:
        """The "Clone a voice" panel; returns its model list (refreshed as the page loads)."""
        with gr.Accordion("Clone a voice", open=False):
            gr.Markdown("Upload or record 3 to 30 s of one person speaking (wav, mp3, flac or ogg). "
                        "The new voice is yours to use; an admin may make it public.")
            with gr.Row():
                clip = gr.Audio(sources=["upload", "microphone"], type="filepath", label="Clip", scale=2)
                with gr.Column(scale=2):
                    name = gr.Textbox(label="Voice name", max_length=48, placeholder="letters, digits, . _ -")
                    models = service.cloner.models()
                    model = gr.Dropdown(models, value=models[0] if models else None, label="Model (one that can clone)")
                    transcript = gr.Textbox(label="What the clip says (optional)", lines=2)
                    consent = gr.Checkbox(label="The speaker consents to this clone of their voice")
                    clone_button = gr.Button("Clone", elem_id="clone-voice")
            result = gr.Markdown()
            clone_button.click(clone, [clip, name, model, transcript, consent], [result, voice],
                               api_name="clone_voice", concurrency_limit=4)
        return model

    catalogue, limit = service.catalogue, service.settings.max_chars
    with gr.Blocks(title="Chorus", delete_cache=(KEEP_FILES_S, KEEP_FILES_S)) as demo:
        gr.Markdown("# Chorus\nType text, pick a voice, hear it. "
                    "The same server answers the OpenAI-compatible API at `/v1/audio/speech`.")
        status = gr.Markdown()
        history = gr.BrowserState([], storage_key="chorus-history")
        with gr.Tab("Synthesize"):
            with gr.Row():
                with gr.Column(scale=3, min_width=320):
                    # a hint, not a sample: grey words in the box read as words that will be spoken
                    text = gr.Textbox(label="Text to speak", lines=6, max_length=limit, elem_id="speech-text",
                                      placeholder="Type or paste the text to speak…")
                    counter = gr.HTML(counter_html(limit, None), elem_id="char-counter",
                                      js_on_load=browser.COUNTER_JS, css_template=browser.COUNTER_CSS)
                    with gr.Row():
                        speed = gr.Slider(MIN_SPEED, MAX_SPEED, value=1.0, step=0.05, label="Speed", min_width=160)
                        response_format = gr.Dropdown(UI_FORMATS, value="mp3", label="Format", min_width=120)
                with gr.Column(scale=2, min_width=300):
                    language = gr.Dropdown(language_choices(catalogue), value="", label="Language")
                    voice = gr.Dropdown(voice_choices(catalogue), value=catalogue.default_voice, label="Voice")
                    voice_list = gr.HTML(voice_list_html(catalogue, None, "", catalogue.default_voice),
                                         elem_id="voice-list", max_height=320, js_on_load=browser.VOICES_JS,
                                         css_template=browser.VOICES_CSS)
                    preview_box = gr.HTML(elem_id="voice-preview", js_on_load=browser.PREVIEW_JS)
            # below both columns, so that a phone (the columns stacked) shows the text, the voice, then the button
            button = gr.Button("Synthesize", variant="primary", elem_id="synthesize")
            language.change(pick_language, [language], [voice], api_name="pick_language")
            voice.change(show_voices, [language, voice], [voice_list], api_visibility="private")
            voice_list.choose(choose, None, [voice], api_visibility="private")
            voice_list.preview(preview, None, [preview_box], api_visibility="private", concurrency_limit=4)
            player = gr.HTML("", html_template=browser.PLAYER_HTML, js_on_load=browser.PLAYER_JS,
                             css_template=browser.PLAYER_CSS, elem_id="speech-player")
            captions = gr.HTML(elem_id="speech-words", js_on_load=None, css_template=browser.WORDS_CSS)
            with gr.Accordion("History", open=True):
                history_box = gr.HTML(takes.history_html([], out_dir), elem_id="speech-history",
                                      js_on_load=browser.HISTORY_JS, css_template=browser.HISTORY_CSS)
            button.click(synthesize, [text, voice, speed, response_format], [player, captions], api_name="synthesize",
                         concurrency_limit=None, validator=check
                         ).success(remember, [player, history], [history, history_box], api_visibility="private")
            history_box.replay(replay, [history], [player, captions], api_visibility="private")
            history_box.forget(forget, [history], [history, history_box], api_visibility="private")
            clone_models = render_cloning(voice)
        for render_tab in extra_tabs:
            render_tab()
        warm_up_timer = gr.Timer(1.0, active=False)
        demo.load(readiness, None, [status, warm_up_timer])

        def page(stored: list, request: gr.Request):  # the caller's, and the registry may have been reloaded
            models, catalogue = service.cloner.models(), service.catalogue
            caller = caller_of(request)
            identity = caller.identity if caller else None
            limit = min(caller.tier.max_chars, service.settings.max_chars) if caller else service.settings.max_chars
            kept = takes.entries(stored, out_dir)
            return (gr.Dropdown(choices=voice_choices(catalogue, identity)),
                    gr.Dropdown(choices=language_choices(catalogue, identity), value=""),
                    gr.Dropdown(choices=models, value=models[0] if models else None),
                    gr.Textbox(max_length=limit), counter_html(limit, caller.tier_name if caller else None),
                    voice_list_html(catalogue, identity, "", catalogue.default_voice),
                    kept, takes.history_html(kept, out_dir))

        demo.load(page, [history], [voice, language, clone_models, text, counter, voice_list, history, history_box])
        warm_up_timer.tick(readiness, None, [status, warm_up_timer], api_visibility="private")
    return demo
