"""The cloned voices panel: the list, and delete / make public / make private (each audited). Its storage
calls are coroutines whose storage work runs in worker threads."""

from __future__ import annotations

import functools

import gradio as gr

from clones import VoiceClones
from storage import StorageError
from tts_core.errors import ChorusError, StorageUnavailable

from .tables import datatypes, time_cell

CLONE_COLUMNS = ["name", "model", "owner", "public", "created", "duration (s)"]


class ClonesPanel:
    def __init__(self, clones: VoiceClones):
        self.clones = clones

    def render(self, signed_in: gr.State) -> None:
        """The table is filled when the admin signs in (list_clones)."""
        gr.Markdown("### Cloned voices")
        self.table = gr.Dataframe(headers=CLONE_COLUMNS, interactive=False,
                                  datatype=datatypes(CLONE_COLUMNS, ("created",)))
        with gr.Row():
            name = gr.Textbox(label="cloned voice", scale=2)
            buttons = {action: gr.Button(label, variant=variant, scale=1) for action, label, variant in
                       (("public", "Make public", "secondary"), ("private", "Make private", "secondary"),
                        ("delete", "Delete", "stop"))}
        message = gr.Markdown()
        for action, button in buttons.items():
            button.click(functools.partial(self.act, action), [signed_in, name], [message, self.table],
                         api_visibility="private")

    async def rows(self) -> list[list]:
        try:
            rows = await self.clones.listing()
        except StorageError:
            return []
        return [[v["name"], v["model"], v["owner"], "yes" if v["public"] else "no", time_cell(v["created_at"]),
                 v["duration_s"]] for v in rows]

    async def list_clones(self, is_signed_in: bool):
        return await self.rows() if is_signed_in else gr.skip()

    async def act(self, action: str, is_signed_in: bool, voice: str):
        if not is_signed_in or not voice:
            return "Give the name of a cloned voice.", gr.skip()
        try:
            if action == "delete":
                await self.clones.delete(voice.strip(), "admin-ui")
            else:
                await self.clones.set_public(voice.strip(), action == "public", "admin-ui")
        except ChorusError as error:
            return f"Not done: {error.message}", gr.skip()
        except StorageError:
            return f"Not done: {StorageUnavailable().message}", gr.skip()
        done = {"delete": "deleted", "public": "public now", "private": "private now"}[action]
        return f"Voice {voice.strip()} is {done}.", await self.rows()
