"""Another server's model, through its OpenAI-compatible speech API (vLLM-Omni, Kokoro-FastAPI, another Chorus).
Voices of one model on one server share one engine; its model-level options may be set on any of them."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from ..base import UpstreamOptions
from ..contract import FrontEnd
from ..kind import Described, EngineKind, VoiceOptions

if TYPE_CHECKING:
    from ...config import Settings

# an upstream model's options (any of its voices may set each)
UPSTREAM_OPTIONS = ("api_key_env", "sample_rate", "timeout_s", "extra_body", "max_in_flight", "max_cool_down_s",
                    "clones", "instructions", "normalize", "lexicon", "ssml")


class UpstreamVoice(VoiceOptions):
    engine: Literal["upstream"]
    url: str | None = Field(None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$", description="upstream: the server's "
                            "base URL (requests go to {url}/v1/audio/speech)")
    upstream_voice: str | None = Field(None, min_length=1, description="upstream: the voice's name there")
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="upstream: the "
                                    "environment variable holding its API key")
    sample_rate: int | None = Field(None, ge=8000, le=192000, description="upstream: its raw PCM's rate "
                                    "(default 24000)")
    timeout_s: float | None = Field(None, gt=0, le=3600, description="upstream: the longest wait for its next "
                                    "bytes (default 60)")
    extra_body: dict[str, Any] | None = Field(None, description="upstream: fields sent with every request")
    max_in_flight: int | None = Field(None, ge=1, le=1024, description="upstream: the most requests in flight "
                                      "(default 16; the number used is learned)")
    max_cool_down_s: float | None = Field(None, ge=1, le=3600, description="upstream: the longest its circuit "
                                          "breaker stays open, and the longest Retry-After its answers can make "
                                          "callers wait (default 60)")
    clones: bool | None = Field(None, description="upstream: it clones per request (vLLM-Omni's ref_audio and "
                                "ref_text): voices cloned here for it send their clip and transcript")
    instructions: bool | None = Field(None, description="upstream: it takes a request's instructions (how to "
                                      "speak): they are passed on")
    normalize: bool | None = Field(None, description="upstream: false: Chorus sends the text as written (no "
                                   "markdown, number or symbol reading)")
    lexicon: bool | None = Field(None, description="upstream: false: the operator's pronunciations are not applied")
    ssml: bool | None = Field(None, description="upstream: false: SSML is sent as it is, for the upstream to read")

    listed_as: ClassVar[tuple[str, str] | None] = ("upstream_voice", "{}")  # a listed voice's name there

    @model_validator(mode="after")
    def _has_a_server(self):
        if self.url is None:
            raise ValueError("an upstream voice needs the url of its server")
        return self

    @property
    def server(self) -> str | None:
        return self.url


def upstream_options(entries: list[UpstreamVoice]) -> UpstreamOptions:
    """One upstream model's options: each set on any of its voices (the first voice that sets it wins)."""
    given = {name: next(value for entry in entries if (value := getattr(entry, name)) is not None)
             for name in UPSTREAM_OPTIONS if any(getattr(entry, name) is not None for entry in entries)}
    given["extra_body"] = json.dumps(given.get("extra_body", {}), sort_keys=True)
    front_end = FrontEnd(**{name: given.pop(name) for name in ("normalize", "lexicon", "ssml") if name in given})
    return UpstreamOptions(entries[0].url.rstrip("/"), language=entries[0].language or "en", front_end=front_end,
                           **given)


def describe(model: str, entries: dict[str, UpstreamVoice], name: str, settings: Settings) -> Described:
    from ..upstream import UpstreamEngine, describe_upstream

    options = upstream_options(list(entries.values()))
    voices = [replace(entry.voice_spec(voice), upstream_voice=entry.upstream_voice, upstream=options)
              for voice, entry in entries.items()]
    described, capabilities = describe_upstream(model, voices, name, options)
    return described, capabilities, lambda: UpstreamEngine(model, voices, name, options)


def listed(model: str, entries: dict[str, UpstreamVoice]) -> list[str]:
    """The voices the server lists (GET /v1/audio/voices)."""
    from ..upstream import listed_voices

    return listed_voices(upstream_options(list(entries.values())), model)


KIND = EngineKind(UpstreamVoice, describe, lists=listed)
