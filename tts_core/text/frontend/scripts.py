"""The writing systems a voice's language is written in. Letters of other scripts are left out of what it
is given: a voice reads them, if at all, as their names ("chinese letter chinese letter").

Latin letters are kept for every language (names, brands and acronyms in Latin letters are read by
every voice). A language this table does not know keeps every letter: nothing is taken from it.
"""

from __future__ import annotations

import unicodedata
from functools import cache

from ..lexicon import language_code

# script (the first word of a Unicode character name) -> languages written in it, by ISO 639-1 or -3 code
_WRITTEN_IN: dict[str, tuple[str, ...]] = {
    "LATIN": ("af", "ca", "cs", "cy", "da", "de", "en", "eng", "es", "et", "eu", "fi", "fr", "fra", "ga", "gl",
              "hr", "hu", "id", "is", "it", "lb", "lt", "lv", "ms", "mt", "nl", "no", "nb", "nn", "pl", "pt", "ro",
              "sk", "sl", "sq", "sv", "sw", "tl", "tr", "vi", "deu", "spa", "ita", "por", "nld", "pol", "tur",
              "vie", "sr", "uz", "az"),
    "CYRILLIC": ("be", "bg", "kk", "ky", "mk", "mn", "ru", "rus", "sr", "tg", "uk", "ukr"),
    "GREEK": ("el", "ell"),
    "ARABIC": ("ar", "ara", "fa", "fas", "ps", "ur", "urd"),
    "HEBREW": ("he", "heb", "yi"),
    "DEVANAGARI": ("hi", "hin", "mr", "ne", "sa"),
    "BENGALI": ("bn", "ben", "as"),
    "GURMUKHI": ("pa",),
    "GUJARATI": ("gu",),
    "TAMIL": ("ta", "tam"),
    "TELUGU": ("te", "tel"),
    "KANNADA": ("kn",),
    "MALAYALAM": ("ml",),
    "SINHALA": ("si",),
    "THAI": ("th", "tha"),
    "LAO": ("lo",),
    "KHMER": ("km",),
    "MYANMAR": ("my",),
    "GEORGIAN": ("ka",),
    "ARMENIAN": ("hy",),
    "ETHIOPIC": ("am", "ti"),
    "CJK": ("zh", "zho", "cmn", "yue", "ja", "jpn", "ko", "kor"),
    "HIRAGANA": ("ja", "jpn"),
    "KATAKANA": ("ja", "jpn"),
    "HANGUL": ("ko", "kor"),
}
# how a script is named to a caller
SCRIPT_NAMES = {"CJK": "Chinese characters (Han)", "HANGUL": "Hangul", "HIRAGANA": "Hiragana",
                "KATAKANA": "Katakana"}


def script_of(char: str) -> str | None:
    """The script of a letter or a mark on one (None for digits, punctuation, symbols and scripts not in the
    table)."""
    if unicodedata.category(char)[0] not in "LM":
        return None
    script = unicodedata.name(char, "").split(" ", 1)[0]
    return script if script in _WRITTEN_IN else None


@cache
def scripts_of(language: str) -> frozenset[str] | None:
    """The scripts a language is written in, Latin included; None when the table does not know it."""
    code = language_code(language)
    scripts = frozenset(script for script, languages in _WRITTEN_IN.items() if code in languages)
    return scripts | {"LATIN"} if scripts else None


def foreign_to(language: str):
    """A test for the characters a voice of `language` cannot speak (None: it can speak every one)."""
    own = scripts_of(language)
    if own is None:
        return None
    return lambda char: (script := script_of(char)) is not None and script not in own


def foreign_scripts(text: str, language: str) -> set[str]:
    """The scripts of `text` that a voice of `language` cannot speak."""
    own = scripts_of(language)
    return set() if own is None else {script for char in text if (script := script_of(char)) and script not in own}


def writes(language: str, scripts: set[str]) -> bool:
    """Whether a language is known to be written in every one of these scripts."""
    own = scripts_of(language)
    return own is not None and scripts <= own


def script_name(script: str) -> str:
    return SCRIPT_NAMES.get(script, script.title())
