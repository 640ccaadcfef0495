"""Degrade mode: a load score in [0, 1] turns graceful-degradation actions on and off.

The score measures load, not the length of the work: its main part is how long a new request
would wait in the queue before its synthesis starts (predicted from the work ranked ahead of it
and the engine's measured speed), over the operator's wait target. A single long text on an idle
server keeps that near zero (its later sentences take turns with newcomers); an overload raises it
within a tick, and it falls as soon as the queue drains.

The operator settings (thresholds, which actions, their parameters) are a typed model with
defaults; their stored values come from the admin API and apply to the running process live.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from pydantic.fields import FieldInfo

from ..errors import InvalidSetting
from ..request.access import DEFAULT_TIERS, Tier
from ..validation import plain_message


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
class LoadInputs:
    queue_wait_s: float  # predicted wait of a new caller's sentence before its synthesis starts, busiest engine
    queue_wait_limit_s: float  # the wait target in force there: queue_wait_target_s, or overload_wait_target_s
    device_memory_used: float | None  # fraction in use; None without a device


def load_score(inputs: LoadInputs) -> tuple[float, dict[str, float]]:
    """The worst of the pressures, each scaled to [0, 1]. (How many pieces of text are queued is not
    one: one long text fills the queue with pieces and is no load; a full queue refuses on its own.)"""
    parts = {"queue_wait": min(1.0, float(inputs.queue_wait_s) / inputs.queue_wait_limit_s)}
    if inputs.device_memory_used is not None:
        parts["device_memory"] = min(1.0, inputs.device_memory_used)
    return max(parts.values()), parts


@dataclass(frozen=True)
class DegradeState:
    active: bool = False
    score: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)
    since: float = field(default_factory=time.time)
    actions: tuple[DegradeAction, ...] = ()
    queue_wait_limit_s: float = 0.0  # the wait target the queue part was measured against (0: not yet)


class DegradeController:
    """Hysteresis between two thresholds, plus a hold before leaving; thread-safe reads of the
    current state and settings. An operator's change of settings applies at once, hold or not."""

    def __init__(self, settings: OperatorSettings | None = None, clock=time.monotonic):
        self._lock = threading.Lock()
        self._clock = clock
        self._calm_since: float | None = None  # when the score last went to or below exit_threshold
        self.settings = settings or OperatorSettings()
        self.state = DegradeState()
        # model -> why its lower precision is off: a batch failed in it (tts_core.scheduler.precision); kept across the
        # model's reloads, until the operator resets it
        self.precision_off: dict[str, str] = {}

    def configure(self, settings: OperatorSettings) -> None:
        with self._lock:
            self.settings = settings
            active = self.state.active and self.state.score > settings.exit_threshold
            self.state = self._next(active, self.state.score, self.state.parts, self.state.queue_wait_limit_s)

    def update(self, inputs: LoadInputs) -> DegradeState:
        with self._lock:
            score, parts = load_score(inputs)
            now = self._clock()
            calm = score <= self.settings.exit_threshold
            if not calm:
                self._calm_since = None
            elif self._calm_since is None:
                self._calm_since = now
            active = self.state.active
            if not self.settings.degrade_enabled:
                active = False
            elif not active and score >= self.settings.enter_threshold:
                active = True
            elif active and calm and now - self._calm_since >= self.settings.exit_hold_s:
                active = False
            self.state = self._next(active, score, parts, inputs.queue_wait_limit_s)
            return self.state

    def expected_end_s(self) -> float:
        """Seconds until the mode is expected to end at the current load: the time for the queue's wait to
        drain down to the exit threshold, then the hold (0 when not active)."""
        with self._lock:
            state, settings = self.state, self.settings
            if not state.active:
                return 0.0
            if self._calm_since is not None:
                return max(0.0, settings.exit_hold_s - (self._clock() - self._calm_since))
            excess = max(0.0, state.parts.get("queue_wait", state.score) - settings.exit_threshold)
            return excess * state.queue_wait_limit_s + settings.exit_hold_s

    def _next(self, active: bool, score: float, parts: dict[str, float], queue_wait_limit_s: float) -> DegradeState:
        active = active and self.settings.degrade_enabled
        since = self.state.since if active == self.state.active else time.time()
        actions = tuple(action for action in DegradeAction
                        if active and getattr(self.settings, f"{action}_enabled"))
        return DegradeState(active, round(score, 4), parts, since, actions, queue_wait_limit_s)
