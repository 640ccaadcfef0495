"""The rules a request is admitted by: what the operator sets at run time (`OperatorSettings`: degrade mode's
thresholds and actions, the tiers, the cache, the wait targets) and what degrade mode is doing (`DegradeState`,
its `DegradeAction`s).

Admission reads them through `DegradeMode`; the controller that moves the state from the load
(tts_core/degrade.py) sits above, beside the service, with the monitor that feeds it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from pydantic.fields import FieldInfo

from ..errors import InvalidSetting
from ..validation import plain_message
from .access import DEFAULT_TIERS, Tier


class DegradeAction(StrEnum):
    """What degrade mode does while it is on, each switched by the operator setting `<action>_enabled`."""

    CAP_TEXT = "cap_text"  # longer texts refused (503, retry after the mode's expected end)
    CACHE_FIRST = "cache_first"  # repeated texts answered from the audio cache even where it is off
    LOWER_PRECISION = "lower_precision"  # engines with a lower precision switch to it
    SHED = "shed"  # sheddable tiers refused


# Every operator value has bounds: a value past them is refused (422) before anything is stored, so no
# stored value can break the server (an infinite target, a row count SQLite cannot hold).
TierName = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class OperatorSettings(BaseModel):
    """Everything an operator can change at run time. Stored values override these defaults."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    degrade_enabled: bool = Field(True, title="Degrade mode",
                                  description="while the load score is high, apply the actions switched on below")
    enter_threshold: float = Field(0.85, gt=0, le=1, title="Enter at load score (0 to 1)",
                                   description="load score that enters degrade mode")
    exit_threshold: float = Field(0.6, ge=0, lt=1, title="Leave at load score (0 to 1)",
                                  description="load score that leaves it (below enter)")
    exit_hold_s: float = Field(5.0, ge=0, le=3600, title="Hold before leaving (s)",
                               description="seconds the score must stay at or below exit "
                               "before leaving (keeps shedding from flapping the mode)")
    queue_wait_target_s: float = Field(10.0, gt=0, le=3600, title="Longest queue wait (s)",
                                       description="longest predicted queue wait a request "
                                       "is accepted with (longer: 503 with Retry-After); the load score's queue "
                                       "part is the predicted wait of a new caller's sentence over this (over "
                                       "overload_wait_target_s in an overload)")
    overload_wait_target_s: float = Field(2.0, gt=0, le=3600, title="Longest queue wait in an overload (s)",
                                          description="the same, while an engine is offered "
                                          "more work than it can do (the lower of the two applies): an overload's "
                                          "queue stays this short, so that it drains within seconds after")
    cap_text_enabled: bool = Field(True, title="Cap text length",
                                   description="while degraded, refuse texts over the cap")
    cap_text_chars: int = Field(300, ge=1, le=100_000, title="Text cap (characters)",
                                description="longest text accepted while degraded")
    cache_first_enabled: bool = Field(True, title="Cache first", description="while degraded, answer repeated "
                                      "requests from the cache, even with the cache off")
    lower_precision_enabled: bool = Field(True, title="Lower precision", description="while degraded, engines that "
                                          "can run at a lower precision do")
    shed_enabled: bool = Field(False, title="Shed low priority",
                               description="while degraded, refuse callers of sheddable tiers")
    cache_enabled: bool = Field(True, title="Audio cache",
                                description="serve repeated requests from the cache at any load")
    cache_max_mb: float = Field(64, ge=0, le=65_536, title="Audio cache size (MB)",
                                description="memory the audio cache may hold")
    request_log_max_rows: int = Field(100_000, ge=0, le=100_000_000, title="Request log kept (rows)",
                                      description="request log rows kept")
    tiers: dict[TierName, Tier] = Field(default_factory=lambda: dict(DEFAULT_TIERS), min_length=1, max_length=64,
                                        title="Caller tiers", description="caller tiers: rate limit, priority, limits")
    anonymous_tier: TierName = Field("personal", title="Tier of callers without a key",
                                     description="tier of callers without an API key")

    def merged(self, changes: dict[str, Any]) -> OperatorSettings:
        """These settings with changes applied, or InvalidSetting naming the first bad field."""
        unknown = sorted(set(changes) - set(type(self).model_fields))
        if unknown:
            raise InvalidSetting(f"unknown setting {unknown[0]!r}", unknown[0])
        try:
            updated = type(self).model_validate({**self.model_dump(), **changes})
        except ValidationError as error:
            first = error.errors()[0]
            name = str(first["loc"][0]) if first["loc"] else None
            where = ".".join(str(part) for part in first["loc"])  # tiers.free.priority: the value at fault
            raise InvalidSetting(plain_message(first, where, _field(first["loc"])), name) from None
        # A clash between two values names the one being changed (so that from_stored drops only that one).
        if updated.anonymous_tier not in updated.tiers:
            raise InvalidSetting(f"anonymous_tier {updated.anonymous_tier!r} is not one of the tiers "
                                 f"({', '.join(updated.tiers)})", _changed(changes, "anonymous_tier", "tiers"))
        if updated.exit_threshold >= updated.enter_threshold:
            raise InvalidSetting("exit_threshold must be below enter_threshold "
                                 f"({updated.exit_threshold} >= {updated.enter_threshold})",
                                 _changed(changes, "exit_threshold", "enter_threshold"))
        return updated

    @classmethod
    def from_stored(cls, stored: dict[str, Any], defaults: dict[str, Any] | None = None
                    ) -> tuple[OperatorSettings, dict[str, str]]:
        """Built-in defaults, then deployment defaults (TTS_OPERATOR_DEFAULTS), then stored values, and
        the values that were ignored because they do not validate (name -> why), for the caller to report."""
        settings, ignored = cls(), {}
        for layer in (defaults or {}, stored):
            remaining = dict(layer)
            while remaining:
                try:
                    settings = settings.merged(remaining)
                    break
                except InvalidSetting as invalid:
                    # the value at fault goes; should none in this layer be named, the whole layer does
                    at_fault = [invalid.param] if invalid.param in remaining else list(remaining)
                    for name in at_fault:
                        ignored[name] = invalid.message
                        del remaining[name]
        return settings, ignored


def _field(location: tuple) -> FieldInfo | None:
    """The field a value at this place in the settings is (a tier's field inside tiers)."""
    if len(location) == 3 and location[0] == "tiers":
        return Tier.model_fields.get(str(location[2]))
    return OperatorSettings.model_fields.get(str(location[0])) if len(location) == 1 else None


def _changed(changes: dict[str, Any], first: str, second: str) -> str:
    return first if first in changes or second not in changes else second


@dataclass(frozen=True)
class DegradeState:
    active: bool = False
    score: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)
    since: float = field(default_factory=time.time)
    actions: tuple[DegradeAction, ...] = ()
    queue_wait_limit_s: float = 0.0  # the wait target the queue part was measured against (0: not yet)


class DegradeMode(Protocol):
    """What admission reads of degrade mode: its state, the settings in force, and when it is expected to end
    (the controller, tts_core/degrade.py, is the one there is)."""

    state: DegradeState
    settings: OperatorSettings

    def expected_end_s(self) -> float: ...
