"""The history panel: the browser's last takes (its localStorage, ui/takes.py), each to play again, download
or delete; a take that is made is added first. One panel a tab: the Synthesize tab's syntheses, the Dialogue tab's
dialogues, each in a list of its own."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gradio as gr
import pydantic_core

from . import browser, takes
from .context import UiContext

Replay = Callable[[dict, Path], Any]  # a kept take's entry and the takes' folder -> the tab's outputs for it


class HistoryPanel:
    def __init__(self, context: UiContext, elem_id: str = "speech-history", replay: Replay = takes.replay,
                 what: str = "syntheses"):
        """replay: what the tab shows for a take played again (the speak panel's: its player's value and words);
        what: the takes' name, as the empty list says it."""
        self.context, self.elem_id, self.replay_take, self.what = context, elem_id, replay, what

    def render(self, history: gr.BrowserState, made, take: gr.Component, *outputs: gr.Component) -> None:
        """`made` is the tab's event and `take` what holds its take once made (JSON: take, name, text, label, at,
        duration_s; the speak panel's player): it is remembered; a replay's values go to `outputs`."""
        with gr.Accordion("History", open=True):
            self.history_box = gr.HTML(takes.history_html([], self.context.out_dir, self.what), elem_id=self.elem_id,
                                       js_on_load=browser.HISTORY_JS, css_template=browser.HISTORY_CSS)
        made.success(self.remember, [take, history], [history, self.history_box], api_visibility="private")
        self.history_box.replay(self.replay, [history], list(outputs), api_visibility="private")
        self.history_box.forget(self.forget, [history], [history, self.history_box], api_visibility="private")

    def kept(self, stored: list) -> tuple[list, str]:
        """The browser's history, kept to the takes whose files are still here, and its list."""
        kept = takes.entries(stored, self.context.out_dir)
        return kept, takes.history_html(kept, self.context.out_dir, self.what)

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

    def replay(self, history: list, event: gr.EventData):
        take = getattr(event, "take", None)
        entry = next((entry for entry in takes.entries(history, self.context.out_dir) if entry["take"] == take), None)
        if entry is None:
            raise gr.Error("that take is gone (files are kept for an hour)", print_exception=False)
        return self.replay_take(entry, self.context.out_dir)

    def forget(self, history: list, event: gr.EventData) -> tuple[list, str]:
        kept = takes.forget(history, getattr(event, "take", None), self.context.out_dir)
        return kept, takes.history_html(kept, self.context.out_dir, self.what)
