"""The Admin tab: live charts, degrade state, the settings form, API keys, cloned voices, the pronunciation
lexicon and the audit log, behind a token."""

from __future__ import annotations

import functools
import json

import gradio as gr
import pydantic_core
from pydantic import ValidationError

from api.access import AccessControl
from clones import VoiceClones
from storage import AlreadyExists, StorageError
from tts_core.access import client_address
from tts_core.degrade import OperatorSettings
from tts_core.errors import ChorusError, InvalidSetting, StorageUnavailable
from tts_core.lexicon import LexiconEntry, LexiconFileError
from tts_core.monitor import Monitor
from tts_core.service import SpeechService

from .charts import CHARTS, cost_figure, plot_data, replica_charts, series_figure
from .cluster import ReplicaReporter
from .control import OperatorControl
from .gate import AdminGate, AdminRefused
from .lexicon import LexiconControl
from .state import state_markdown
from .stats import collect_stats

AUDIT_COLUMNS = ["time", "actor", "setting", "old value", "new value"]
KEY_COLUMNS = ["id", "prefix", "name", "tier", "created", "revoked"]
CLONE_COLUMNS = ["name", "model", "owner", "public", "created", "duration (s)"]
COST_MODEL_WORDS = (
    "**Batch cost model.** The batcher predicts each candidate batch's time with this model, fitted to the batches "
    "it has run (the points; hollow: the calibration sweep at start), and takes the size that makes the most tokens "
    "a second, but only a batch predicted to beat its items run one at a time (dotted) by a clear margin, and only "
    "while every member still meets its deadline. Where the two lines lie together (a CPU) batching does not pay "
    "and it runs one item at a time; where the solid line stays low (a GPU) it grows its batches.")
LEXICON_COLUMNS = ["id", "language", "phrase", "ipa", "respelling", "case sensitive", "updated", "by"]


def _audit_rows(control: OperatorControl) -> list[list]:
    try:
        entries = control.audit()
    except StorageError:  # the state line above says the database fails
        return []
    return [[e["at"], e["actor"], e["key"], str(e["old_value"]), str(e["new_value"])] for e in entries]


def _keys(access: AccessControl) -> tuple[list[list], gr.Dropdown]:
    """The keys table, and the keys still in force to choose one to revoke from."""
    try:
        keys = access.storage.api_keys()
    except StorageError:
        keys = []
    rows = [[k["id"], k["prefix"] + "…", k["name"], k["tier"], k["created_at"], k["revoked_at"] or ""] for k in keys]
    choices = [(f"{k['name']} ({k['tier']}, {k['prefix']}…, id {k['id']})", k["id"]) for k in keys
               if not k["revoked_at"]]
    return rows, gr.Dropdown(choices=choices, value=None)


async def _clone_rows(clones: VoiceClones) -> list[list]:
    try:
        rows = await clones.listing()
    except StorageError:
        return []
    return [[v["name"], v["model"], v["owner"], "yes" if v["public"] else "no",
             v["created_at"].strftime("%Y-%m-%d %H:%M:%S"), v["duration_s"]] for v in rows]


def _render_clones(signed_in: gr.State, clones: VoiceClones) -> gr.Dataframe:
    """The cloned voices section: the list, and delete / make public / make private (each audited).
    Returns the table, filled when the admin signs in."""
    gr.Markdown("### Cloned voices")
    table = gr.Dataframe(headers=CLONE_COLUMNS, interactive=False)
    with gr.Row():
        name = gr.Textbox(label="cloned voice", scale=2)
        buttons = {action: gr.Button(label, variant=variant, scale=1) for action, label, variant in
                   (("public", "Make public", "secondary"), ("private", "Make private", "secondary"),
                    ("delete", "Delete", "stop"))}
    message = gr.Markdown()

    async def act(action: str, is_signed_in: bool, voice: str):
        if not is_signed_in or not voice:
            return "Give the name of a cloned voice.", gr.skip()
        try:
            if action == "delete":
                await clones.delete(voice.strip(), "admin-ui")
            else:
                await clones.set_public(voice.strip(), action == "public", "admin-ui")
        except ChorusError as error:
            return f"Not done: {error.message}", gr.skip()
        except StorageError:
            return f"Not done: {StorageUnavailable().message}", gr.skip()
        done = {"delete": "deleted", "public": "public now", "private": "private now"}[action]
        return f"Voice {voice.strip()} is {done}.", await _clone_rows(clones)

    for action, button in buttons.items():
        button.click(functools.partial(act, action), [signed_in, name], [message, table], api_visibility="private")
    return table


