"""The Admin tab's settings form without a browser: the tier table's rows and back, refusals in the form's
labels, the storage line's SQLite file."""

from pathlib import Path

from admin.panels.settings import _labelled
from admin.panels.tiers import table_rows, tiers_of
from admin.state import _database
from tts_core.request.operating import OperatorSettings


def test_tiers_make_the_table_and_the_table_makes_the_same_tiers():
    tiers = OperatorSettings().model_dump()["tiers"]
    rows = table_rows(tiers)
    assert rows[0] == ["personal", "300/minute", 0, 5000, True, 0.8, 120.0]
    assert rows[-1][:2] == ["enterprise", ""]  # no rate limit: an empty cell
    assert OperatorSettings().merged({"tiers": tiers_of(rows)}).tiers == OperatorSettings().tiers


def test_the_tables_cells_become_a_tiers_fields():
    # numbers come back as floats (or text), a row without a name is left out, an empty cell takes the default
    rows = [["studio ", "", 3.0, "2000", "true", 0.25, 30], ["", "1/second", 1, 1, False, 1, 1],
            ["lean", "5/minute", None, None, None, None, None]]
    assert tiers_of(rows) == {"studio": {"rate_limit": None, "priority": 3, "max_chars": 2000, "sheddable": True,
                                         "max_queue_share": 0.25, "request_timeout_s": 30.0},
                              "lean": {"rate_limit": "5/minute"}}


def test_refusals_name_the_forms_labels():
    assert _labelled("enter_threshold must be a number above 0 and at most 1") == \
        "Enter at load score (0 to 1) must be a number above 0 and at most 1"
    assert _labelled("tiers.free.max_queue_share must be a number above 0 and at most 1") == \
        "tier free, queue share (0 to 1) must be a number above 0 and at most 1"
    assert _labelled("exit_threshold must be below enter_threshold (0.9 >= 0.85)") == \
        "Leave at load score (0 to 1) must be below Enter at load score (0 to 1) (0.9 >= 0.85)"


def test_the_storage_line_gives_a_sqlite_files_full_path():
    assert _database("sqlite:///data/chorus.db") == f"SQLite file `{Path('data/chorus.db').resolve()}`"
    assert _database("sqlite:////srv/chorus.db") == "SQLite file `/srv/chorus.db`"
    assert _database("postgresql+psycopg://chorus:***@db/chorus") == "`postgresql+psycopg://chorus:***@db/chorus`"


def test_the_forms_help_names_settings_by_their_labels():
    """The Queue help said `overload_wait_target_s`: another setting is named as the form labels it."""
    import re

    import gradio as gr

    from admin.panels.settings import _form_inputs

    with gr.Blocks():
        inputs = _form_inputs()
    helps = {name: component.info or "" for name, component in inputs.items()}
    assert "“Longest queue wait in an overload (s)”" in helps["queue_wait_target_s"]
    assert not [name for name, words in helps.items() if re.search(r"\b[a-z]+_[a-z_]+\b", words)], helps
