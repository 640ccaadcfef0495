"""Degrade mode: a load score in [0, 1] turns graceful-degradation actions on and off.

The score measures load, not the length of the work: its main part is how long a new request
would wait in the queue before its synthesis starts (predicted from the work ranked ahead of it
and the engine's measured speed), over the operator's wait target. A single long text on an idle
server keeps that near zero (its later sentences take turns with newcomers); an overload raises it
within a tick, and it falls as soon as the queue drains.

The operator settings (thresholds, which actions, their parameters) are a typed model with
defaults; their stored values come from the admin API and apply to the running process live. They and the
state are records below, in tts_core/request/operating.py, where admission reads them; this controller sits
beside the service, and the monitor (tts_core/monitor.py) feeds it the load.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from .request.operating import DegradeAction, DegradeState, OperatorSettings


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
