"""The Gradio synthesis tab. It submits through the same SpeechService (and batcher) as the API, and
clones voices through the same VoiceClones; the voice list is the browser's caller's (its own cloned
voices, and the public ones)."""

from __future__ import annotations

import asyncio
import html
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import gradio as gr
import numpy as np

from clones import VoiceClones
from storage import StorageError
from storage.request_log import RequestLogWriter
from tts_core.access import Caller
from tts_core.admission import MAX_SPEED, MIN_SPEED
from tts_core.audio import encode
from tts_core.captions import SUBTITLE_FORMATS, CaptionWord, caption_words, subtitles
from tts_core.catalogue import speaks
from tts_core.errors import ChorusError, InvalidRequest, StorageUnavailable
from tts_core.lexicon import language_code
from tts_core.scheduling import SentenceStream
from tts_core.service import SpeechService

log = logging.getLogger(__name__)
UI_FORMATS = ["mp3", "wav", "opus", "flac", "aac"]  # pcm has no header, so browsers cannot play it
KEEP_FILES_S = 3600  # Gradio deletes files older than this, this often; api/uploads.py counts uploads kept for twice it
PRUNE_EVERY_S = 60  # sweeping the folder on every request would cost a directory scan each time


def refused(error: ChorusError) -> gr.Error:
    """An expected refusal (a limit, a bad input) shown to the user, and one line in the log: no traceback."""
    log.info("UI request refused (%d %s): %s", error.status, error.code, error.message)
    return gr.Error(error.message, print_exception=False)


def _prune(folder: Path, older_than_s: float) -> None:
    limit = time.time() - older_than_s
    for path in folder.glob("*"):
        if path.stat().st_mtime < limit:
            path.unlink(missing_ok=True)


def words_html(words: Sequence[CaptionWord], timed: bool) -> str:
    """The caption words, each a span with when it is spoken (the highlighter reads them); escaped, as
    they are the caller's text."""
    if not timed:
        return '<p class="chorus-untimed">This voice cannot time its words.</p>'
    return " ".join(f'<span class="chorus-word" data-start="{word.start:.3f}" data-end="{word.end:.3f}">'
                    f"{html.escape(word.word)}</span>" for word in words)


