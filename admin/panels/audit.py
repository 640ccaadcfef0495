"""The audit log panel: the newest changes, by whom, from this tab, the admin API or another replica."""

from __future__ import annotations

import json

import gradio as gr

from storage import StorageError

from ..control import OperatorControl
from .tables import datatypes, empty_hint, time_cell

AUDIT_COLUMNS = ["time", "actor", "action", "what", "old value", "new value"]
NO_CHANGES = ("**No changes yet.** Every change an admin makes, here or through the admin API (settings, keys, "
              "cloned voices, the lexicon), is listed here, newest first, with who made it and the values before "
              "and after.")


def _value(value) -> str:
    return "" if value is None else json.dumps(value) if isinstance(value, (dict, list)) else str(value)


class AuditLog:
    def __init__(self, control: OperatorControl):
        self.control = control

    def render(self) -> None:
        """The table is refreshed with the dashboard, and sent again only when its rows change."""
        # wrapped: a setting's new value (the tiers' JSON) is read whole, not cut at the column's edge
        self.table = gr.Dataframe(headers=AUDIT_COLUMNS, interactive=False, elem_id="audit-log", wrap=True,
                                  datatype=datatypes(AUDIT_COLUMNS, ("time",)))
        self.hint = empty_hint(NO_CHANGES)

    def rows(self) -> list[list] | None:
        """The newest entries; None when the database fails (the state line above says so)."""
        try:
            entries = self.control.audit()
        except StorageError:
            return None
        return [[time_cell(e["at"]), e["actor"], e["action"], e["key"], _value(e["old_value"]),
                 _value(e["new_value"])] for e in entries]
