"""The pronunciation lexicon: matching, TSV, the front end's pronunciations, chunk splitting around
them, what each kind of engine is given, storage with its version and audit, replicas, and the Admin
tab's section."""

import time

import gradio as gr
import pytest
from pydantic import ValidationError

from admin.lexicon import LexiconControl
from admin.panels.lexicon import LexiconPanel
from storage import AlreadyExists, Storage, sqlite_url
from tests.fakes import FakeEngine
from tts_core.config import Settings
from tts_core.controls import ServiceControls
from tts_core.engines.piper import PiperEngine, bundled_voice_path
from tts_core.ops.metrics import Metrics
from tts_core.service import SpeechService
from tts_core.text.chunks import split_chunks
from tts_core.text.frontend import NormalizationOptions, normalize_text
from tts_core.text.frontend.pieces import PRONUNCIATION
from tts_core.text.lexicon import MAX_IMPORT_LINES, Lexicon, LexiconEntry, LexiconFileError, from_tsv, to_tsv
from tts_core.text.pronunciation import Pronounced, as_text, split_marked


def entry(phrase: str, ipa: str | None = "ə", respelling: str | None = None, language: str = "en",
          case_sensitive: bool = False) -> LexiconEntry:
    return LexiconEntry(language=language, phrase=phrase, ipa=ipa, respelling=respelling,
                        case_sensitive=case_sensitive)


def found(lexicon: Lexicon, text: str, language: str = "en_US") -> list[tuple[str, str]]:
    return [(text[start:end], match.phrase) for start, end, match in lexicon.matches(language, text)]


def test_phrases_match_whole_words_longest_first():
    lexicon = Lexicon([entry("New York"), entry("New York City"), entry("York"), entry("AT&T"), entry("Don")])
    text = "New York City, new york and Yorkshire; AT&T, at & t, don't, Don's York."
    assert found(lexicon, text) == [("New York City", "New York City"), ("new york", "New York"),
                                     ("AT&T", "AT&T"), ("Don", "Don"), ("York", "York")]


def test_case_sensitivity_and_language():
    lexicon = Lexicon([entry("US", case_sensitive=True), entry("Nice", language="fr", case_sensitive=True)])
    assert found(lexicon, "us and the US") == [("US", "US")]
    assert found(lexicon, "Nice and nice", "fr-FR") == [("Nice", "Nice")]
    assert found(lexicon, "Nice", "en") == [] and found(lexicon, "US", "de") == []


def test_a_thousand_entries_over_four_thousand_characters_is_quick():
    lexicon = Lexicon([entry(f"word{index} thing{index}") for index in range(1000)] + [entry("a " * 40)])
    text = ("word7 thing7 and word8 then a " * 200)[:4000]
    started = time.perf_counter()
    matches = lexicon.matches("en", text)
    assert time.perf_counter() - started < 1.0 and len(matches) >= 100


@pytest.mark.parametrize("fields, problem", [
    ({"ipa": None}, "ipa, respelling or both"), ({"phrase": "!!"}, "letter or a digit"),
    ({"ipa": "a/b"}, r"\[, \] or /"), ({"language": "english"}, "language"), ({"phrase": "x" * 101}, "phrase"),
    ({"ipa": "ə" * 201}, "ipa"), ({"phrase": "a\x07b"}, "control"),
])
def test_entries_are_validated(fields, problem):
    with pytest.raises(ValidationError, match=problem):
        LexiconEntry(**({"language": "en", "phrase": "word", "ipa": "wɜːd"} | fields))


def test_tsv_round_trip_and_bad_lines_named():
    entries = [entry("Worcester", "ˈwʊstər"), entry("Nguyen", None, "win", case_sensitive=True)]
    assert from_tsv(to_tsv(entries)) == entries
    with pytest.raises(LexiconFileError) as error:
        from_tsv("language\tphrase\tipa\trespelling\tcase_sensitive\n# a comment\n\nen\tok\tə\t\n"
                 "en\tbad\t\t\tfalse\nen\ttwo fields\nen\tok\tɪ\t\tfalse\nen\tx\tə\t\tmaybe\n")
    assert [number for number, _ in error.value.problems] == [5, 6, 7, 8]
    assert "line 7" in str(error.value) and "line 4 too" in str(error.value)
    with pytest.raises(LexiconFileError, match="at most"):
        from_tsv("en\tword\tə\n" * (MAX_IMPORT_LINES + 2))


