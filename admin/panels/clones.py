"""The cloned voices panel: the list, and delete / make public / make private (each audited). Its storage
calls are coroutines whose storage work runs in worker threads."""

from __future__ import annotations

import functools

import gradio as gr

from clones import VoiceClones
from storage import StorageError
from tts_core.errors import ChorusError, StorageUnavailable

from .tables import datatypes, empty_hint, hinted, time_cell

CLONE_COLUMNS = ["name", "model", "owner", "public", "created", "duration (s)"]
NO_CLONES = ("**No cloned voices yet.** A caller clones one from a clip of 3 to 30 s, in the Synthesize tab's "
             "\"Clone a voice\" panel or with `POST /v1/voices`; it is the caller's own until it is made public here.")
NO_CLONING_MODEL = ("**Cloning is not available on this server:** it needs a model that can clone voices (Pocket TTS "
                    "or VibeVoice) in the voice registry (docs/voices.md, \"Cloned voices\"); voices cloned on "
                    "another replica are still listed here.")


class ClonesPanel:
    def __init__(self, clones: VoiceClones):
        self.clones = clones

    def render(self, signed_in: gr.State) -> None:
        """The table is filled when the admin signs in (list_clones)."""
        gr.Markdown("### Cloned voices")
        self.unavailable = gr.Markdown(self.why_not(), elem_id="admin-clone-unavailable")
        self.table = gr.Dataframe(headers=CLONE_COLUMNS, interactive=False, wrap=True, elem_id="clone-table",
                                  datatype=datatypes(CLONE_COLUMNS, ("created",)))
        self.hint = empty_hint(NO_CLONES)
        with gr.Row():
            name = gr.Textbox(label="cloned voice", scale=2)
            buttons = {action: gr.Button(label, variant=variant, scale=1) for action, label, variant in
                       (("public", "Make public", "secondary"), ("private", "Make private", "secondary"),
                        ("delete", "Delete", "stop"))}
        message = gr.Markdown()
        for action, button in buttons.items():
            button.click(functools.partial(self.act, action), [signed_in, name], [message, *self.outputs],
                         api_visibility="private")

    @property
    def outputs(self) -> list:
        """What a listing fills: whether this server clones, the table and the hint under it while empty."""
        return [self.unavailable, self.table, self.hint]

    def why_not(self) -> str:
        """Why this server makes no clones, as the Synthesize tab's panel says it (nothing where it makes them)."""
        service = self.clones.service
        if service.cloning_models():
            return ""
        refusal = service.cloning_refusal()
        return f"**Cloning is not available here:** {refusal}." if refusal else NO_CLONING_MODEL

    async def rows(self) -> list[list]:
        try:
            rows = await self.clones.listing()
        except StorageError:
            return []
        return [[v["name"], v["model"], v["owner"], "yes" if v["public"] else "no", time_cell(v["created_at"]),
                 v["duration_s"]] for v in rows]

    async def listing(self) -> tuple[str, list[list], str]:
        rows = await self.rows()
        return self.why_not(), rows, hinted(rows, NO_CLONES)

    async def list_clones(self, is_signed_in: bool):
        return await self.listing() if is_signed_in else [gr.skip()] * len(self.outputs)

    async def act(self, action: str, is_signed_in: bool, voice: str):
        if not is_signed_in or not voice:
            return "Give the name of a cloned voice.", *[gr.skip()] * len(self.outputs)
        try:
            if action == "delete":
                await self.clones.delete(voice.strip(), "admin-ui")
            else:
                await self.clones.set_public(voice.strip(), action == "public", "admin-ui")
        except ChorusError as error:
            return f"Not done: {error.message}", *[gr.skip()] * len(self.outputs)
        except StorageError:
            return f"Not done: {StorageUnavailable().message}", *[gr.skip()] * len(self.outputs)
        done = {"delete": "deleted", "public": "public now", "private": "private now"}[action]
        return f"Voice {voice.strip()} is {done}.", *await self.listing()
