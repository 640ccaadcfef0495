"""The "Clone a voice" panel: a clip, uploaded or recorded, becomes a voice of the caller's (through the same
VoiceClones as the API), chosen in the voice list at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import gradio as gr

from storage import StorageError
from tts_core.errors import ChorusError, ErrorCode, InvalidRequest, StorageUnavailable

from .context import UiContext, refused
from .voices import voice_choices


def _read_upload(path: str, limit: int) -> bytes:
    """The clip Gradio kept; its upload was bounded already, this keeps a recording to the API's limit."""
    if Path(path).stat().st_size > limit:
        raise InvalidRequest(f"the clip is larger than {limit} bytes (TTS_MAX_BODY_BYTES)", "audio",
                             ErrorCode.BODY_TOO_LARGE)
    return Path(path).read_bytes()


NO_CLONING_MODEL = ("**Cloning is not available on this server.** It needs a model that can clone voices (Pocket TTS "
                    "or VibeVoice), and this server has none: an operator adds one to the voice registry (see "
                    "docs/voices.md, \"Cloned voices\"). The voices above can be used as they are.")


class ClonePanel:
    """The panel offers the form only where a model can clone; elsewhere one line says why (a fresh install's
    bundled voice cannot: the form offered an empty model list, and Clone answered "model '' does not exist")."""

    def __init__(self, context: UiContext):
        self.context = context

    def render(self, voice: gr.Dropdown) -> None:
        """The panel; a new voice is chosen in `voice`."""
        models = self.context.service.cloning_models()
        with gr.Accordion("Clone a voice", open=False):
            self.unavailable = gr.Markdown(self.why_not(models), visible=not models, elem_id="clone-unavailable")
            with gr.Column(visible=bool(models)) as self.form:
                gr.Markdown("Upload or record 3 to 30 s of one person speaking (wav, mp3, flac or ogg). "
                            "The new voice is yours to use; an admin may make it public.")
                with gr.Row():
                    clip = gr.Audio(sources=["upload", "microphone"], type="filepath", label="Clip", scale=2)
                    with gr.Column(scale=2):
                        name = gr.Textbox(label="Voice name", max_length=48, placeholder="letters, digits, . _ -")
                        self.model = gr.Dropdown(models, value=models[0] if models else None,
                                                 label="Model (one that can clone)")
                        transcript = gr.Textbox(label="What the clip says (optional)", lines=2)
                        consent = gr.Checkbox(label="The speaker consents to this clone of their voice")
                        clone_button = gr.Button("Clone", elem_id="clone-voice")
                result = gr.Markdown()
            # a refusal's toast says what is wrong; the voice list, changed only by a new voice, is not marked failed
            clone_button.click(self.clone, [clip, name, self.model, transcript, consent], [result, voice],
                               api_name="clone_voice", concurrency_limit=4, show_progress_on=[result])

    @property
    def page_outputs(self) -> list:
        """What models_now updates when a page loads."""
        return [self.model, self.unavailable, self.form]

    def why_not(self, models: list[str]) -> str:
        """Why this server offers no cloning, in words a person reads (nothing where it does)."""
        if models:
            return ""
        refusal = self.context.service.cloning_refusal()
        return f"**Cloning is not available here:** {refusal}." if refusal else NO_CLONING_MODEL

    def models_now(self) -> tuple:
        """The models that can clone, and the form or the line saying why none (the registry may have been
        reloaded since the page was built)."""
        models = self.context.service.cloning_models()
        return (gr.Dropdown(choices=models, value=models[0] if models else None),
                gr.Markdown(self.why_not(models), visible=not models), gr.Column(visible=bool(models)))

    async def clone(self, clip: str | None, name: str, model: str | None, transcript: str, consent: bool,
                    request: gr.Request):
        """A voice from the clip, then the caller's voice list with it chosen."""
        service = self.context.service
        try:
            caller, _ = await self.context.admit(request)
            if not clip:
                raise InvalidRequest("record or upload a clip of the voice first", "audio")
            data = await asyncio.to_thread(_read_upload, clip, self.context.settings.max_body_bytes)
            record = await self.context.clones.create(caller, data, (name or "").strip(), model or "", bool(consent),
                                                      (transcript or "").strip() or None)
        except ChorusError as error:
            raise refused(error) from None
        except StorageError:
            raise refused(StorageUnavailable()) from None
        return (f"Voice **{record['name']}** is ready ({record['duration_s']:.1f} s clip); it is yours to use "
                "until an admin makes it public.",
                gr.Dropdown(choices=voice_choices(service.catalogue_now(), caller.identity), value=record["name"]))
