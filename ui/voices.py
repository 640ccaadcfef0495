"""How the synthesis tab names and shows voices: language names, readable voice names, the voice list
(grouped by language, with each voice's details and a preview button) and the preview's sample text."""

from __future__ import annotations

import html
import re
from collections import Counter
from itertools import groupby

from tts_core.engines import Voice
from tts_core.text.lexicon import language_code
from tts_core.voices.catalogue import Catalogue, speaks

# A table, not a package: the codes voices carry are few (Piper's espeak voices, a registry's "en" or
# "en_US"), and a name for every one of the world's languages is not worth a dependency. An unknown code
# is shown as it is.
LANGUAGES = {
    "ar": "Arabic", "bg": "Bulgarian", "bn": "Bengali", "ca": "Catalan", "cmn": "Chinese", "cs": "Czech",
    "cy": "Welsh", "da": "Danish", "de": "German", "el": "Greek", "en": "English", "es": "Spanish",
    "et": "Estonian", "eu": "Basque", "fa": "Persian", "fi": "Finnish", "fr": "French", "ga": "Irish",
    "gl": "Galician", "he": "Hebrew", "hi": "Hindi", "hr": "Croatian", "hu": "Hungarian", "id": "Indonesian",
    "is": "Icelandic", "it": "Italian", "ja": "Japanese", "ka": "Georgian", "kk": "Kazakh", "ko": "Korean",
    "lb": "Luxembourgish", "lt": "Lithuanian", "lv": "Latvian", "ml": "Malayalam", "ms": "Malay",
    "nb": "Norwegian", "ne": "Nepali", "nl": "Dutch", "no": "Norwegian", "pl": "Polish", "pt": "Portuguese",
    "ro": "Romanian", "ru": "Russian", "sk": "Slovak", "sl": "Slovenian", "sr": "Serbian", "sv": "Swedish",
    "sw": "Swahili", "ta": "Tamil", "te": "Telugu", "th": "Thai", "tr": "Turkish", "uk": "Ukrainian",
    "ur": "Urdu", "vi": "Vietnamese", "yue": "Cantonese", "zh": "Chinese", "und": "Unspecified language",
}
REGIONS = {
    "419": "Latin America", "ar": "Argentina", "at": "Austria", "au": "Australia", "be": "Belgium",
    "br": "Brazil", "ca": "Canada", "ch": "Switzerland", "cn": "China", "de": "Germany", "es": "Spain",
    "fr": "France", "gb": "United Kingdom", "hk": "Hong Kong", "ie": "Ireland", "in": "India", "ir": "Iran",
    "it": "Italy", "jo": "Jordan", "mx": "Mexico", "nl": "Netherlands", "nz": "New Zealand", "pt": "Portugal",
    "tw": "Taiwan", "us": "United States", "za": "South Africa",
}
# What a preview says, in the voice's language (English where none is listed).
SAMPLES = {
    "en": "Hello! This is how I sound.", "de": "Hallo! So klingt meine Stimme.",
    "es": "¡Hola! Así suena mi voz.", "fr": "Bonjour ! Voici ma voix.", "it": "Ciao! Questa è la mia voce.",
    "nl": "Hallo! Zo klinkt mijn stem.", "pt": "Olá! Esta é a minha voz.", "pl": "Cześć! Tak brzmi mój głos.",
}
# Piper's naming: language_REGION-name-quality, and :speaker for one speaker of a multi-speaker model
PIPER_NAME = re.compile(r"[a-z]{2,3}_[A-Z]{2}-(?P<name>[^-:]+)-(?P<quality>x_low|low|medium|high)(?::.+)?")


def language_name(code: str) -> str:
    """ "en-us" is "English (United States)", "es-419" "Spanish (Latin America)"; an unknown code is itself."""
    first, *rest = code.replace("_", "-").lower().split("-")
    name = LANGUAGES.get(first)
    region = next((REGIONS[part] for part in rest if part in REGIONS), None)
    return code if name is None else f"{name} ({region})" if region else name


def voice_label(voice: Voice) -> str:
    """ "en_US-joe-medium" is "Joe (medium)"; a name in another form is itself."""
    match = PIPER_NAME.fullmatch(voice.name)
    if match is None:
        return voice.name
    label = f"{match['name'].replace('_', ' ').title()} ({match['quality'].replace('_', '-')})"
    return f"{label}, speaker {voice.speaker}" if voice.speaker else label


def sample_text(voice: Voice) -> str:
    return SAMPLES.get(language_code(voice.language), SAMPLES["en"])


def _offered(catalogue: Catalogue, caller: str | None, language: str) -> list[tuple[Voice, str]]:
    """The caller's voices (of the language, if one is chosen), by language name, then label."""
    voices = [(voice, engine) for voice, engine in catalogue.visible_voices(caller)
              if not language or speaks(voice, language)]
    return sorted(voices, key=lambda entry: (language_name(entry[0].language), voice_label(entry[0])))


def voice_choices(catalogue: Catalogue, caller: str | None = None, language: str = "") -> list[tuple[str, str]]:
    return [(f"{voice_label(voice)} · {language_name(voice.language)}"
             f"{' · cloned' if voice.name in catalogue.clones else ''}", voice.name)
            for voice, _ in _offered(catalogue, caller, language)]


def language_choices(catalogue: Catalogue, caller: str | None = None) -> list[tuple[str, str]]:
    codes = {language_code(voice.language) for voice in catalogue.voice_list(caller)}
    return [("Any language", "")] + sorted((language_name(code), code) for code in codes)


def voice_details(catalogue: Catalogue, voice: Voice, engine: str, speakers: int) -> list[str]:
    """What the list says of a voice beside its name: its id, model, speaker, rate, OpenAI names."""
    aliases = sorted(alias for alias, target in catalogue.voice_aliases.items() if target == voice.name)
    return [part for part in (
        voice.name if voice_label(voice) != voice.name else "",
        f"model {voice.model}" + (f" ({engine})" if engine not in (voice.model, voice.name) else ""),
        f"speaker {voice.speaker} of {speakers}" if voice.speaker else "",
        f"{voice.sample_rate / 1000:g} kHz",
        f"OpenAI names: {', '.join(aliases)}" if aliases else "",
    ) if part]


def voice_list_html(catalogue: Catalogue, caller: str | None, language: str, chosen: str) -> str:
    """Each voice the caller may use, grouped by language: a row to choose it, a button to hear it."""
    offered = _offered(catalogue, caller, language)
    speakers = Counter(engine for _, engine in catalogue.visible_voices(caller))
    groups = []
    for name, entries in groupby(offered, key=lambda entry: language_name(entry[0].language)):
        rows = []
        for voice, engine in entries:
            clone = catalogue.clones.get(voice.name)
            badge = (f'<span class="chorus-badge">cloned{", public" if clone.public else ", yours"}</span>'
                     if clone else "")
            details = " · ".join(html.escape(part) for part in voice_details(catalogue, voice, engine,
                                                                                speakers[engine]))
            label, value = html.escape(voice_label(voice)), html.escape(voice.name)
            rows.append(f'<li class="chorus-voice{" chosen" if voice.name == chosen else ""}" data-voice="{value}">'
                        f'<button class="chorus-preview" data-voice="{value}" title="Hear {label}" '
                        f'aria-label="Hear {label}">▶</button><span><strong>{label}</strong>{badge}'
                        f'<small>{details}</small></span></li>')
        groups.append(f'<h4>{html.escape(name)}</h4><ul>{"".join(rows)}</ul>')
    return f'<div class="chorus-voices">{"".join(groups)}</div>'
