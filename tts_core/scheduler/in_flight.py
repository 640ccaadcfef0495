"""An upstream's two pure policies: how many requests to keep in flight there, and when to stop sending.

`InFlightLimit` learns the number as a one-shot engine's batch policy learns batch sizes: from what the work
measured. Each finished request says how much audio it made, in how long, with how many in flight on average
while it ran; the audio a second the upstream makes at n in flight is n times one request's rate there. The
limit is the fewest in flight that make within GAIN of the most measured; while the best is the highest count
measured, the limit goes to twice that count to measure it (TCP's slow start: an upstream that batches 64 is
found in six steps; a step of one more would never pay GAIN past five in flight). An upstream that batches
(vLLM) makes more with each request added until its own batch is full, and is kept full; one that serves one
at a time (Kokoro-FastAPI, a Piper server) makes the same at 2 as at 1, and stays at one or two.
A 429 (or a 503 with Retry-After) halves it.

`CircuitBreaker`: FAILURES upstream failures in a row (refused, hung, 5xx, a cut stream) open it; while open,
requests fail at once with a Retry-After rather than wait for an upstream that is down; after the cool-down
one request probes it (half-open), and its success closes it. Each opening in a row doubles the cool-down.

Both take the time as an argument: the strategy passes its clock's, tests a fake one.
"""

from __future__ import annotations

from enum import StrEnum

# A count is taken over fewer in flight only if it makes this much more audio a second: more in flight adds every
# request's latency, and counts measured under the same load differ by 10-15% on a busy machine (a Chorus serving
# Piper behind another on two cores measured 11.2, 13.6 and 15.4 audio-s/s at 1, 2 and 4 in flight: with 1.1 it
# went to 4 for a gain within that noise).
GAIN = 1.2
SAMPLES = 3  # finished requests at a count before the limit moves past it
SMOOTHING = 0.3  # weight of a new measurement in a count's moving rate


class InFlightLimit:
    def __init__(self, most: int, start: int = 1):
        self.most = most
        self.limit = max(1, min(start, most))
        self.rates: dict[int, float] = {}  # in flight -> audio seconds made a second (moving average)
        self.samples: dict[int, int] = {}

    def observe(self, in_flight: float, audio_s: float, seconds: float) -> None:
        """A request made audio_s of audio in `seconds`, with in_flight requests in flight on average meanwhile."""
        if seconds <= 0 or audio_s <= 0:
            return
        count = max(1, min(self.most, round(in_flight)))
        rate = count * audio_s / seconds
        old = self.rates.get(count)
        self.rates[count] = rate if old is None else (1 - SMOOTHING) * old + SMOOTHING * rate
        self.samples[count] = self.samples.get(count, 0) + 1
        self._choose()

    def busy(self) -> None:
        """The upstream said it is full: half as many in flight (it learns its way back)."""
        self.limit = max(1, self.limit // 2)
        self.rates = {count: rate for count, rate in self.rates.items() if count <= self.limit}

    def _choose(self) -> None:
        measured = {count: rate for count, rate in self.rates.items() if self.samples[count] >= SAMPLES}
        if not measured:
            return
        best = max(measured.values())
        enough = min(count for count, rate in measured.items() if rate * GAIN >= best)
        highest = max(measured)
        # measure twice as many while the best is the highest count measured (and the limit has reached it)
        exploring = enough == highest and self.limit >= highest and highest < self.most
        self.limit = min(self.most, 2 * highest) if exploring else enough

    def describe(self) -> dict:
        return {"limit": self.limit, "most": self.most,
                "audio_s_per_s": {count: round(rate, 3) for count, rate in sorted(self.rates.items())}}


class BreakerState(StrEnum):
    CLOSED = "closed"  # requests go to the upstream
    OPEN = "open"  # they fail at once until the cool-down ends
    HALF_OPEN = "half_open"  # one request probes the upstream


FAILURES = 3  # in a row: the breaker opens
FIRST_COOL_DOWN_S = 2.0
MOST_COOL_DOWN_S = 60.0


class CircuitBreaker:
    def __init__(self) -> None:
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

    def retry_after_s(self, now: float) -> float:
        """How long until the upstream may be tried again (0 when it may be now)."""
        return max(0.0, self.open_until - now) if self.state is BreakerState.OPEN else 0.0

    def succeeded(self) -> None:
        self.state, self.failures, self.opened, self.probing = BreakerState.CLOSED, 0, 0, False

    def failed(self, now: float, retry_after_s: float | None = None) -> None:
        self.failures += 1
        if self.state is BreakerState.HALF_OPEN or self.failures >= FAILURES:
            self.opened += 1
            cool_down = min(MOST_COOL_DOWN_S, FIRST_COOL_DOWN_S * 2 ** (self.opened - 1))
            self.state, self.probing = BreakerState.OPEN, False
            self.open_until = now + max(cool_down, retry_after_s or 0.0)

    def describe(self, now: float) -> dict:
        return {"state": self.state_now(now), "failures_in_a_row": self.failures,
                "retry_after_s": round(self.retry_after_s(now), 3)}

    def state_now(self, now: float) -> str:
        """The state as it stands now (an open breaker whose cool-down has ended reads half-open)."""
        if self.state is BreakerState.OPEN and now >= self.open_until:
            return BreakerState.HALF_OPEN
        return self.state
