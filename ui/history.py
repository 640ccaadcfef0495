"""The history panel: the browser's last takes (its localStorage, ui/takes.py), each to play again, download
or delete; a synthesis that succeeds is added first."""

from __future__ import annotations

import gradio as gr
import pydantic_core

from . import browser, takes
from .context import UiContext


class HistoryPanel:
    def __init__(self, context: UiContext):
        self.context = context

    def render(self, history: gr.BrowserState, synthesized, player: gr.HTML, captions: gr.HTML) -> None:
        """`synthesized` is the speak panel's event: its take, once made, is remembered; a replay plays in its
        player and words."""
        with gr.Accordion("History", open=True):
            self.history_box = gr.HTML(takes.history_html([], self.context.out_dir), elem_id="speech-history",
                                       js_on_load=browser.HISTORY_JS, css_template=browser.HISTORY_CSS)
        synthesized.success(self.remember, [player, history], [history, self.history_box], api_visibility="private")
        self.history_box.replay(self.replay, [history], [player, captions], api_visibility="private")
        self.history_box.forget(self.forget, [history], [history, self.history_box], api_visibility="private")

    def kept(self, stored: list) -> tuple[list, str]:
        """The browser's history, kept to the takes whose files are still here, and its list."""
        kept = takes.entries(stored, self.context.out_dir)
        return kept, takes.history_html(kept, self.context.out_dir)

    def remember(self, player: str, history: list):
        """The take just made, first in the browser's history."""
        try:  # the browser's word; pydantic's parser bounds nesting (json.loads recurses until the stack runs out)
            value = pydantic_core.from_json(player or "{}")
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise gr.Error("that take could not be kept in the history", print_exception=False)
        entry = {key: value.get(key) for key in ("take", "name", "text", "label", "at", "duration_s")}
        return self.kept([entry, *(history or [])])

    def replay(self, history: list, event: gr.EventData) -> tuple[str, str]:
        take = getattr(event, "take", None)
        entry = next((entry for entry in takes.entries(history, self.context.out_dir) if entry["take"] == take), None)
        if entry is None:
            raise gr.Error("that synthesis is gone (files are kept for an hour)", print_exception=False)
        return takes.replay(entry, self.context.out_dir)

    def forget(self, history: list, event: gr.EventData) -> tuple[list, str]:
        kept = takes.forget(history, getattr(event, "take", None), self.context.out_dir)
        return kept, takes.history_html(kept, self.context.out_dir)
