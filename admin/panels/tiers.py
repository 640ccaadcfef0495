"""The caller tiers as a table, one row per tier (a column per field of Tier), and the anonymous tier as a
choice among them: what the settings form shows in place of the tiers' JSON."""

from __future__ import annotations

import math

import gradio as gr

from tts_core.request.access import Tier

# each column's heading, in the table's order: the tier's name, then Tier's fields
COLUMNS = {"name": "tier", "rate_limit": "rate limit (empty: none)", "priority": "priority",
           "max_chars": "longest text (chars)", "sheddable": "sheddable", "max_queue_share": "queue share (0 to 1)",
           "request_timeout_s": "deadline (s)"}
FIELD_OF_COLUMN = {heading: name for name, heading in COLUMNS.items()}
DATATYPES = {str: "str", int: "number", float: "number", bool: "bool"}


def tier_table() -> gr.Dataframe:
    fields = Tier.model_fields
    return gr.Dataframe(
        headers=list(COLUMNS.values()), interactive=True, type="array", column_count=len(COLUMNS),
        label="Caller tiers", show_label=False,
        datatype=["str", *(DATATYPES.get(fields[name].annotation, "str") for name in list(COLUMNS)[1:])],
        elem_id="tier-table")


def tier_words() -> str:
    """What the table's columns mean, and how rows are added and removed."""
    fields = Tier.model_fields
    return ("One row per tier: add a row for a new tier from a cell's menu (⋮), empty a row's name to remove it; "
            "a cell left empty takes its default. "
            + "; ".join(f"*{COLUMNS[name]}*: {fields[name].description}" for name in list(COLUMNS)[1:]) + ".")


def table_rows(tiers: dict) -> list[list]:
    """The tiers (name -> a Tier's fields) as the table's rows."""
    return [[name, *("" if tier[field] is None else tier[field] for field in list(COLUMNS)[1:])]
            for name, tier in tiers.items()]


def tiers_of(rows: list[list]) -> dict[str, dict]:
    """The table's rows as tiers (name -> fields) to validate: a row without a name is left out, an empty rate
    limit is none, a cell left empty takes Tier's default."""
    tiers = {}
    for row in rows:
        name, *values = ["" if _empty(value) else value for value in row]
        if not str(name).strip():
            continue
        tier = {field: _typed(field, value) for field, value in zip(list(COLUMNS)[1:], values, strict=True)
                if value != "" or field == "rate_limit"}
        tiers[str(name).strip()] = tier
    return tiers


def _empty(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (isinstance(value, str) and
                                                                                not value.strip())


def _typed(field: str, value):
    """A cell as the field's type: the table hands numbers as floats, and may hand any cell as text."""
    kind = Tier.model_fields[field].annotation
    if field == "rate_limit":
        return str(value).strip() or None
    if kind is bool:
        return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "yes", "1")
    if kind in (int, float):
        number = float(value)  # a cell that is not a number: ValueError, said by the form
        return int(number) if kind is int and number.is_integer() else number
    return value


def anonymous_choice(tiers: dict, chosen: str) -> gr.Dropdown:
    return gr.Dropdown(choices=list(tiers), value=chosen)
