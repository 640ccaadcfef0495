"""An upstream's two pure policies: how many requests to keep in flight there, and when to stop sending.

`InFlightLimit` learns the number as a one-shot engine's batch policy learns batch sizes: from what the work
measured. The audio streams in as the upstream makes it: every WINDOW_S the strategy says how much arrived,
under which limit. A limit's rate is the audio of its latest windows over their time (a cold start's first ones
age out; a median would read an upstream that sends its audio in bursts as slower than it is), and
windows come as fast for requests of 20 s as for requests of 0.2 s (judged by whole requests, a limit took
tens of seconds a step for a model whose requests take 7-20 s: docs/upstream.md).
From the settled count, the limit tries twice as many (TCP's slow start: an upstream that batches 64 is found
in six steps) and keeps it if it makes GAIN times the audio a second, else goes back and stays (trying again
after REPROBE_AFTER windows, in case the load or the upstream changed). An upstream that batches (vLLM) makes
more with each request added until its own batch is full, and is kept full; one that serves one at a time
(Kokoro-FastAPI) gains only the overlap of its own overheads at 2, and stays at one or two. The strategy
reports only windows in which the limit held work back (as many in flight as it allows): with fewer callers
than the limit, what arrives says what they asked, not what the upstream can make, and the limit waits, unjudged,
until the load reaches it. A 429 (or a 503 with Retry-After) halves it.

`CircuitBreaker`: FAILURES upstream failures in a row (refused, hung, 5xx, a cut stream) open it; while open,
requests fail at once with a Retry-After rather than wait for an upstream that is down; after the cool-down
one request probes it (half-open), and its success closes it. Each opening in a row doubles the cool-down, up to
the upstream's max_cool_down_s (MOST_COOL_DOWN_S, a minute, by default). An upstream's own Retry-After lengthens
it, never past that bound (`bounded_retry_after`): one that says a year, or infinity, is still probed within the
bound, and is used again once it answers.

Both take the time as an argument: the strategy passes its clock's, tests a fake one.
"""

from __future__ import annotations

import math
from collections import deque
from enum import StrEnum

from ..engines.base import UpstreamOptions

# Twice as many in flight is kept only if it makes this much more audio a second: more in flight adds to every
# request's latency, and a count's rate measured twice under the same load differs by 10-15% on a busy machine.
GAIN = 1.15
WINDOW_S = 1.0  # the audio received is counted over windows this long
SAMPLES = 6  # windows under a limit before it is judged
WINDOW = 12  # a limit's rate: the audio of its latest windows over their time
REPROBE_AFTER = 64  # windows at a settled limit before twice as many is measured again (the load or upstream changed)


