"""The Dialogue tab: a script of several speakers (`Name: text` lines), a voice for each speaker, one recording to
hear and download, with subtitles by speaker where every voice times its words. Made by the same SpeechService (and
queue) as POST /v1/audio/dialogue; its files are kept like the synthesis tab's takes (ui/takes.py) and linked through
the same route (ui/files.py), and the browser's last dialogues are listed below it, in the Synthesize tab's history
panel (a list of their own)."""

from __future__ import annotations

import asyncio
import html
import json
import re
import time
from pathlib import Path

import gradio as gr

from tts_core.errors import ChorusError, ErrorCode, InvalidRequest
from tts_core.request.access import Caller
from tts_core.request.ask import Ask
from tts_core.request.captions import SUBTITLE_FORMATS, every_subtitle

from . import browser, takes
from .context import UiContext, log, refused
from .history import HistoryPanel
from .speak import UI_FORMATS

EXAMPLE_SCRIPT = "Ann: Hello Bob, how was the trip?\nBob: Long, but the view was lovely.\nAnn: I am glad you are home."
EXAMPLE_SPEAKERS = ("Ann", "Bob")
SUBTITLE_NAMES = {"srt": "SubRip", "vtt": "WebVTT"}
FIELDS = {"script": 0, "voices": 1, "response_format": 2}  # the dialogue's inputs, by a refusal's param
ONE_VOICE = ("**This server has one voice**, so every speaker sounds the same. For distinct speakers add a voice: "
             "another Piper voice (its `NAME.onnx` and `NAME.onnx.json` in the voices folder, `TTS_VOICES_DIR`, "
             "then a restart), a multi-speaker model (each speaker is a voice) or a Kokoro model in the voice "
             "registry; see docs/voices.md.")


def voices_of(lines: str) -> dict[str, str]:
    """`Name: voice` lines (blank ones skipped) as {name: voice}."""
    voices = {}
    for number, line in enumerate(lines.splitlines(), 1):
        if not line.strip():
            continue
        name, colon, voice = line.partition(":")
        if not colon or not name.strip() or not voice.strip():
            raise InvalidRequest(f"voices line {number}: {line.strip()!r} is not a line \"Name: voice\"", "voices",
                                 ErrorCode.INVALID_DIALOGUE)
        voices[name.strip()] = voice.strip()
    return voices


def default_cast(voices: list[str]) -> tuple[str, str]:
    """The example's speakers, each a voice of its own where the server has several, and what the tab says of
    it (why they sound alike where it has one)."""
    first = voices[0] if voices else ""
    second = next((voice for voice in voices if voice != first), first)
    words = ONE_VOICE if first == second else (
        "Each speaker a voice of the Synthesize tab's list (a mix or a cloned voice too); the example's two are "
        "distinct voices of this server's.")
    return f"{EXAMPLE_SPEAKERS[0]}: {first}\n{EXAMPLE_SPEAKERS[1]}: {second}", words


def dialogue_stem(voices: dict[str, str]) -> str:
    """A download's name a phone shows whole: the speakers, then "dialogue" ("ann-bob-dialogue")."""
    names = "-".join(re.sub(r"[^\w]", "", name.lower())[:10] for name in list(voices)[:3])
    return f"{names}-dialogue".strip("-") if names.strip("-") else "dialogue"


def files_html(path: Path) -> str:
    """The dialogue's files to download (the recording, and its subtitles where it has them), each by its whole name
    (a phone wraps it), linked through ui/files.py's route."""
    kept = [(path, f"the recording ({path.suffix[1:].upper()})"),
            *((path.with_suffix(f".{kind}"), f"subtitles by speaker ({SUBTITLE_NAMES[kind]})")
              for kind in SUBTITLE_FORMATS)]
    items = "".join(f'<li><a class="chorus-download" href="{html.escape(takes.file_url(file))}" '
                    f'download="{html.escape(file.name)}">{html.escape(file.name)}</a> <small>{what}</small></li>'
                    for file, what in kept if file.is_file())
    return f'<p class="chorus-files-title">Download</p><ul class="chorus-file-list">{items}</ul>'


def replayed(entry: dict, folder: Path) -> tuple[str, str]:
    """A dialogue's recording (a player) and its files to download."""
    path = folder / entry["take"] / entry["name"]
    return (f'<audio controls preload="metadata" src="{html.escape(takes.file_url(path))}"></audio>',
            files_html(path))


