"""The API keys panel: create a key (shown once) for a tier, list the keys, revoke one; each change audited."""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr

from access.control import AccessControl
from storage import StorageError
from tts_core.errors import StorageUnavailable

from .tables import datatypes, empty_hint, hinted, time_cell

KEY_COLUMNS = ["id", "prefix", "name", "tier", "created", "revoked"]
NO_KEYS = ("**No API keys yet.** Create one above: a name (who it is for) and a tier (its rate limit and priority). "
           "A caller sends it as `Authorization: Bearer <key>`; it is shown once, when it is made.")


class KeysPanel:
    def __init__(self, access: AccessControl, tiers: Callable[[], list[str]]):
        self.access, self.tiers = access, tiers

    def render(self, signed_in: gr.State) -> None:
        with gr.Row():
            key_name = gr.Textbox(label="Key name", scale=2, elem_id="key-name")
            self.tier_choice = gr.Dropdown(self.tiers(), label="Tier", scale=1, elem_id="key-tier")
            create_key = gr.Button("Create key", scale=1)
        key_message = gr.Markdown()
        self.table = gr.Dataframe(headers=KEY_COLUMNS, interactive=False, wrap=True, elem_id="key-table",
                                  datatype=datatypes(KEY_COLUMNS, ("created", "revoked")))
        self.hint = empty_hint(NO_KEYS)
        with gr.Row():
            self.revoke_choice = gr.Dropdown([], value=None, label="key to revoke", scale=2, elem_id="revoke-key")
            revoke = gr.Button("Revoke key", variant="stop", scale=1)
        keys = [key_message, *self.outputs]
        create_key.click(self.make_key, [signed_in, key_name, self.tier_choice], keys, api_visibility="private")
        revoke.click(self.drop_key, [signed_in, self.revoke_choice], keys, api_visibility="private")

    @property
    def outputs(self) -> list:
        """What listing() fills."""
        return [self.table, self.revoke_choice, self.tier_choice, self.hint]

    def listing(self) -> tuple[list[list], gr.Dropdown, gr.Dropdown, str]:
        """The keys table, the keys still in force to choose one to revoke from, the tiers (a tier added
        since the page was built among them) and the hint under an empty table."""
        try:
            keys = self.access.storage.keys.all()
        except StorageError:
            keys = []
        rows = [[k["id"], k["prefix"] + "…", k["name"], k["tier"], time_cell(k["created_at"]),
                 time_cell(k["revoked_at"])] for k in keys]
        choices = [(f"{k['name']} ({k['tier']}, {k['prefix']}…, id {k['id']})", k["id"]) for k in keys
                   if not k["revoked_at"]]
        return rows, gr.Dropdown(choices=choices, value=None), gr.Dropdown(choices=self.tiers()), hinted(rows, NO_KEYS)

    def make_key(self, is_signed_in: bool, name: str, tier: str):
        if not is_signed_in or not name or not tier:
            return "Give the key a name and a tier.", *[gr.skip()] * len(self.outputs)
        try:
            key, record = self.access.create_key(name, tier, "admin-ui")
        except StorageError:
            return f"Not created: {StorageUnavailable().message}", *[gr.skip()] * len(self.outputs)
        return (f"Key **{record['id']}** for {name} ({tier}): `{key}` (copy it now: it is not shown again)",
                *self.listing())

    def drop_key(self, is_signed_in: bool, key_id):
        if not is_signed_in or key_id is None:
            return "Choose the key to revoke.", *[gr.skip()] * len(self.outputs)
        try:
            record = self.access.revoke_key(int(key_id), "admin-ui")
        except StorageError:
            return f"Not revoked: {StorageUnavailable().message}", *[gr.skip()] * len(self.outputs)
        message = f"Key {int(key_id)} revoked." if record else f"No key with id {int(key_id)}."
        return (message, *self.listing())
