"""What every panel of the synthesis tab shares, passed to each explicitly: the service and the server's settings,
how a browser's caller is identified and admitted, the voice clones, and the takes' folder."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from clones import VoiceClones
from tts_core.config import Settings
from tts_core.errors import ChorusError
from tts_core.request.access import Caller
from tts_core.service import SpeechService

log = logging.getLogger("ui")

Admit = Callable[[gr.Request], Awaitable[tuple[Caller, object]]]  # identifies and rate-limits a UI caller
Identify = Callable[[gr.Request], Caller]  # identifies a UI caller (counting nothing)


def refused(error: ChorusError) -> gr.Error:
    """An expected refusal (a limit, a bad input) shown to the user, and one line in the log: no traceback."""
    log.info("UI request refused (%d %s): %s", error.status, error.code, error.message)
    return gr.Error(error.message, print_exception=False)


@dataclass(frozen=True)
class UiContext:
    service: SpeechService
    settings: Settings  # the server's (its limits, its data folder)
    admit: Admit
    identify: Identify
    clones: VoiceClones
    out_dir: Path  # each take's files (ui/takes.py), which ui/files.py serves

    def caller_of(self, request: gr.Request) -> Caller | None:
        try:
            return self.identify(request)
        except ChorusError:  # no key where keys are required: the voices everyone may use
            return None

    def identity_of(self, request: gr.Request) -> str | None:
        caller = self.caller_of(request)
        return caller.identity if caller else None
