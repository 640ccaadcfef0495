"""The Admin tab: live charts, degrade state, the settings form, API keys, cloned voices, the pronunciation
lexicon and the audit log, behind a token."""

from __future__ import annotations

import functools
import html
import json
from datetime import UTC, datetime

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

from .charts import CHARTS, absent, cost_figure, plot_data, replica_charts, series_figure
from .cluster import ReplicaReporter
from .control import OperatorControl
from .gate import AdminGate, AdminRefused
from .lexicon import LexiconControl
from .state import state_markdown
from .stats import collect_stats

AUDIT_COLUMNS = ["time", "actor", "action", "what", "old value", "new value"]
KEY_COLUMNS = ["id", "prefix", "name", "tier", "created", "revoked"]
CLONE_COLUMNS = ["name", "model", "owner", "public", "created", "duration (s)"]
COST_MODEL_WORDS = (
    "**Batch cost model.** The batcher predicts each candidate batch's time with this model, fitted to the batches "
    "it has run (the points; hollow: the calibration sweep at start), and takes the size that makes the most tokens "
    "a second, but only a batch predicted to beat its items run one at a time (dotted) by a clear margin, and only "
    "while every member still meets its deadline. Where the two lines lie together (a CPU) batching does not pay "
    "and it runs one item at a time; where the solid line stays low (a GPU) it grows its batches.")
LEXICON_COLUMNS = ["id", "language", "phrase", "ipa", "respelling", "case sensitive", "updated", "by"]
# Times are shown in the browser's own time zone: each is a <time> (UTC until the script below rewrites it), in a
# column of HTML; every other column is plain text (it holds names that callers and admins chose).
LOCAL_TIMES_JS = """
const local = () => {
  for (const time of document.querySelectorAll('time[datetime]:not([data-local])')) {
    time.textContent = new Date(time.getAttribute('datetime')).toLocaleString([], {dateStyle: 'medium',
                                                                                   timeStyle: 'medium'});
    time.dataset.local = '';
  }
};
new MutationObserver(local).observe(document.body, {childList: true, subtree: true, characterData: true});
local();
"""


def _time(moment: str | datetime | None) -> str:
    """A stored time (ISO text or a datetime, UTC) as a <time> the browser shows in its own zone."""
    if not moment:
        return ""
    moment = datetime.fromisoformat(moment) if isinstance(moment, str) else moment
    moment = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)
    return (f'<time datetime="{html.escape(moment.isoformat())}">'
            f'{moment.strftime("%Y-%m-%d %H:%M:%S")} UTC</time>')


def _datatypes(columns: list[str], times: tuple[str, ...]) -> list[str]:
    return ["html" if column in times else "str" for column in columns]


def _audit_rows(control: OperatorControl) -> list[list] | None:
    """The newest entries of the audit log; None when the database fails (the state line above says so)."""
    try:
        entries = control.audit()
    except StorageError:
        return None
    return [[_time(e["at"]), e["actor"], e["action"], e["key"], _value(e["old_value"]), _value(e["new_value"])]
            for e in entries]


def _value(value) -> str:
    return "" if value is None else json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def _keys(access: AccessControl) -> tuple[list[list], gr.Dropdown]:
    """The keys table, and the keys still in force to choose one to revoke from."""
    try:
        keys = access.storage.api_keys()
    except StorageError:
        keys = []
    rows = [[k["id"], k["prefix"] + "…", k["name"], k["tier"], _time(k["created_at"]), _time(k["revoked_at"])]
            for k in keys]
    choices = [(f"{k['name']} ({k['tier']}, {k['prefix']}…, id {k['id']})", k["id"]) for k in keys
               if not k["revoked_at"]]
    return rows, gr.Dropdown(choices=choices, value=None)


async def _clone_rows(clones: VoiceClones) -> list[list]:
    try:
        rows = await clones.listing()
    except StorageError:
        return []
    return [[v["name"], v["model"], v["owner"], "yes" if v["public"] else "no", _time(v["created_at"]),
             v["duration_s"]] for v in rows]


