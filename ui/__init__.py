"""The Gradio synthesis tab, one module per panel: speak (the text, the button, the player), voice_picker,
history and cloning, each building its components and wiring its events, sharing a UiContext. It submits
through the same SpeechService (and batcher) as the API, and clones voices through the same VoiceClones;
the voice list is the browser's caller's (its own cloned voices, and the public ones). The player, the
counter and the lists' buttons run in the browser (ui/browser.py); each synthesis's files and the
history are in ui/takes.py, served by ui/files.py's route (app.py includes it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import gradio as gr

from clones import VoiceClones
from tts_core.config import Settings
from tts_core.service import SpeechService

from .cloning import ClonePanel
from .context import Admit, Identify, UiContext
from .dialogue import DialoguePanel
from .history import HistoryPanel
from .speak import KEEP_FILES_S, SpeakPanel
from .voice_picker import VoicePicker


def takes_folder(settings: Settings) -> Path:
    """The takes' files (ui/takes.py), kept with the server's other data (a volume)."""
    folder = (settings.data_dir / "ui").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def build_ui(service: SpeechService, settings: Settings, admit: Admit, identify: Identify, clones: VoiceClones,
             extra_tabs: Sequence[Callable[[], None]] = ()) -> gr.Blocks:
    """The app's page: the synthesis tab, then each extra tab (the composition root adds Admin)."""
    # the player fetches the pieces, and the links download the files, through ui/files.py's route (app.py)
    context = UiContext(service, settings, admit, identify, clones, takes_folder(settings))
    speak, voices = SpeakPanel(context), VoicePicker(context)
    history, cloning = HistoryPanel(context), ClonePanel(context)

    def readiness():
        if service.ready:
            return "", gr.Timer(active=False)
        return "**Warming up:** requests wait until the voices are loaded and warmed up.", gr.Timer(active=True)

    def page(stored: list, request: gr.Request):  # the caller's, and the registry may have been reloaded
        caller = context.caller_of(request)
        voice, language, voice_list = voices.for_caller(caller.identity if caller else None)
        return (voice, language, *cloning.models_now(), *speak.for_caller(caller), voice_list, *history.kept(stored))

    with gr.Blocks(title="Chorus", delete_cache=(KEEP_FILES_S, KEEP_FILES_S)) as demo:
        gr.Markdown("# Chorus\nType text, pick a voice, hear it. "
                    "The same server answers the OpenAI-compatible API at `/v1/audio/speech`.")
        status = gr.Markdown()
        stored_history = gr.BrowserState([], storage_key="chorus-history")
        # outside the tabs: a tab not shown yet is not rendered, and its state would be read as empty as the page loads
        stored_dialogues = gr.BrowserState([], storage_key="chorus-dialogue-history")
        with gr.Tab("Synthesize"):
            with gr.Row():
                with gr.Column(scale=3, min_width=320):
                    speak.render_inputs()
                with gr.Column(scale=2, min_width=300):
                    voices.render()
            synthesized = speak.render_player(voices.voice)
            history.render(stored_history, synthesized, speak.player, speak.player, speak.captions)
            cloning.render(voices.voice)
        with gr.Tab("Dialogue"):
            dialogue_history = DialoguePanel(context).render(stored_dialogues)
        for render_tab in extra_tabs:
            render_tab()
        warm_up_timer = gr.Timer(1.0, active=False)
        demo.load(readiness, None, [status, warm_up_timer])
        demo.load(page, [stored_history], [voices.voice, voices.language, *cloning.page_outputs, speak.text,
                                           speak.counter, voices.voice_list, stored_history, history.history_box])
        demo.load(dialogue_history.kept, [stored_dialogues], [stored_dialogues, dialogue_history.history_box])
        warm_up_timer.tick(readiness, None, [status, warm_up_timer], api_visibility="private")
    return demo