# Installed once per page: marks the word whose [start, end) holds the speech player's time, every frame
# while it plays (timeupdate alone fires ~4 times a second) and on each seek or timeupdate. Media events do
# not bubble, so they are caught on the document in the capture phase, from whichever <audio> is inside
# the player now (Gradio may make a new one for each answer).
HIGHLIGHTER = """
if (!window.chorusHighlighter) {
  window.chorusHighlighter = true;
  let current = null, frame = 0;
  const mark = (time) => {
    const spans = document.querySelectorAll('#speech-words .chorus-word');
    const next = [...spans].find(span => +span.dataset.start <= time && time < +span.dataset.end) || null;
    if (next === current) return;
    current?.classList.remove('spoken');
    next?.classList.add('spoken');
    current = next;
  };
  const follow = (event) => {
    const audio = event.target;
    if (!(audio instanceof HTMLMediaElement) || !audio.closest('#speech-player')) return;
    cancelAnimationFrame(frame);
    mark(audio.currentTime);
    if (!audio.paused && !audio.ended) frame = requestAnimationFrame(() => follow(event));
  };
  for (const type of ['play', 'playing', 'timeupdate', 'seeked', 'pause', 'ended']) {
    document.addEventListener(type, follow, true);
  }
}
"""
WORDS_CSS = (".chorus-word.spoken { background: var(--color-accent); color: var(--button-primary-text-color); "
             "border-radius: 2px; box-shadow: 0 0 0 2px var(--color-accent); }")  # the Synthesize button's colours


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
    # Gradio encodes a streaming player's audio with ffmpeg; without it the player gets the whole file.
    streaming = shutil.which("ffmpeg") is not None
    if not streaming:
        log.warning("ffmpeg is not on PATH: the UI plays speech once it is complete instead of streaming it")
    out_dir = Path(tempfile.gettempdir()) / "chorus-ui"
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = service.metrics
    next_prune = 0.0

    async def open_stream(text: str, voice: str, speed: float, caller: Caller) -> tuple[SentenceStream, bool]:
        """The stream, with its words timed where the voice can time them (the scheduler knows, once the
        voice's model is loaded: a Piper voice's phonemes decide); True if they are."""
        try:
            return await service.stream_pieces(text, voice, None, speed, caller, words=True), True
        except InvalidRequest as error:
            if error.code != "timestamps_unsupported":
                raise
        return await service.stream_pieces(text, voice, None, speed, caller), False

    def save(data: bytes, response_format: str, words: list[CaptionWord]) -> tuple[str, list[str] | None]:
        """The audio file, and its subtitles beside it (if its words are timed)."""
        path = out_dir / f"chorus-{uuid.uuid4().hex[:12]}.{response_format}"
        path.write_bytes(data)
        if not words:
            return str(path), None
        for kind in SUBTITLE_FORMATS:
            path.with_suffix(f".{kind}").write_text(subtitles(words, kind), encoding="utf-8")
        return str(path), [str(path.with_suffix(f".{kind}")) for kind in SUBTITLE_FORMATS]

    async def synthesize(text: str, voice: str, speed: float, response_format: str, request: gr.Request):
        """Plays each sentence as it is synthesized, with the words said so far, then offers the whole
        text as a file, and its subtitles."""
        nonlocal next_prune
        started, status, details, audio_s = time.perf_counter(), 200, {}, 0.0
        client = request.client.host if request and request.client else "unknown"
        text = text or ""
        try:
            caller, _ = await admit(request)
            client = caller.identity
            stream, timing = await open_stream(text, voice, float(speed), caller)
            details, pieces, timed, words = {"voice": stream.voice.name}, [], [], []
            async for piece, piece_words in stream.timed():
                pieces.append(piece)
                timed += piece_words
                words = caption_words(stream.script, text, timed)
                chunk = await asyncio.to_thread(encode, piece, stream.sample_rate, "wav") if streaming else gr.skip()
                yield chunk, words_html(words, timing), gr.skip(), gr.skip()
            audio = np.concatenate(pieces)
            audio_s = audio.size / stream.sample_rate
            data = await asyncio.to_thread(encode, audio, stream.sample_rate, response_format)
            if time.monotonic() >= next_prune:
                next_prune = time.monotonic() + PRUNE_EVERY_S
                await asyncio.to_thread(_prune, out_dir, KEEP_FILES_S)
            path, subtitle_paths = await asyncio.to_thread(save, data, response_format, words)
            yield gr.skip() if streaming else path, gr.skip(), path, subtitle_paths
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
            metrics.request_answered("ui", status, time.perf_counter() - started, audio_s)
            if request_log is not None:
                request_log.record(client=client, source="ui", status=status, characters=len(text or ""),
                                   **details)

    def readiness() -> str:
        if service.ready:
            return "", gr.Timer(active=False)
        return "**Warming up:** requests wait until the voices are loaded and calibrated.", gr.Timer(active=True)

    def caller_of(request: gr.Request) -> str | None:
        try:
            return identify(request).identity
        except ChorusError:  # no key where keys are required: the voices everyone may use
            return None

    def voice_choices(caller: str | None = None, language: str = "") -> list[tuple[str, str]]:
        catalogue = service.catalogue
        return [(f"{voice.name} ({voice.language}, {engine}{', cloned' if voice.name in catalogue.clones else ''})",
                 voice.name) for voice, engine in catalogue.visible_voices(caller)
                if not language or speaks(voice, language)]

    def language_choices(caller: str | None = None) -> list[tuple[str, str]]:
        codes = sorted({language_code(voice.language) for voice in service.catalogue.voice_list(caller)})
        return [("Any language", "")] + [(code, code) for code in codes]

    def pick_language(language: str, request: gr.Request) -> gr.Dropdown:
        """The voices that speak the language, the language's own voice chosen (every voice for "")."""
        caller, catalogue = caller_of(request), service.catalogue
        chosen = catalogue.voice_for_language(language, None, caller)[0].name if language else catalogue.default_voice
        return gr.Dropdown(choices=voice_choices(caller, language), value=chosen)

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
                gr.Dropdown(choices=voice_choices(caller.identity), value=record["name"]))

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

    with gr.Blocks(title="Chorus", delete_cache=(KEEP_FILES_S, KEEP_FILES_S)) as demo:
        gr.Markdown("# Chorus\nType text, pick a voice, hear it. "
                    "The same server answers the OpenAI-compatible API at `/v1/audio/speech`.")
        status = gr.Markdown()
        with gr.Tab("Synthesize"):
            with gr.Row():
                with gr.Column(scale=3):
                    text = gr.Textbox(label="Text", lines=6, max_length=service.settings.max_chars,
                                      placeholder="Hello! This is Chorus speaking.")
                with gr.Column(scale=2):
                    language = gr.Dropdown(language_choices(), value="", label="Language")
                    voice = gr.Dropdown(voice_choices(), value=service.catalogue.default_voice, label="Voice")
                    language.change(pick_language, [language], [voice], api_name="pick_language")
                    speed = gr.Slider(MIN_SPEED, MAX_SPEED, value=1.0, step=0.05, label="Speed")
                    response_format = gr.Dropdown(UI_FORMATS, value="mp3", label="Format")
                    button = gr.Button("Synthesize", variant="primary", elem_id="synthesize")
            # The browser's own player, streaming or not (no waveform): an <audio> in the page, whose time the
            # highlighter follows.
            player = gr.Audio(label="Speech", streaming=streaming, autoplay=True, interactive=False,
                              type="filepath", elem_id="speech-player",
                              waveform_options=gr.WaveformOptions(show_recording_waveform=False))
            captions = gr.HTML(elem_id="speech-words", js_on_load=HIGHLIGHTER, css_template=WORDS_CSS)
            with gr.Row():
                download = gr.File(label="The whole text, in the chosen format", interactive=False)
                subtitle_files = gr.File(label="Subtitles (SubRip .srt and WebVTT .vtt)", file_count="multiple",
                                         interactive=False)
            button.click(synthesize, [text, voice, speed, response_format],
                         [player, captions, download, subtitle_files], api_name="synthesize", concurrency_limit=None)
            clone_models = render_cloning(voice)
        for render_tab in extra_tabs:
            render_tab()
        warm_up_timer = gr.Timer(1.0, active=False)
        demo.load(readiness, None, [status, warm_up_timer])

        def page_choices(request: gr.Request):  # the caller's, and the registry may have been reloaded
            models = service.cloner.models()
            caller = caller_of(request)
            return (gr.Dropdown(choices=voice_choices(caller)), gr.Dropdown(choices=language_choices(caller), value=""),
                    gr.Dropdown(choices=models, value=models[0] if models else None))

        demo.load(page_choices, None, [voice, language, clone_models])
        warm_up_timer.tick(readiness, None, [status, warm_up_timer], api_visibility="private")
    return demo