def _render_clones(signed_in: gr.State, clones: VoiceClones) -> gr.Dataframe:
    """The cloned voices section: the list, and delete / make public / make private (each audited).
    Returns the table, filled when the admin signs in."""
    gr.Markdown("### Cloned voices")
    table = gr.Dataframe(headers=CLONE_COLUMNS, interactive=False, datatype=_datatypes(CLONE_COLUMNS, ("created",)))
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
             "yes" if e["case_sensitive"] else "no", _time(e["updated_at"]), e["updated_by"]] for e in rows]


def _entry_id(given: str | int | None) -> int | None:
    """The id typed in the lexicon form: None when empty (a new entry), 0 when it is not an id."""
    given = "" if given is None else str(given).strip()
    if not given:
        return None
    return int(given) if given.isascii() and given.isdigit() and 0 < int(given) < 2**63 else 0


def _render_lexicon(signed_in: gr.State, lexicon: LexiconControl) -> gr.Dataframe:
    """The pronunciation lexicon section: the entries, a form to add, change (give the id) or delete one,
    and TSV export and import (merge) through a text box; each change audited. Returns the table."""
    gr.Markdown("### Pronunciation lexicon")
    table = gr.Dataframe(headers=LEXICON_COLUMNS, interactive=False, datatype=_datatypes(LEXICON_COLUMNS, ("updated",)))
    with gr.Row():
        # a text box: a number box shows 0 when empty, and 0 is no entry's id
        entry_id = gr.Textbox(label="Entry id", placeholder="empty: a new entry", max_length=19, scale=1)
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

    def save_entry(is_signed_in: bool, given: str, language: str, phrase: str, ipa: str, respelling: str,
                   case_sensitive: bool):
        number = _entry_id(given)
        if number == 0:
            return "Not done: the entry id is a whole number (or empty, for a new entry).", gr.skip()

        def change() -> str:
            entry = LexiconEntry(language=language, phrase=phrase, ipa=ipa or None, respelling=respelling or None,
                                 case_sensitive=case_sensitive)
            if number is None:
                return f"Entry {lexicon.add(entry, 'admin-ui')['id']} added."
            return f"Entry {number} changed." if lexicon.change(number, entry, "admin-ui") \
                else f"No entry with id {number}."
        return run(is_signed_in, change)

    def delete_entry(is_signed_in: bool, given: str):
        number = _entry_id(given)
        if not number:
            return "Give the id of the entry to delete.", gr.skip()
        return run(is_signed_in, lambda: f"Entry {number} deleted." if lexicon.delete(number, "admin-ui")
                   else f"No entry with id {number}.")

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
            # a chart of hardware or engines that are not here is one line, not an empty chart
            absent_line = gr.Markdown(elem_id="absent-charts")
            gr.Markdown("### Degrade thresholds and actions")
            fields = OperatorSettings.model_fields  # each with its title (the label, with units) and description
            inputs = {}
            switches = [name for name, info in fields.items() if info.annotation is bool]
            numbers = [name for name, info in fields.items() if info.annotation in (int, float, str)]
            for row in range(0, len(switches), 4):
                with gr.Row():
                    for name in switches[row: row + 4]:
                        inputs[name] = gr.Checkbox(label=fields[name].title, info=fields[name].description,
                                                   min_width=160)
            for row in range(0, len(numbers), 4):
                with gr.Row():
                    for name in numbers[row: row + 4]:
                        info = fields[name]
                        inputs[name] = (gr.Textbox(label=info.title, info=info.description) if info.annotation is str
                                        else gr.Number(label=info.title, info=info.description,
                                                       precision=0 if info.annotation is int else None))
            for name in fields.keys() - switches - set(numbers):  # structured values, edited as JSON
                inputs[name] = gr.Code(label=f"{fields[name].title} (JSON): {fields[name].description}",
                                       language="json", max_lines=14)
            inputs = {name: inputs[name] for name in fields}  # the order save_settings reads them in
            save = gr.Button("Save settings", variant="primary")
            save_message = gr.Markdown()
            gr.Markdown("### API keys")
            with gr.Row():
                key_name = gr.Textbox(label="Key name", scale=2, elem_id="key-name")
                key_tier = gr.Dropdown(list(control.settings.tiers), label="Tier", scale=1)
                create_key = gr.Button("Create key", scale=1)
            key_message = gr.Markdown()
            keys_table = gr.Dataframe(headers=KEY_COLUMNS, interactive=False,
                                      datatype=_datatypes(KEY_COLUMNS, ("created", "revoked")))
            with gr.Row():
                revoke_choice = gr.Dropdown([], value=None, label="key to revoke", scale=2, elem_id="revoke-key")
                revoke = gr.Button("Revoke key", variant="stop", scale=1)
            clones_table = _render_clones(signed_in, clones)
            lexicon_table = _render_lexicon(signed_in, lexicon)
            gr.Markdown("### Audit log")
            audit = gr.Dataframe(headers=AUDIT_COLUMNS, interactive=False, elem_id="audit-log",
                                 datatype=_datatypes(AUDIT_COLUMNS, ("time",)))
            gr.HTML(js_on_load=LOCAL_TIMES_JS)
        audit_shown = gr.State(None)  # the rows the table shows: it is sent again only when they change
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
                return [False, gr.update(), gr.update(), f"{refused.message}.", *[gr.update()] * (2 + len(inputs))]
            return [True, gr.update(visible=False), gr.update(visible=True), "", *_keys(access), *form_values()]

        async def list_clones(is_signed_in: bool):
            return await _clone_rows(clones) if is_signed_in else gr.skip()

        def list_lexicon(is_signed_in: bool):
            return _lexicon_rows(lexicon) if is_signed_in else gr.skip()

        login.click(sign_in, [token], [signed_in, login_box, panel, login_message, keys_table, revoke_choice,
                                       *inputs.values()],
                    api_visibility="private").then(list_clones, [signed_in], [clones_table], api_visibility="private"
                                                   ).then(list_lexicon, [signed_in], [lexicon_table],
                                                          api_visibility="private")

        def refresh(is_signed_in: bool, shown: list | None):
            """The state, the charts, and the audit log (whatever changed it: this tab, the admin API, another
            replica)."""
            if not is_signed_in:
                return [gr.skip()] * (5 + len(plots) + len(replica_plots))
            stats = collect_stats(service, monitor, control, access, replicas)
            charts = [(chart, stats["series"]) for chart in CHARTS]
            charts += [(chart, stats["replica_series"]) for chart in replica_charts(stats["replica_series"])]
            missing = [(chart.title, why) for chart, points in charts if (why := absent(points, chart))]
            rows = _audit_rows(control)
            fresh = rows is not None and rows != shown
            return [state_markdown(stats, control.settings), plot_data(cost_figure(stats["cost_models"])),
                    *(gr.Plot(visible=False) if absent(points, chart)
                      else gr.Plot(plot_data(series_figure(points, chart)), visible=True) for chart, points in charts),
                    gr.Markdown("Not drawn: " + "; ".join(f"**{title}**: {why}" for title, why in missing),
                                visible=bool(missing)),
                    rows if fresh else gr.skip(), rows if fresh else gr.skip()]

        timer.tick(refresh, [signed_in, audit_shown],
                   [state, cost_plot, *plots, *replica_plots, absent_line, audit, audit_shown],
                   api_visibility="private", show_progress="hidden")

        def save_settings(is_signed_in: bool, *values):
            if not is_signed_in:
                return "Sign in first."
            current = control.settings.model_dump()
            changes = {}
            for name, value in zip(inputs, values):
                if value is None:
                    return f"Not saved: {fields[name].title} needs a value"
                kind = fields[name].annotation
                try:
                    value = {int: int, float: float}.get(kind, lambda v: v)(value) if kind in (int, float, str, bool) \
                        else pydantic_core.from_json(value)  # bounded nesting, unlike json.loads
                except ValueError as error:
                    return f"Not saved: {fields[name].title} is not valid ({error})"
                if value != current[name]:
                    changes[name] = value
            if not changes:
                return "Nothing changed."
            try:
                control.update(changes, "admin-ui")
            except InvalidSetting as invalid:
                return f"Not saved: {invalid.message}"
            except StorageError:
                return f"Not saved: {StorageUnavailable().message}"
            return f"Saved and applied: {', '.join(changes)}"

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
        save.click(save_settings, [signed_in, *inputs.values()], [save_message], api_visibility="private")