def _lexicon_rows(lexicon: LexiconControl) -> list[list]:
    try:
        rows = lexicon.entries()
    except StorageError:
        return []
    return [[e["id"], e["language"], e["phrase"], e["ipa"] or "", e["respelling"] or "",
             "yes" if e["case_sensitive"] else "no", e["updated_at"][:19], e["updated_by"]] for e in rows]


def _render_lexicon(signed_in: gr.State, lexicon: LexiconControl) -> gr.Dataframe:
    """The pronunciation lexicon section: the entries, a form to add, change (give the id) or delete one,
    and TSV export and import (merge) through a text box; each change audited. Returns the table."""
    gr.Markdown("### Pronunciation lexicon")
    table = gr.Dataframe(headers=LEXICON_COLUMNS, interactive=False)
    with gr.Row():
        entry_id = gr.Number(label="id (empty: a new entry)", precision=0, scale=1)
        language = gr.Textbox(label="language", value="en", scale=1)
        phrase = gr.Textbox(label="word or phrase", scale=2)
        ipa = gr.Textbox(label="IPA (no slashes)", scale=2)
        respelling = gr.Textbox(label="respelling", scale=2)
        case_sensitive = gr.Checkbox(label="case sensitive", scale=1)
    with gr.Row():
        save, delete = gr.Button("Save entry", scale=1), gr.Button("Delete entry", variant="stop", scale=1)
        export, import_ = gr.Button("Export TSV", scale=1), gr.Button("Import TSV (merge)", scale=1)
    tsv = gr.Code(label="TSV: language, phrase, ipa, respelling, case_sensitive", language=None)
    message = gr.Markdown()

    def run(is_signed_in: bool, change) -> tuple:
        if not is_signed_in:
            return "Sign in first.", gr.skip()
        try:
            return change(), _lexicon_rows(lexicon)
        except ValidationError as error:
            return "Not done: " + "; ".join(f"{'.'.join(map(str, e['loc'])) or 'entry'}: {e['msg']}"
                                             for e in error.errors()), gr.skip()
        except (AlreadyExists, LexiconFileError) as error:
            return f"Not done: {error}", gr.skip()
        except StorageError:
            return f"Not done: {StorageUnavailable().message}", gr.skip()

    def save_entry(is_signed_in: bool, number, language: str, phrase: str, ipa: str, respelling: str,
                   case_sensitive: bool):
        def change() -> str:
            entry = LexiconEntry(language=language, phrase=phrase, ipa=ipa or None, respelling=respelling or None,
                                 case_sensitive=case_sensitive)
            if number is None:
                return f"Entry {lexicon.add(entry, 'admin-ui')['id']} added."
            return f"Entry {int(number)} changed." if lexicon.change(int(number), entry, "admin-ui") \
                else f"No entry with id {int(number)}."
        return run(is_signed_in, change)

    def delete_entry(is_signed_in: bool, number):
        if number is None:
            return "Give the id of the entry to delete.", gr.skip()
        return run(is_signed_in, lambda: f"Entry {int(number)} deleted." if lexicon.delete(int(number), "admin-ui")
                   else f"No entry with id {int(number)}.")

    def import_tsv(is_signed_in: bool, text: str):
        return run(is_signed_in, lambda: "Imported: {added} added, {changed} changed, {unchanged} unchanged."
                   .format(**lexicon.import_tsv(text or "", "admin-ui")))

    def export_tsv(is_signed_in: bool):
        if not is_signed_in:
            return gr.skip(), "Sign in first."
        try:
            return lexicon.export_tsv(), ""
        except StorageError:
            return gr.skip(), f"Not done: {StorageUnavailable().message}"

    form = [entry_id, language, phrase, ipa, respelling, case_sensitive]
    save.click(save_entry, [signed_in, *form], [message, table], api_visibility="private")
    delete.click(delete_entry, [signed_in, entry_id], [message, table], api_visibility="private")
    import_.click(import_tsv, [signed_in, tsv], [message, table], api_visibility="private")
    export.click(export_tsv, [signed_in], [tsv, message], api_visibility="private")
    return table