def test_the_front_end_makes_the_same_pronunciation_as_an_inline_override():
    lexicon = Lexicon([entry("Worcester", "ˈwʊstər")])
    from_lexicon = normalize_text("Visit Worcester on 3 May.", "en_US", lexicon=lexicon)
    inline = normalize_text("Visit [Worcester](/ˈwʊstər/) on 3 May.", "en_US")
    assert from_lexicon.text == inline.text
    [piece] = [piece for piece in from_lexicon.pieces if piece.kind == PRONUNCIATION]
    assert (piece.start, piece.end, piece.ipa) == (6, 15, "ˈwʊstər")
    assert as_text(from_lexicon.text) == "Visit Worcester on the third of May."
    assert as_text(normalize_text("Worcester$5", "en", lexicon=lexicon).text) == "Worcester five dollars"
    as_written = normalize_text("Worcester $5", "en", NormalizationOptions(normalize=False), lexicon).text
    assert as_written == Pronounced("Worcester", "ˈwʊstər").marked() + " $5"


def test_a_respelling_is_what_character_voices_say():
    lexicon = Lexicon([entry("Nguyen", None, "win"), entry("Worcester", "ˈwʊstər")])
    spoken = normalize_text("Nguyen from Worcester", "en", lexicon=lexicon).text
    assert as_text(spoken) == "win from Worcester"
    assert split_marked(spoken) == [Pronounced("Nguyen", None, "win"), " from ", Pronounced("Worcester", "ˈwʊstər")]


def test_chunk_splitting_never_cuts_a_pronunciation():
    marked = Pronounced("Mr. Smith. Jr", "ˈmɪstɚ smɪθ. dʒuːnjɚ").marked()
    text = f"Hello. {marked} is here, and more words follow. " + "word " * 10
    chunks = split_chunks(text, 20)
    assert any(marked in chunk for chunk in chunks)
    assert all(chunk.count("\x0e") == chunk.count("\x0f") for chunk in chunks)


@pytest.fixture(scope="module")
def piper():
    return PiperEngine(bundled_voice_path())


def ids(piper: PiperEngine, text: str, lexicon: Lexicon = Lexicon()) -> list[int]:
    [tokens] = piper.tokenize(normalize_text(text, "en_US", lexicon=lexicon).text, "joe")
    return tokens.tolist()


def test_piper_is_given_the_entrys_phonemes(piper):
    text = "We drove to Worcester today."
    before = ids(piper, text)
    lexicon = Lexicon([entry("Worcester", "ˈwʊstəɹʃaɪɚ")])
    after = ids(piper, text, lexicon)
    assert after != before
    phoneme_ids = piper.config.phoneme_id_map
    spliced = [phoneme_ids[char][0] for char in "ˈwʊstəɹʃaɪɚ"]
    assert _contains(after, spliced, pad=phoneme_ids["_"][0]) and not _contains(before, spliced, phoneme_ids["_"][0])
    assert ids(piper, "We drove to [Worcester](/ˈwʊstəɹʃaɪɚ/) today.") == after  # inline: the same ids
    lexicon = Lexicon([entry("Worcester", None, "wuster")])  # no IPA: espeak reads the respelling
    assert ids(piper, text, lexicon) == ids(piper, "We drove to wuster today.")


def _contains(ids: list[int], wanted: list[int], pad: int) -> bool:
    """wanted, each id followed by Piper's pad id, somewhere in ids."""
    padded = [value for wanted_id in wanted for value in (wanted_id, pad)][:-1]
    return any(ids[index:index + len(padded)] == padded for index in range(len(ids)))


