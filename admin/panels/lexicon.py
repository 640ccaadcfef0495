"""The pronunciation lexicon panel: the entries, a form to add, change (give the id) or delete one, and TSV
export and import (merge) through a text box; each change audited."""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr
from pydantic import ValidationError

from storage import AlreadyExists, StorageError
from tts_core.errors import StorageUnavailable
from tts_core.text.lexicon import LexiconEntry, LexiconFileError

from ..lexicon import LexiconControl
from .tables import datatypes, empty_hint, hinted, time_cell

LEXICON_COLUMNS = ["id", "language", "phrase", "ipa", "respelling", "case sensitive", "updated", "by"]
NO_ENTRIES = ("**No entries yet.** An entry says how every voice of its language says a word or phrase (names, "
              "brands, jargon): add one with the form below (the phrase and its IPA or a respelling, the id left "
              "empty), or paste TSV and import it.")


def _entry_id(given: str | int | None) -> int | None:
    """The id typed in the form: None when empty (a new entry), 0 when it is not an id."""
    given = "" if given is None else str(given).strip()
    if not given:
        return None
    return int(given) if given.isascii() and given.isdigit() and 0 < int(given) < 2**63 else 0


class LexiconPanel:
    def __init__(self, lexicon: LexiconControl):
        self.lexicon = lexicon

    def render(self, signed_in: gr.State) -> None:
        """The table is filled when the admin signs in (list_lexicon)."""
        gr.Markdown("### Pronunciation lexicon")
        self.table = gr.Dataframe(headers=LEXICON_COLUMNS, interactive=False, wrap=True, elem_id="lexicon-table",
                                  datatype=datatypes(LEXICON_COLUMNS, ("updated",)))
        self.hint = empty_hint(NO_ENTRIES)
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
        form = [entry_id, language, phrase, ipa, respelling, case_sensitive]
        save.click(self.save_entry, [signed_in, *form], [message, *self.outputs], api_visibility="private")
        delete.click(self.delete_entry, [signed_in, entry_id], [message, *self.outputs], api_visibility="private")
        import_.click(self.import_tsv, [signed_in, tsv], [message, *self.outputs], api_visibility="private")
        export.click(self.export_tsv, [signed_in], [tsv, message], api_visibility="private")

    def rows(self) -> list[list]:
        try:
            rows = self.lexicon.entries()
        except StorageError:
            return []
        return [[e["id"], e["language"], e["phrase"], e["ipa"] or "", e["respelling"] or "",
                 "yes" if e["case_sensitive"] else "no", time_cell(e["updated_at"]), e["updated_by"]] for e in rows]

    @property
    def outputs(self) -> list:
        """What a listing fills: the table, and the hint under it while it is empty."""
        return [self.table, self.hint]

    def listing(self) -> tuple[list[list], str]:
        rows = self.rows()
        return rows, hinted(rows, NO_ENTRIES)

    def list_lexicon(self, is_signed_in: bool):
        return self.listing() if is_signed_in else (gr.skip(), gr.skip())

    def _run(self, is_signed_in: bool, change: Callable[[], str]) -> tuple:
        """The change's message and the entries after it, or why it was not done."""
        if not is_signed_in:
            return "Sign in first.", gr.skip(), gr.skip()
        try:
            return change(), *self.listing()
        except ValidationError as error:
            return "Not done: " + "; ".join(f"{'.'.join(map(str, e['loc'])) or 'entry'}: {e['msg']}"
                                             for e in error.errors()), gr.skip(), gr.skip()
        except (AlreadyExists, LexiconFileError) as error:
            return f"Not done: {error}", gr.skip(), gr.skip()
        except StorageError:
            return f"Not done: {StorageUnavailable().message}", gr.skip(), gr.skip()

    def save_entry(self, is_signed_in: bool, given: str, language: str, phrase: str, ipa: str, respelling: str,
                   case_sensitive: bool):
        number = _entry_id(given)
        if number == 0:
            return "Not done: the entry id is a whole number (or empty, for a new entry).", gr.skip(), gr.skip()

        def change() -> str:
            entry = LexiconEntry(language=language, phrase=phrase, ipa=ipa or None, respelling=respelling or None,
                                 case_sensitive=case_sensitive)
            if number is None:
                return f"Entry {self.lexicon.add(entry, 'admin-ui')['id']} added."
            return f"Entry {number} changed." if self.lexicon.change(number, entry, "admin-ui") \
                else f"No entry with id {number}."
        return self._run(is_signed_in, change)

    def delete_entry(self, is_signed_in: bool, given: str):
        number = _entry_id(given)
        if not number:
            return "Give the id of the entry to delete.", gr.skip(), gr.skip()
        return self._run(is_signed_in, lambda: f"Entry {number} deleted." if self.lexicon.delete(number, "admin-ui")
                         else f"No entry with id {number}.")

    def import_tsv(self, is_signed_in: bool, text: str):
        return self._run(is_signed_in, lambda: "Imported: {added} added, {changed} changed, {unchanged} unchanged."
                         .format(**self.lexicon.import_tsv(text or "", "admin-ui")))

    def export_tsv(self, is_signed_in: bool):
        if not is_signed_in:
            return gr.skip(), "Sign in first."
        try:
            return self.lexicon.export_tsv(), ""
        except StorageError:
            return gr.skip(), f"Not done: {StorageUnavailable().message}"
