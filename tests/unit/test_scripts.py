"""Scripts a voice cannot read are refused by one rule, whatever the script (its letters' Unicode script against
the voice's language), not by a list of the scripts someone thought of: Mongolian, Tibetan and Ol Chiki were read
by an English voice as long noise while Arabic was refused."""

from __future__ import annotations

import pytest

from tts_core.text.frontend import UnspeakableScript, normalize_text
from tts_core.text.frontend.scripts import foreign_scripts, script_of

SCRIPTS = {  # text -> how the refusal names its script
    "ᠮᠣᠩᠭᠣᠯ ᠬᠡᠯᠡ": "Mongolian", "བོད ཡིག": "Tibetan", "ᱚᱞ ᱪᱤᱠᱤ": "Ol Chiki", "مرحبا بالعالم": "Arabic",
    "नमस्ते दुनिया": "Devanagari", "สวัสดีชาวโลก": "Thai", "你好世界": "Chinese characters (Han)",
    "ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ": "Cherokee", "ⵜⴰⵎⴰⵣⵉⵖⵜ": "Tifinagh", "ސަލާމް": "Thaana", "ꆈꌠꁱꂷ": "Yi",
}


@pytest.mark.parametrize("text", SCRIPTS)
def test_a_text_in_any_script_an_english_voice_cannot_read_is_refused_naming_it(text):
    with pytest.raises(UnspeakableScript) as refused:
        normalize_text(text, "en_US")
    assert f"written in {SCRIPTS[text]}," in str(refused.value) and refused.value.code == "unsupported_script"


@pytest.mark.parametrize("text", SCRIPTS)
def test_its_letters_are_left_out_of_a_text_with_english_in_it(text):
    spoken = normalize_text(f"Hello {text} world.", "en_US").text
    assert spoken.split() == ["Hello", "world."]


def test_letters_every_script_uses_and_latin_are_kept():
    assert script_of("µ") is None and script_of("1") is None and script_of(".") is None
    assert foreign_scripts("Café naïve e\u0301 ﬁ ʼ 2nd ªº", "en_US") == set()
    assert foreign_scripts("ー", "en_US") == {"Hiragana"}  # Common, but used by kana only: kana's
    assert normalize_text("こんにちは、カタカナー", "ja").text == "こんにちは、カタカナー"


def test_a_language_written_in_a_script_keeps_it_and_a_language_not_known_keeps_everything():
    assert foreign_scripts("Привет мир", "ru") == set() and foreign_scripts("你好", "zh") == set()
    assert foreign_scripts("ᠮᠣᠩᠭᠣᠯ", "xx") == set()