def test_ipa_the_voice_has_no_symbol_for_is_dropped(piper):
    assert ids(piper, "[Worcester](/wʊ☃stər/)") == ids(piper, "[Worcester](/wʊstər/)")


def test_storage_audits_each_change_and_replicas_follow(tmp_path):
    url = sqlite_url(tmp_path / "chorus.db")
    storage = Storage(url)
    storage.migrate()
    served_here, served_there = (SpeechService(Settings(), [FakeEngine()], Metrics()) for _ in range(2))
    here = LexiconControl(storage, ServiceControls(served_here))
    there = LexiconControl(Storage(url), ServiceControls(served_there))  # a replica
    here.refresh(), there.refresh()
    added = here.add(entry("Worcester", "ˈwʊstər"), "ops")
    assert len(served_here.admission.lexicon) == 1 and len(served_there.admission.lexicon) == 0
    with pytest.raises(AlreadyExists):
        here.add(entry("Worcester", "x"), "ops")
    there.refresh()
    assert served_there.admission.lexicon.entries == (entry("Worcester", "ˈwʊstər"),)
    changed = here.change(added["id"], entry("Worcester", "ˈwʊstɚ"), "ops")
    assert changed["ipa"] == "ˈwʊstɚ" and here.change(999, entry("x"), "ops") is None
    assert here.import_tsv("en\tWorcester\tˈwʊstɚ\nen\tNguyen\t\twin\n", "ops") == {
        "added": 1, "changed": 0, "unchanged": 1}
    assert here.delete(added["id"], "ops")["phrase"] == "Worcester" and here.delete(added["id"], "ops") is None
    there.refresh()
    assert [item.phrase for item in served_there.admission.lexicon.entries] == ["Nguyen"]
    actions = [row["action"] for row in storage.audit.recent()]
    assert actions == ["lexicon.delete", "lexicon.import", "lexicon.change", "lexicon.add"]
    assert here.export_tsv("en") == "language\tphrase\tipa\trespelling\tcase_sensitive\nen\tNguyen\t\twin\tfalse\n"
    assert here.entries("de") == []


def test_the_admin_tab_section_adds_changes_imports_and_deletes(tmp_path):
    storage = Storage(sqlite_url(tmp_path / "chorus.db"))
    storage.migrate()
    service = SpeechService(Settings(), [FakeEngine()], Metrics())
    lexicon = LexiconControl(storage, ServiceControls(service))
    with gr.Blocks() as page:
        panel = LexiconPanel(lexicon)
        panel.render(gr.State(True))
    handlers = {function.name: function.fn for function in page.fns.values()}
    rows, hint = panel.list_lexicon(True)  # an empty lexicon says what goes there and how
    assert rows == [] and "No entries yet" in hint and "form below" in hint
    assert handlers["save_entry"](True, None, "en", "Worcester", "ˈwʊstər", "", False)[0] == "Entry 1 added."
    assert "give ipa, respelling or both" in handlers["save_entry"](True, None, "en", "Worcester", "", "", False)[0]
    message, rows, hint = handlers["save_entry"](True, "1", "en", "Worcester", "ˈwʊstɚ", "", True)
    assert hint == ""
    assert message == "Entry 1 changed." and rows[0][1:6] == ["en", "Worcester", "ˈwʊstɚ", "", "yes"]
    assert "line 1" in handlers["import_tsv"](True, "en\tbad\n")[0]
    assert handlers["import_tsv"](True, "en\tNguyen\t\twin\n")[0] == "Imported: 1 added, 0 changed, 0 unchanged."
    assert handlers["export_tsv"](True)[0].splitlines()[1:] == ["en\tNguyen\t\twin\tfalse",
                                                                "en\tWorcester\tˈwʊstɚ\t\ttrue"]
    assert handlers["delete_entry"](True, 1)[0] == "Entry 1 deleted."
    assert handlers["delete_entry"](False, 2)[0] == "Sign in first."
    assert [entry.phrase for entry in service.admission.lexicon.entries] == ["Nguyen"]
