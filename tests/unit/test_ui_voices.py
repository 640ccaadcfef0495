"""The synthesis tab's names for voices and languages, its voice list, and what it accepts of a browser's
history."""

import json
import time

from tts_core.config import Settings
from tts_core.engines import ModelSpec, Voice
from tts_core.request.captions import CaptionWord
from tts_core.voices.catalogue import Catalogue
from tts_core.voices.cloning import ClonedVoice
from ui import takes
from ui.speak import words_html
from ui.voices import language_choices, language_name, voice_choices, voice_label, voice_list_html

JOE = Voice("en_US-joe-medium", "piper", "en-us", 22050)
RP = Voice("en_GB-alan-low", "piper", "en-gb-x-rp", 16000)
LIBRI = Voice("en_US-libritts_r-medium:12", "piper", "en-us", 22050, speaker="12")
FRENCH = Voice("mms-fra", "vits", "fr", 16000)


def catalogue(**clones: ClonedVoice) -> Catalogue:
    other_speaker = Voice("en_US-libritts_r-medium:3", "piper", "en-us", 22050, speaker="3")
    specs = [ModelSpec(name, voices, load=lambda: None)
             for name, voices in (("joe", [JOE, RP]), ("libritts", [LIBRI, other_speaker]), ("mms-fra", [FRENCH]))]
    return Catalogue.build(specs, Settings(default_voice="en_US-joe-medium", voice_aliases={"alloy": JOE.name}),
                           clones)


def test_languages_and_voices_have_readable_names():
    assert language_name("en-us") == "English (United States)"
    assert language_name("en-gb-x-rp") == "English (United Kingdom)"
    assert language_name("es_419") == "Spanish (Latin America)"
    assert language_name("fr") == "French" and language_name("qqq") == "qqq"
    assert voice_label(JOE) == "Joe (medium)" and voice_label(FRENCH) == "mms-fra"
    assert voice_label(LIBRI) == "Libritts R (medium), speaker 12"


def test_the_voice_list_is_grouped_by_language_with_details_and_previews():
    choices = voice_choices(catalogue())
    assert choices[0] == ("Alan (low) · English (United Kingdom)", "en_GB-alan-low")  # by language, then name
    assert choices[-1] == ("mms-fra · French", "mms-fra")
    assert language_choices(catalogue()) == [("Any language", ""), ("English", "en"), ("French", "fr")]
    page = voice_list_html(catalogue(), None, "", JOE.name)
    headings = [part.split("</h4>")[0] for part in page.split("<h4>")[1:]]
    assert headings == ["English (United Kingdom)", "English (United States)", "French"]
    assert 'class="chorus-voice chosen" data-voice="en_US-joe-medium"' in page
    assert "en_US-joe-medium · model piper (joe) · 22.05 kHz · OpenAI names: alloy" in page
    assert "speaker 12 of 2" in page and page.count('class="chorus-preview"') == 5
    assert "French" not in voice_list_html(catalogue(), None, "en", JOE.name)


def test_cloned_voices_are_marked_and_private_ones_shown_to_their_owner_only():
    mine = ClonedVoice("<b>anna</b>", "joe", "ip:10.0.0.1", False, "anna.wav")
    listed = catalogue(**{mine.name: mine})
    assert "cloned, yours" in voice_list_html(listed, "ip:10.0.0.1", "", JOE.name)
    assert "&lt;b&gt;anna" in voice_list_html(listed, "ip:10.0.0.1", "", JOE.name)  # escaped
    assert "anna" not in voice_list_html(listed, "ip:10.0.0.2", "", JOE.name)


def test_downloads_are_named_from_the_voice_and_the_first_words():
    assert takes.file_stem("en_US-joe-medium", "Hello from the browser tab. More.") == \
        "en_US-joe-medium-hello-from-the-browser-tab"
    assert takes.file_stem("libritts:12", "¡Hola, señor!") == "libritts_12-hola-señor"
    assert takes.file_stem("joe", "...") == "joe-speech"