def _address(request: gr.Request | None, access: AccessControl) -> str:
    peer = request.client.host if request is not None and request.client else None
    forwarded = request.headers.get("x-forwarded-for") if request is not None else None
    return client_address(peer, forwarded, access.trusted_proxies)


def build_admin_tab(service: SpeechService, monitor: Monitor, control: OperatorControl, access: AccessControl,
                    gate: AdminGate, clones: VoiceClones, lexicon: LexiconControl,
                    replicas: ReplicaReporter | None = None) -> None:
    """Render the tab inside the current gr.Blocks. Its handlers are plain functions (Gradio runs them in
    worker threads) or, for cloned voices, coroutines whose storage calls run in worker threads: the
    database is never waited on from the event loop."""
    with gr.Tab("Admin"):
        if not gate.enabled:
            gr.Markdown("### Admin is disabled\nSet `TTS_ADMIN_TOKEN` and restart to enable the dashboard.")
            return
        signed_in = gr.State(False)
        with gr.Column(visible=True) as login_box:
            token = gr.Textbox(label="Admin token", type="password")
            login = gr.Button("Sign in", variant="primary")
            login_message = gr.Markdown()
        with gr.Column(visible=False) as panel:
            state = gr.Markdown(elem_id="degrade-state")
            # Two charts a row, one where two would be narrower than min_width (a phone); first the batch sizes
            # and the cost model that explains them.
            with gr.Row():
                plots = [gr.Plot(show_label=False, min_width=320)]
                cost_plot = gr.Plot(show_label=False, min_width=320, elem_id="cost-model")
            gr.Markdown(COST_MODEL_WORDS)
            for row in range(1, len(CHARTS), 2):
                with gr.Row():
                    plots.extend(gr.Plot(show_label=False, min_width=320) for _ in CHARTS[row: row + 2])
            with gr.Row():  # the deployment: a line per replica (one, on its own)
                replica_plots = [gr.Plot(show_label=False, min_width=320) for _ in range(2)]
            gr.Markdown("### Degrade thresholds and actions")
            fields = OperatorSettings.model_fields
            inputs = {}
            switches = [name for name, info in fields.items() if info.annotation is bool]
            numbers = [name for name, info in fields.items() if info.annotation in (int, float, str)]
            with gr.Row():
                for name in switches:
                    inputs[name] = gr.Checkbox(label=name.replace("_", " "), min_width=160)
            for row in range(0, len(numbers), 4):
                with gr.Row():
                    for name in numbers[row: row + 4]:
                        info = fields[name]
                        label = name.replace("_", " ")
                        inputs[name] = (gr.Textbox(label=label, info=info.description) if info.annotation is str
                                        else gr.Number(label=label, info=info.description,
                                                       precision=0 if info.annotation is int else None))
            for name in fields.keys() - switches - set(numbers):  # structured values, edited as JSON
                inputs[name] = gr.Code(label=f"{name.replace('_', ' ')} (JSON): {fields[name].description}",
                                       language="json")
            inputs = {name: inputs[name] for name in fields}  # the order save_settings reads them in
            save = gr.Button("Save settings", variant="primary")
            save_message = gr.Markdown()
            gr.Markdown("### API keys")
            with gr.Row():
                key_name = gr.Textbox(label="name", scale=2)
                key_tier = gr.Dropdown(list(control.settings.tiers), label="tier", scale=1)
                create_key = gr.Button("Create key", scale=1)
            key_message = gr.Markdown()
            keys_table = gr.Dataframe(headers=KEY_COLUMNS, interactive=False)
            with gr.Row():
                revoke_choice = gr.Dropdown([], value=None, label="key to revoke", scale=2, elem_id="revoke-key")
                revoke = gr.Button("Revoke key", variant="stop", scale=1)
            clones_table = _render_clones(signed_in, clones)
            lexicon_table = _render_lexicon(signed_in, lexicon)
            gr.Markdown("### Audit log")
            audit = gr.Dataframe(headers=AUDIT_COLUMNS, interactive=False)
        timer = gr.Timer(1.0)

        def form_value(name: str):
            value = getattr(control.settings, name)
            return json.dumps(control.settings.model_dump()[name], indent=2) if isinstance(value, dict) else value

        def form_values() -> list:
            return [form_value(name) for name in inputs]

        def sign_in(given: str, request: gr.Request):
            try:
                gate.check(given, _address(request, access))
            except AdminRefused as refused:
                return [False, gr.update(), gr.update(), f"{refused.message}.", *[gr.update()] * (3 + len(inputs))]
            return [True, gr.update(visible=False), gr.update(visible=True), "",
                    _audit_rows(control), *_keys(access), *form_values()]

        async def list_clones(is_signed_in: bool):
            return await _clone_rows(clones) if is_signed_in else gr.skip()

        def list_lexicon(is_signed_in: bool):
            return _lexicon_rows(lexicon) if is_signed_in else gr.skip()

        login.click(sign_in, [token], [signed_in, login_box, panel, login_message, audit, keys_table, revoke_choice,
                                       *inputs.values()],
                    api_visibility="private").then(list_clones, [signed_in], [clones_table], api_visibility="private"
                                                   ).then(list_lexicon, [signed_in], [lexicon_table],
                                                          api_visibility="private")

        def refresh(is_signed_in: bool):
            if not is_signed_in:
                return [gr.skip()] * (2 + len(plots) + len(replica_plots))
            stats = collect_stats(service, monitor, control, access, replicas)
            return [state_markdown(stats, control.settings), plot_data(cost_figure(stats["cost_models"])),
                    *(plot_data(series_figure(stats["series"], chart)) for chart in CHARTS),
                    *(plot_data(series_figure(stats["replica_series"], chart))
                      for chart in replica_charts(stats["replica_series"]))]

        timer.tick(refresh, [signed_in], [state, cost_plot, *plots, *replica_plots], api_visibility="private",
                   show_progress="hidden")

        def save_settings(is_signed_in: bool, *values):
            if not is_signed_in:
                return "Sign in first.", gr.skip()
            current = control.settings.model_dump()
            changes = {}
            for name, value in zip(inputs, values):
                if value is None:
                    return f"Not saved: {name} needs a value", gr.skip()
                kind = fields[name].annotation
                try:
                    value = {int: int, float: float}.get(kind, lambda v: v)(value) if kind in (int, float, str, bool) \
                        else pydantic_core.from_json(value)  # bounded nesting, unlike json.loads
                except ValueError as error:
                    return f"Not saved: {name} is not valid ({error})", gr.skip()
                if value != current[name]:
                    changes[name] = value
            if not changes:
                return "Nothing changed.", gr.skip()
            try:
                control.update(changes, "admin-ui")
            except InvalidSetting as invalid:
                return f"Not saved: {invalid.message}", gr.skip()
            except StorageError:
                return f"Not saved: {StorageUnavailable().message}", gr.skip()
            return f"Saved and applied: {', '.join(changes)}", _audit_rows(control)

        def make_key(is_signed_in: bool, name: str, tier: str):
            if not is_signed_in or not name or not tier:
                return "Give the key a name and a tier.", gr.skip(), gr.skip()
            try:
                key, record = access.create_key(name, tier, "admin-ui")
            except StorageError:
                return f"Not created: {StorageUnavailable().message}", gr.skip(), gr.skip()
            return (f"Key **{record['id']}** for {name} ({tier}): `{key}` (copy it now: it is not shown again)",
                    *_keys(access))

        def drop_key(is_signed_in: bool, key_id):
            if not is_signed_in or key_id is None:
                return "Choose the key to revoke.", gr.skip(), gr.skip()
            try:
                record = access.revoke_key(int(key_id), "admin-ui")
            except StorageError:
                return f"Not revoked: {StorageUnavailable().message}", gr.skip(), gr.skip()
            message = f"Key {int(key_id)} revoked." if record else f"No key with id {int(key_id)}."
            return (message, *_keys(access))

        keys = [key_message, keys_table, revoke_choice]
        create_key.click(make_key, [signed_in, key_name, key_tier], keys, api_visibility="private")
        revoke.click(drop_key, [signed_in, revoke_choice], keys, api_visibility="private")
        save.click(save_settings, [signed_in, *inputs.values()], [save_message, audit], api_visibility="private")
