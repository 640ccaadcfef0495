"""The settings panel: the degrade thresholds and actions (OperatorSettings, each field with its title and
description), saved and applied together, each change audited."""

from __future__ import annotations

import json

import gradio as gr
import pydantic_core

from storage import StorageError
from tts_core.errors import InvalidSetting, StorageUnavailable
from tts_core.ops.degrade import OperatorSettings

from ..control import OperatorControl

FIELDS = OperatorSettings.model_fields  # each with its title (the label, with units) and description


def _form_inputs() -> dict:
    """An input per field: switches four a row, then numbers and text four a row, then structured values as
    JSON; keyed in the fields' order (the order save_settings reads them in)."""
    inputs = {}
    switches = [name for name, info in FIELDS.items() if info.annotation is bool]
    numbers = [name for name, info in FIELDS.items() if info.annotation in (int, float, str)]
    for row in range(0, len(switches), 4):
        with gr.Row():
            for name in switches[row: row + 4]:
                inputs[name] = gr.Checkbox(label=FIELDS[name].title, info=FIELDS[name].description, min_width=160)
    for row in range(0, len(numbers), 4):
        with gr.Row():
            for name in numbers[row: row + 4]:
                info = FIELDS[name]
                inputs[name] = (gr.Textbox(label=info.title, info=info.description) if info.annotation is str
                                else gr.Number(label=info.title, info=info.description,
                                               precision=0 if info.annotation is int else None))
    for name in FIELDS.keys() - switches - set(numbers):  # structured values, edited as JSON
        inputs[name] = gr.Code(label=f"{FIELDS[name].title} (JSON): {FIELDS[name].description}",
                               language="json", max_lines=14)
    return {name: inputs[name] for name in FIELDS}


class SettingsPanel:
    def __init__(self, control: OperatorControl):
        self.control = control

    def render(self, signed_in: gr.State) -> None:
        gr.Markdown("### Degrade thresholds and actions")
        self.inputs = _form_inputs()
        save = gr.Button("Save settings", variant="primary")
        message = gr.Markdown()
        save.click(self.save_settings, [signed_in, *self.inputs.values()], [message], api_visibility="private")

    def form_values(self) -> list:
        """The settings in force, in the form's inputs' order (structured values as JSON)."""
        settings = self.control.settings
        return [json.dumps(settings.model_dump()[name], indent=2) if isinstance(getattr(settings, name), dict)
                else getattr(settings, name) for name in self.inputs]

    def save_settings(self, is_signed_in: bool, *values):
        if not is_signed_in:
            return "Sign in first."
        current = self.control.settings.model_dump()
        changes = {}
        for name, value in zip(self.inputs, values):
            if value is None:
                return f"Not saved: {FIELDS[name].title} needs a value"
            kind = FIELDS[name].annotation
            try:
                value = {int: int, float: float}.get(kind, lambda v: v)(value) if kind in (int, float, str, bool) \
                    else pydantic_core.from_json(value)  # bounded nesting, unlike json.loads
            except ValueError as error:
                return f"Not saved: {FIELDS[name].title} is not valid ({error})"
            if value != current[name]:
                changes[name] = value
        if not changes:
            return "Nothing changed."
        try:
            self.control.update(changes, "admin-ui")
        except InvalidSetting as invalid:
            return f"Not saved: {invalid.message}"
        except StorageError:
            return f"Not saved: {StorageUnavailable().message}"
        return f"Saved and applied: {', '.join(changes)}"
