"""The writing systems a voice's language is written in. Letters of other scripts are left out of what it
is given: a voice reads them, if at all, as their names ("chinese letter chinese letter") or as noise.

One rule for every script: a letter's scripts are its Unicode Script_Extensions property (the Script property,
widened where a letter serves several: the prolonged sound mark ー is both kana's); a letter every script uses
(Common: µ, ℂ; Inherited: some combining marks) is no script's. A voice keeps the letters of its language's
scripts and of Latin (names, brands and acronyms in Latin letters are read by every voice); any other script's
letters, whether or not the table below names it (Mongolian, Tibetan, Ol Chiki as much as Arabic), are foreign.
A language the table does not know keeps every letter: nothing is taken from it.
"""

from __future__ import annotations

import itertools
import unicodedata
from functools import cache

import regex

from ..lexicon import language_code

# script (Unicode's name for it) -> languages written in it, by ISO 639-1 or -3 code
_WRITTEN_IN: dict[str, tuple[str, ...]] = {
    "Latin": ("af", "ca", "cs", "cy", "da", "de", "en", "eng", "es", "et", "eu", "fi", "fr", "fra", "ga", "gl",
              "hr", "hu", "id", "is", "it", "lb", "lt", "lv", "ms", "mt", "nl", "no", "nb", "nn", "pl", "pt", "ro",
              "sk", "sl", "sq", "sv", "sw", "tl", "tr", "vi", "deu", "spa", "ita", "por", "nld", "pol", "tur",
              "vie", "sr", "uz", "az"),
    "Cyrillic": ("be", "bg", "kk", "ky", "mk", "mn", "ru", "rus", "sr", "tg", "uk", "ukr"),
    "Greek": ("el", "ell"),
    "Arabic": ("ar", "ara", "fa", "fas", "ps", "ur", "urd"),
    "Hebrew": ("he", "heb", "yi"),
    "Devanagari": ("hi", "hin", "mr", "ne", "sa"),
    "Bengali": ("bn", "ben", "as"),
    "Gurmukhi": ("pa",),
    "Gujarati": ("gu",),
    "Tamil": ("ta", "tam"),
    "Telugu": ("te", "tel"),
    "Kannada": ("kn",),
    "Malayalam": ("ml",),
    "Sinhala": ("si",),
    "Thai": ("th", "tha"),
    "Lao": ("lo",),
    "Khmer": ("km",),
    "Myanmar": ("my",),
    "Georgian": ("ka",),
    "Armenian": ("hy",),
    "Ethiopic": ("am", "ti"),
    "Han": ("zh", "zho", "cmn", "yue", "ja", "jpn", "ko", "kor"),
    "Hiragana": ("ja", "jpn"),
    "Katakana": ("ja", "jpn"),
    "Hangul": ("ko", "kor"),
}
# how a script is named to a caller, where Unicode's name is not what a person calls it
SCRIPT_NAMES = {"Han": "Chinese characters (Han)"}
_SHARED = regex.compile(r"[\p{scx=Zyyy}\p{scx=Zinh}]")  # letters and marks every script uses
_KNOWN = {script: regex.compile(rf"\p{{scx={script}}}") for script in _WRITTEN_IN}
# the words of a letter's Unicode name that follow its script's name ("OL CHIKI LETTER LA": Ol Chiki)
_AFTER_SCRIPT = ("LETTER", "SYLLABLE", "SIGN", "VOWEL", "CONSONANT", "CHARACTER", "IDEOGRAPH", "HIEROGLYPH", "SMALL",
                 "CAPITAL", "SUBJOINED", "LIGATURE", "MARK", "DIGIT", "FINAL", "MEDIAL", "INITIAL", "INDEPENDENT",
                 "DEPENDENT", "SYMBOL", "VOCALIC", "COMBINING")


@cache
def script_of(char: str) -> str | None:
    """The script of a letter or a mark on one (the first the table knows among its scripts, else the name the
    letter's Unicode name begins with: "Ol Chiki"). None for digits, punctuation, symbols, and letters and marks
    every script uses."""
    if unicodedata.category(char)[0] not in "LM" or _SHARED.match(char):
        return None
    known = next((script for script, pattern in _KNOWN.items() if pattern.match(char)), None)
    if known is not None:
        return known
    words = unicodedata.name(char, "UNNAMED LETTER").split()
    named = list(itertools.takewhile(lambda word: not word.startswith(_AFTER_SCRIPT), words)) or words[:1]
    return " ".join(named).title()


@cache
def scripts_of(language: str) -> frozenset[str] | None:
    """The scripts a language is written in, Latin included; None when the table does not know it."""
    code = language_code(language)
    scripts = frozenset(script for script, languages in _WRITTEN_IN.items() if code in languages)
    return scripts | {"Latin"} if scripts else None


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
    return SCRIPT_NAMES.get(script, script)