class InFlightLimit:
    def __init__(self, most: int, start: int = 1):
        self.most = most
        self.settled = self.limit = max(1, min(start, most))  # the best count judged so far; the one in force
        self.windows: dict[int, deque[tuple[float, float]]] = {}  # limit -> (audio seconds, seconds) of its latest
        self._above_failed = False  # twice the settled count was measured and did not pay
        self._since = 0  # windows at the settled count since its last judgement

    def observe(self, under: int, audio_s: float, seconds: float) -> None:
        """A window of `seconds` with the limit `under` in force (and something in flight): audio_s arrived."""
        if seconds <= 0 or under != self.limit:  # (a window that began under another limit says nothing of this)
            return
        self.windows.setdefault(under, deque(maxlen=WINDOW)).append((audio_s, seconds))
        self._judge()

    def rate(self, limit: int) -> float | None:
        """The audio a second made under this limit over its latest windows (None until SAMPLES have said)."""
        windows = self.windows.get(limit)
        if windows is None or len(windows) < SAMPLES:
            return None
        return sum(audio_s for audio_s, _ in windows) / sum(seconds for _, seconds in windows)

    def busy(self) -> None:
        """The upstream said it is full: half as many in flight, settled there for a while."""
        self.settled = self.limit = max(1, self.limit // 2)
        self._above_failed, self._since = True, 0

    def _judge(self) -> None:
        settled = self.rate(self.settled)
        if self.limit == self.settled:
            self._since += 1
            if settled is not None and self.limit < self.most and (not self._above_failed
                                                                   or self._since >= REPROBE_AFTER):
                self.limit = min(self.most, 2 * self.settled)  # measure twice as many, afresh
                self.windows[self.limit] = deque(maxlen=WINDOW)
            return
        probed = self.rate(self.limit)
        if probed is None or settled is None:
            return
        if probed >= GAIN * settled:  # it paid: settle there (and measure twice that next)
            self.settled, self._above_failed = self.limit, False
        else:
            self.limit, self._above_failed = self.settled, True
        self._since = 0

    def describe(self) -> dict:
        return {"limit": self.limit, "settled": self.settled, "most": self.most,
                "above_measured": self._above_failed,  # twice the settled count was measured and did not pay
                "audio_s_per_s": {count: round(rate, 3) for count in sorted(self.windows)
                                  if (rate := self.rate(count)) is not None}}


class BreakerState(StrEnum):
    CLOSED = "closed"  # requests go to the upstream
    OPEN = "open"  # they fail at once until the cool-down ends
    HALF_OPEN = "half_open"  # one request probes the upstream


FAILURES = 3  # in a row: the breaker opens
FIRST_COOL_DOWN_S = 2.0
# the cool-down doubles at most this many times before the bound is taken (2 ** 1024 is past a float: an upstream
# failing 1,025 openings in a row made settling raise, and left the breaker half-open with its probe taken)
MOST_DOUBLINGS = 64
# by default (an upstream's max_cool_down_s); also the longest Retry-After an upstream's answer can make callers wait
MOST_COOL_DOWN_S = UpstreamOptions.max_cool_down_s


def bounded_retry_after(seconds: float | None, most_s: float = MOST_COOL_DOWN_S) -> float:
    """An upstream's Retry-After as the breaker and callers use it: within [0, most_s] (infinity, or a year, is
    the bound; NaN, a negative number or none is no wait of its own)."""
    if seconds is None or math.isnan(seconds):
        return 0.0
    return min(most_s, max(0.0, seconds))


class CircuitBreaker:
    def __init__(self, most_cool_down_s: float = MOST_COOL_DOWN_S) -> None:
        self.most_cool_down_s = most_cool_down_s  # the longest it stays open (the upstream's max_cool_down_s)
        self.state = BreakerState.CLOSED
        self.failures = 0  # in a row
        self.opened = 0  # times in a row it has opened (the cool-down doubles each)
        self.open_until = 0.0
        self.probing = False  # the half-open probe is in flight

    def allows(self, now: float) -> bool:
        """Whether a request may go now (the first after a cool-down goes as the probe)."""
        if self.state is BreakerState.OPEN and now >= self.open_until:
            self.state = BreakerState.HALF_OPEN
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.HALF_OPEN and not self.probing:
            self.probing = True
            return True
        return False

    def probe_ended(self) -> None:
        """The probe's request ended without saying whether the upstream works (its caller left, its deadline passed
        with audio, settling it raised, or it was never sent): the next request probes instead."""
        self.probing = False

    def retry_after_s(self, now: float) -> float:
        """How long until the upstream may be tried again (0 when it may be now)."""
        return max(0.0, self.open_until - now) if self.state is BreakerState.OPEN else 0.0

    def succeeded(self) -> None:
        self.state, self.failures, self.opened, self.probing = BreakerState.CLOSED, 0, 0, False

    def failed(self, now: float, retry_after_s: float | None = None) -> None:
        self.failures += 1
        if self.state is BreakerState.HALF_OPEN or self.failures >= FAILURES:
            self.opened += 1
            cool_down = min(self.most_cool_down_s, FIRST_COOL_DOWN_S * 2.0 ** min(self.opened - 1, MOST_DOUBLINGS))
            self.state, self.probing = BreakerState.OPEN, False
            self.open_until = now + max(cool_down, bounded_retry_after(retry_after_s, self.most_cool_down_s))

    def describe(self, now: float) -> dict:
        return {"state": self.state_now(now), "failures_in_a_row": self.failures,
                "retry_after_s": round(self.retry_after_s(now), 3)}

    def state_now(self, now: float) -> str:
        """The state as it stands now (an open breaker whose cool-down has ended reads half-open)."""
        if self.state is BreakerState.OPEN and now >= self.open_until:
            return BreakerState.HALF_OPEN
        return self.state
