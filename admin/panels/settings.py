"""The settings panel: the operator settings (OperatorSettings, each field with its title and description) in
groups, the caller tiers as a table and the anonymous tier as a choice among them; saved and applied
together, each change audited. A refusal names a setting by the label the form shows it with."""

from __future__ import annotations

import re

import gradio as gr

from storage import StorageError
from tts_core.errors import InvalidSetting, StorageUnavailable
from tts_core.request.operating import OperatorSettings

from ..control import OperatorControl
from .tiers import COLUMNS, anonymous_choice, table_rows, tier_table, tier_words, tiers_of

FIELDS = OperatorSettings.model_fields  # each with its title (the label, with units) and description
GROUPS = {  # a field in none of them is shown under "Other settings", so that none is left out
    "Degrade mode": ["degrade_enabled", "enter_threshold", "exit_threshold", "exit_hold_s", "cap_text_enabled",
                     "cap_text_chars", "cache_first_enabled", "lower_precision_enabled", "shed_enabled"],
    "Queue": ["queue_wait_target_s", "overload_wait_target_s"],
    "Cache and request log": ["cache_enabled", "cache_max_mb", "request_log_max_rows"],
}
TIERS_GROUP = "Caller tiers"  # the tiers table and the anonymous tier


def _input(name: str) -> gr.components.Component:
    info = FIELDS[name]
    described = _named(info.description or "", "“{}”")  # another setting by its label, not its field name
    if info.annotation is bool:
        return gr.Checkbox(label=info.title, info=described)
    if info.annotation is str:
        return gr.Textbox(label=info.title, info=described)
    return gr.Number(label=info.title, info=described, precision=0 if info.annotation is int else None)


def _named(message: str, shown: str = "{}") -> str:
    """The message with each setting's field name as the form's label ("cap_text_chars" is "Text cap
    (characters)"), shaped by `shown`."""
    return re.sub(r"\b[a-z]+(?:_[a-z]+)+\b", lambda found: shown.format(FIELDS[found[0]].title)
                  if found[0] in FIELDS else found[0], message)


def _form_inputs() -> dict:
    """An accordion per group, its switches four a row, then its numbers four a row; then the tiers. Keyed in
    the fields' order (the order save_settings reads them in)."""
    inputs = {}
    grouped = {name for names in GROUPS.values() for name in names} | {"tiers", "anonymous_tier"}
    others = [name for name in FIELDS if name not in grouped]
    for title, names in [*GROUPS.items(), *([("Other settings", others)] if others else [])]:
        with gr.Accordion(title, open=True):
            switches = [name for name in names if FIELDS[name].annotation is bool]
            values = [name for name in names if name not in switches]
            for row in [switches[at: at + 4] for at in range(0, len(switches), 4)] + \
                       [values[at: at + 4] for at in range(0, len(values), 4)]:
                with gr.Row():
                    for name in row:
                        with gr.Column(min_width=160):  # a column each: on a phone they stack, not squeeze
                            inputs[name] = _input(name)
    with gr.Accordion(TIERS_GROUP, open=True):
        inputs["tiers"] = tier_table()
        gr.Markdown(tier_words())
        inputs["anonymous_tier"] = gr.Dropdown([], label=FIELDS["anonymous_tier"].title,
                                               info=FIELDS["anonymous_tier"].description, elem_id="anonymous-tier")
    return {name: inputs[name] for name in FIELDS}


def _labelled(message: str) -> str:
    """A refusal in the form's words: a setting by its label, a tier's field by its column
    ("tiers.free.priority must be ..." is "tier free, priority must be ...")."""
    message = re.sub(r"\btiers\.([^.\s]+)\.(\w+)",
                     lambda found: f"tier {found[1]}, {COLUMNS.get(found[2], found[2])}", message)
    return _named(message)


class SettingsPanel:
    def __init__(self, control: OperatorControl):
        self.control = control

    def render(self, signed_in: gr.State) -> None:
        self.inputs = _form_inputs()
        save = gr.Button("Save settings", variant="primary")
        message = gr.Markdown(elem_id="settings-message")
        save.click(self.save_settings, [signed_in, *self.inputs.values()], [message, *self.inputs.values()],
                   api_visibility="private")

    def form_values(self) -> list:
        """The settings in force, in the form's inputs' order (the tiers as the table's rows)."""
        settings = self.control.settings
        tiers = settings.model_dump()["tiers"]
        return [table_rows(tiers) if name == "tiers" else anonymous_choice(tiers, settings.anonymous_tier)
                if name == "anonymous_tier" else getattr(settings, name) for name in self.inputs]

    def save_settings(self, is_signed_in: bool, *values):
        """The message, and the form again as the settings now in force (a new tier joins the choices)."""
        unchanged = [gr.skip()] * len(self.inputs)
        if not is_signed_in:
            return "Sign in first.", *unchanged
        try:
            changes = self._changes(values)
            if not changes:
                return "Nothing changed.", *unchanged
            self.control.update(changes, "admin-ui")
        except InvalidSetting as invalid:
            return f"Not saved: {_labelled(invalid.message)}", *unchanged
        except StorageError:
            return f"Not saved: {StorageUnavailable().message}", *unchanged
        return f"Saved and applied: {', '.join(FIELDS[name].title for name in changes)}", *self.form_values()

    def _changes(self, values: tuple) -> dict:
        """The form's values that differ from the settings in force (InvalidSetting: one that is not a value)."""
        current = self.control.settings.model_dump()
        changes = {}
        for name, value in zip(self.inputs, values, strict=True):
            if value is None or value == "":
                raise InvalidSetting(f"{name} needs a value", name)
            kind = FIELDS[name].annotation
            try:
                value = tiers_of(value) if name == "tiers" else {int: int, float: float}.get(kind, lambda v: v)(value)
            except (TypeError, ValueError) as error:
                raise InvalidSetting(f"{name} is not valid ({error})", name) from None
            if value != current[name]:
                changes[name] = value
        return changes
