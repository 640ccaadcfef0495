"""The voice panel: the language, the voice, the list of the caller's voices (a row to choose one, a button
to hear it) and the preview's player."""

from __future__ import annotations

import base64
import html
import time

import gradio as gr

from tts_core.errors import ChorusError, ErrorCode, InvalidRequest
from tts_core.request.ask import Ask

from . import browser
from .context import UiContext, refused
from .voices import language_choices, sample_text, voice_choices, voice_label, voice_list_html

PREVIEWS_KEPT = 64  # voice samples kept in memory


class VoicePicker:
    def __init__(self, context: UiContext):
        self.context = context
        self.previews: dict[tuple, str] = {}  # (voice, its clone record) -> its sample, mp3 in base64

    def render(self) -> None:
        catalogue = self.context.service.catalogue_now()
        self.language = gr.Dropdown(language_choices(catalogue), value="", label="Language")
        mixes = any(capabilities.mixes_voices for capabilities in catalogue.capabilities.values())
        # a mix of voices is typed (af_bella+af_sky, af_bella(2)+af_sky(1)) where a model mixes them
        self.voice = gr.Dropdown(voice_choices(catalogue), value=catalogue.default_voice, label="Voice",
                                 allow_custom_value=mixes, info="or a mix: af_bella+af_sky(2)" if mixes else None)
        self.voice_list = gr.HTML(voice_list_html(catalogue, None, "", catalogue.default_voice),
                                  elem_id="voice-list", max_height=320, js_on_load=browser.VOICES_JS,
                                  css_template=browser.VOICES_CSS)
        preview_box = gr.HTML(elem_id="voice-preview", js_on_load=browser.PREVIEW_JS)
        self.language.change(self.pick_language, [self.language], [self.voice], api_name="pick_language")
        self.voice.change(self.show_voices, [self.language, self.voice], [self.voice_list], api_visibility="private")
        self.voice_list.choose(self.choose, None, [self.voice], api_visibility="private")
        self.voice_list.preview(self.preview, None, [preview_box], api_visibility="private", concurrency_limit=4)

    def for_caller(self, identity: str | None) -> tuple[gr.Dropdown, gr.Dropdown, str]:
        """The voice and language lists and the voice list of the caller's voices (the registry may have been
        reloaded since the page was built)."""
        catalogue = self.context.service.catalogue_now()
        return (gr.Dropdown(choices=voice_choices(catalogue, identity)),
                gr.Dropdown(choices=language_choices(catalogue, identity), value=""),
                voice_list_html(catalogue, identity, "", catalogue.default_voice))

    def pick_language(self, language: str, request: gr.Request) -> gr.Dropdown:
        """The voices that speak the language, the language's own voice chosen (every voice for "")."""
        caller, catalogue = self.context.identity_of(request), self.context.service.catalogue_now()
        chosen = catalogue.voice_for_language(language, None, caller)[0].name if language else catalogue.default_voice
        return gr.Dropdown(choices=voice_choices(catalogue, caller, language), value=chosen)

    def show_voices(self, language: str, chosen: str, request: gr.Request) -> str:
        return voice_list_html(self.context.service.catalogue_now(), self.context.identity_of(request), language or "",
                               chosen)

    def choose(self, event: gr.EventData) -> str:
        return getattr(event, "voice", None) or gr.skip()

    async def preview(self, event: gr.EventData, request: gr.Request) -> str:
        """A short sample of the voice, made once (and counted against the caller's limit then)."""
        name, service = str(getattr(event, "voice", "")), self.context.service
        catalogue, previews = service.catalogue_now(), self.previews
        try:
            found = catalogue.voices.get(name) if catalogue.visible(name, self.context.identity_of(request)) else None
            if found is None:
                raise InvalidRequest(f"voice {name!r} does not exist", "voice", ErrorCode.VOICE_NOT_FOUND)
            key = (name, catalogue.clones.get(name))  # a clone made again under its name is a new voice
            if key not in previews:
                caller, _ = await self.context.admit(request)
                spoken = await service.answer(Ask(sample_text(found[0]), name, response_format="mp3", caller=caller))
                if len(previews) >= PREVIEWS_KEPT:
                    previews.pop(next(iter(previews)))
                previews[key] = base64.b64encode(spoken.data).decode()
        except ChorusError as error:
            raise refused(error) from None
        return (f'<p>{html.escape(voice_label(found[0]))}: “{html.escape(sample_text(found[0]))}”</p>'
                f'<audio controls autoplay data-at="{time.time()}" src="data:audio/mpeg;base64,{previews[key]}">'
                "</audio>")