class DialoguePanel:
    def __init__(self, context: UiContext):
        self.context = context

    def render(self, stored: gr.BrowserState) -> HistoryPanel:
        """The tab, and its history of the dialogues `stored` in the browser (whose list the page fills as it
        loads)."""
        cast, words = default_cast([voice.name for voice in self.context.service.catalogue_now().voice_list()])
        with gr.Row():
            with gr.Column(scale=3, min_width=320):
                script = gr.Textbox(label="Script: a line per turn, Name: what they say", lines=8,
                                    value=EXAMPLE_SCRIPT, elem_id="dialogue-script")
            with gr.Column(scale=2, min_width=300):
                voices = gr.Textbox(label="Voices: a line per speaker, Name: voice", lines=4, value=cast,
                                    elem_id="dialogue-voices")
                gr.Markdown(words, elem_id="dialogue-voices-help")
                response_format = gr.Dropdown(UI_FORMATS, value="mp3", label="Format", min_width=120)
        button = gr.Button("Make the dialogue", variant="primary", elem_id="make-dialogue")
        audio = gr.HTML("", elem_id="dialogue-audio", css_template=browser.RECORDING_CSS)
        files = gr.HTML("", elem_id="dialogue-files", css_template=browser.FILES_CSS)
        made = gr.State("")  # the take's history entry (JSON), for the history: not part of the answer
        event = button.click(self.make, [script, voices, response_format], [audio, files, made], api_name="dialogue",
                             concurrency_limit=None, validator=self.check)
        history = HistoryPanel(self.context, "dialogue-history", replayed, "dialogues")
        history.render(stored, event, made, audio, files)
        return history

    async def check(self, script: str, voices: str, response_format: str, request: gr.Request) -> list[dict]:
        """The dialogue checked before it is queued (Gradio's validator), as the API checks it: a refusal is one
        message at the input at fault, and the recording before stays, with its downloads."""
        try:
            cast = voices_of(voices or "")
            await self.context.service.dialogue_turns(Ask(response_format=response_format, script=script or "",
                                                          voices=cast, caller=self.context.caller_of(request)))
        except ChorusError as error:
            log.info("UI dialogue refused (%d %s): %s", error.status, error.code, error.message)
            at_fault = FIELDS.get(error.param or "", 1 if error.param and "voice" in error.param else 0)
            return [gr.validate(index != at_fault, error.message) for index in range(3)]
        return [gr.validate(True, "")] * 3

    def _timed(self, voices: dict[str, str], caller: Caller | None) -> bool:
        """Whether every voice's model times its words (as declared), for subtitles; a voice that does not exist
        is left for the dialogue's own refusal, which names its speaker."""
        try:
            return all(self.context.service.times_words(voice, caller.identity if caller else None)
                       for voice in voices.values())
        except InvalidRequest:
            return False

    async def make(self, script: str, voices: str, response_format: str, request: gr.Request
                   ) -> tuple[str, str, str]:
        """The recording (whole: a dialogue's turns are joined at one level once all are made) to play, its files to
        download, and its entry in the history."""
        client = request.client.host if request and request.client else "unknown"
        try:  # accounted when the block ends: a browser that leaves is a 499
            with self.context.service.tally("ui", client, len(script or "")) as tally:
                caller, _ = await self.context.admit(request)
                tally.client = caller.identity
                cast = voices_of(voices or "")
                ask = Ask(response_format=response_format, words=self._timed(cast, caller), caller=caller,
                          script=script or "", voices=cast)
                spoken = await self.context.service.answer(ask, tally)
                words = list(spoken.words or ())
                captions = every_subtitle(words) if words else {}
                take = await asyncio.to_thread(takes.Take, self.context.out_dir)
                path = await asyncio.to_thread(take.finish, spoken.data, dialogue_stem(cast),
                                               response_format, captions, "")
                entry = {"take": take.id, "name": path.name, "text": (script or "")[:500], "at": time.time(),
                         "label": ", ".join(f"{name}: {voice}" for name, voice in cast.items()),
                         "duration_s": round(spoken.duration_s, 2)}
                return (*replayed(entry, self.context.out_dir), json.dumps(entry))
        except ChorusError as error:
            raise refused(error) from None
        except Exception:
            log.exception("UI dialogue failed")
            raise gr.Error("the dialogue failed: an internal error (logged on the server)") from None