def test_the_history_keeps_only_takes_of_ours_whose_files_remain(tmp_path):
    take = takes.Take(tmp_path)
    path = take.finish(b"audio", "joe-hello", "mp3", {}, "")
    entry = {"take": take.id, "name": path.name, "text": "<i>hi</i>", "label": "Joe", "at": time.time(),
             "duration_s": 1.5}
    (tmp_path / "secret.txt").write_text("not yours")
    forged = [{"take": "../..", "name": "secret.txt"}, {"take": take.id, "name": "../../secret.txt"},
              {"take": "0123456789ab", "name": "gone.mp3"}, "junk"]
    assert takes.entries([entry, *forged], tmp_path) == [entry]
    assert takes.entries("not a list", tmp_path) == [] and len(takes.entries([entry] * 30, tmp_path)) == 20
    page = takes.history_html([entry], tmp_path)
    assert "&lt;i&gt;hi&lt;/i&gt;" in page and f'download="{path.name}"' in page
    player, words = takes.replay(entry, tmp_path)
    assert json.loads(player)["download"].endswith(f"{take.id}/{path.name}") and words == ""
    assert takes.forget([entry], "../..", tmp_path) == [entry] and (tmp_path / "secret.txt").exists()
    assert takes.forget([entry], take.id, tmp_path) == [] and not take.folder.exists()


def test_a_takes_files_are_linked_by_its_id_and_their_names_never_a_path(tmp_path):
    """ui/files.py's route finds a take's file by what the link says: a take of ours and a file's name."""
    take = takes.Take(tmp_path)
    path = take.finish(b"audio", "libritts_12-hola-señor", "mp3", {"srt": "1"}, "")
    assert takes.file_url(path) == f"ui/files/{take.id}/libritts_12-hola-se%C3%B1or.mp3"
    assert str(tmp_path) not in json.dumps(takes.downloads(path)) and "file=" not in json.dumps(takes.downloads(path))
    assert takes.kept_file(tmp_path, take.id, path.name) == path
    (tmp_path / "secret.txt").write_text("not yours")
    for forged in ((take.id, "../../secret.txt"), ("..", "secret.txt"), (take.id, "gone.mp3"), ("0" * 12, path.name)):
        assert takes.kept_file(tmp_path, *forged) is None


def test_a_take_offers_its_file_and_its_subtitles_once_each(tmp_path):
    """The player links the whole file and its subtitles (the history links the file again); a replay too."""
    take = takes.Take(tmp_path)
    path = take.finish(b"audio", "joe-hello", "mp3", {"srt": "1", "vtt": "WEBVTT"}, "")
    links = takes.downloads(path)
    assert links["name"] == "joe-hello.mp3" and [link["name"] for link in links["subtitles"]] == \
        ["joe-hello.srt", "joe-hello.vtt"]
    player, _ = takes.replay({"take": take.id, "name": path.name}, tmp_path)
    assert json.loads(player)["subtitles"] == links["subtitles"]


def test_the_words_line_is_the_text_as_written_with_each_word_marked():
    text = 'Hi, "Ann" & <Bob>!\nBye.'
    words = [CaptionWord("Hi", 0.0, 0.2, 0, 2), CaptionWord("Ann", 0.2, 0.5, 5, 8), CaptionWord("&", 0.5, 0.6, 10, 11),
             CaptionWord("Bob", 0.6, 0.9, 13, 16)]
    done = words_html(text, [*words, CaptionWord("Bye", 1.0, 1.3, 19, 22)], True, done=True)
    assert done == ('<p class="chorus-words"><span class="chorus-word" data-start="0.000" data-end="0.200">Hi</span>'
                    ', &quot;<span class="chorus-word" data-start="0.200" data-end="0.500">Ann</span>&quot; '
                    '<span class="chorus-word" data-start="0.500" data-end="0.600">&amp;</span> &lt;'
                    '<span class="chorus-word" data-start="0.600" data-end="0.900">Bob</span>&gt;!\n'
                    '<span class="chorus-word" data-start="1.000" data-end="1.300">Bye</span>.</p>')
    # while it is spoken: the text up to the last word said, and the punctuation right after it
    assert words_html(text, words, True).endswith('Bob</span>&gt;!</p>')
    assert "cannot time its words" in words_html(text, [], False)
