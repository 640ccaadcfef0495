"""The upstream strategy: an engine loop's third shape, for a model another server runs (and batches) itself.

Chorus's queue still decides who goes next (tiers, aging, deadlines, a stream's due times); this strategy
decides how many go at once. Each turn of the engine loop settles the requests that have ended, stops those
whose caller has gone, and sends queued items while fewer than the learned limit are in flight
(tts_core.scheduler.in_flight): each is one HTTP request to the upstream, run on the strategy's I/O thread
(an asyncio loop of its own, so that hundreds can be in flight), whose audio goes out piece by piece as it
arrives. The I/O thread only reads the upstream and hands pieces out; everything else (futures, the queue's
books, what the limit and the breaker learn) happens on the engine loop's thread, which an ended request wakes.

While the circuit breaker is open, queued items fail at once with a 503 upstream_unavailable and the
Retry-After of the breaker's cool-down; every request is bounded by its caller's deadline.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field

import numpy as np

from ..engines.contract import EngineInput, EngineOutput, Upstream
from ..engines.upstream import UpstreamFailed, UpstreamRejected
from ..errors import ChorusError, ClientGone, DeadlineExceeded, ErrorCode, InvalidRequest, Overloaded, PartFailed
from .engine_loop import Serving
from .in_flight import (
    WINDOW_S,
    BreakerState,
    CircuitBreaker,
    InFlightLimit,
    bounded_retry_after,
)
from .records import QueuedItem

log = logging.getLogger(__name__)

WARM_UP_TEXT = "Warm up."
MOST_WAIT_S = 1.0  # a turn at the limit waits at most this long (queued deadlines are checked each turn)
BINDING = 0.9  # a window counts when this share of the limit was in flight on average
BREAKER_GAUGE = {BreakerState.CLOSED: 0.0, BreakerState.HALF_OPEN: 0.5, BreakerState.OPEN: 1.0}


@dataclass(eq=False)
class Flight:
    """One request in flight at the upstream."""

    item: QueuedItem
    sent_at: float  # on the clock
    in_flight_area: float  # the strategy's in-flight integral when it was sent
    pieces: list[np.ndarray] = field(default_factory=list)  # written by the I/O thread until it ends
    task: Future | None = None
    ended_at: float = 0.0
    error: BaseException | None = None  # how it ended (None: with its audio)
    settled: bool = False
    probe: bool = False  # sent as the half-open breaker's probe: its slot is given back however it ends


POLICY = "upstream"  # its policy's name on the status page


@dataclass(frozen=True)
class BreakerStatus:
    state: str  # closed, open, half_open (in_flight.BreakerState)
    failures_in_a_row: int
    retry_after_s: float


@dataclass(frozen=True)
class UpstreamStatus:
    """An upstream model's figures: its server, the requests in flight there, the learned limit on them (in_flight.
    InFlightLimit: the limit, the count it settled on, the most, whether twice that was measured and did not pay, the
    audio a second measured at each count), a request's time there, its circuit breaker, its failed requests."""

    url: str
    in_flight: int
    limit: int
    settled: int
    most: int
    above_measured: bool
    audio_s_per_s: dict
    latency_s: float
    breaker: BreakerStatus
    errors: dict[str, int]

    @property
    def running(self) -> int:
        return self.in_flight

    def to_json(self) -> dict:
        fields = asdict(self)
        return {"policy": {"name": POLICY, **fields}, "running": self.in_flight}

    @classmethod
    def from_json(cls, model: dict) -> UpstreamStatus | None:
        """A model's status as GET /api/v1/batch/status writes it (the admin's stats carry it as JSON), where its
        loop is an upstream's; None for another's (or a model not loaded)."""
        policy = model.get("policy")
        if not isinstance(policy, dict) or policy.get("name") != POLICY:
            return None
        fields = {name: value for name, value in policy.items() if name != "name"}
        return cls(**{**fields, "breaker": BreakerStatus(**policy["breaker"])})


class UpstreamStrategy:
    hands_out_pieces = True
    engine: Upstream

    def __init__(self, serving: Serving):
        self.serving = serving
        self.engine, self.queue, self.metrics = serving.engine, serving.queue, serving.metrics
        self.clock = serving.clock
        self.limit = InFlightLimit(self.engine.options.max_in_flight)
        self.breaker = CircuitBreaker(self.engine.options.max_cool_down_s)
        self._flights: dict[int, Flight] = {}  # by input id
        self._ended: deque[Flight] = deque()  # appended by the I/O thread, settled by the loop's
        self._area, self._area_at = 0.0, serving.clock.now()  # integral of requests in flight over time
        self._latency_s = 0.0  # moving average of a request's time at the upstream
        self._errors: dict[str, int] = {}  # failed requests by kind (rejected, failed, busy, deadline)
        self._received = 0  # audio samples received from the upstream so far (written by the I/O thread only)
        # the window the audio received is counted over: when it began, the samples and in-flight integral then,
        # the limit in force then; the first window after the limit changes is left out (its requests ramp up)
        self._window = (serving.clock.now(), 0, 0.0, self.limit.limit)
        self._window_counts = False
        self._io_loop: asyncio.AbstractEventLoop | None = None
        self._io_thread: threading.Thread | None = None
        self._client = None

    # --- what the loop asks ---------------------------------------------------------------------------------

    def idle(self) -> bool:
        return not len(self.queue) and not self._flights

    def running_count(self) -> int | None:
        return len(self._flights)

    def status(self) -> UpstreamStatus:
        breaker = BreakerStatus(**self.breaker.describe(self.clock.now()))
        return UpstreamStatus(self.engine.options.url, len(self._flights), **self.limit.describe(),
                              latency_s=round(self._latency_s, 3), breaker=breaker, errors=dict(self._errors))

    def cost_model(self) -> dict:
        return {"policy": POLICY, "unit": "request", "max_size": self.limit.most, "model": None}

    def warm_up(self) -> list[Callable[[], None]]:
        """The I/O thread, and one short request: the upstream is there, and the wait predictions' seed."""
        self._start_io()
        voice = self.engine.voices()[0].name
        item = EngineInput(self.engine.tokenize(WARM_UP_TEXT, voice)[0], voice)
        started = self.clock.timer()
        output = self._on_io(self.engine.whole(self._client, item)).result(self.engine.options.timeout_s * 2)
        seconds = self.clock.timer() - started
        self.serving.item_cost.add(1, item.length, seconds)
        self.serving.learn_audio_rate([item], [output])
        self._latency_s = seconds
        return []

    # --- one turn -------------------------------------------------------------------------------------------

    def step(self) -> None:
        self._settle_ended()
        self._stop_abandoned()
        now = self.clock.now()
        self._count_window(now)
        self.metrics.queue_length.labels(self.engine.name).set(len(self.queue))
        self._show(now)
        if self.breaker.state_now(now) is BreakerState.OPEN:
            self._refuse_queued(now)
        else:
            room = self.limit.limit - len(self._flights)
            for item in self.queue.next_candidates(max(0, room)):  # (at the limit too: it fails the expired)
                if not self.breaker.allows(now):  # half-open: the probe alone goes
                    break
                self._send(item, now, probe=self.breaker.state is BreakerState.HALF_OPEN)
        self._tell_queue(now)
        if self._ended:  # settled at the next turn, at once
            return
        if not self._flights and not len(self.queue):
            self.serving.wait_for_work()
        else:  # an ended request, an arrival or the breaker's cool-down wakes it; deadlines are checked each turn
            self.queue.wait_until(now + MOST_WAIT_S)

    def stopped(self) -> None:
        """The queue has closed: what is in flight is stopped, its callers told; the I/O thread ends."""
        for flight in list(self._flights.values()):
            if flight.task is not None:
                flight.task.cancel()
            self._settle(flight, Overloaded(f"model {self.engine.name} was stopped before this was synthesized; "
                                            "retry", 1, ErrorCode.MODEL_STOPPED))
        if self._io_loop is not None:
            if self._client is not None:
                self._on_io(self._client.aclose()).result(5)
            self._io_loop.call_soon_threadsafe(self._io_loop.stop)
            self._io_thread.join(5)

    # --- sending --------------------------------------------------------------------------------------------

    def _send(self, item: QueuedItem, now: float, probe: bool = False) -> None:
        self.queue.take([item], item.cost_s)
        if item.abandoned or item.future.cancelled():
            self.queue.done(1)
            self.metrics.dropped.labels("cancelled").inc()
            if probe:  # (never sent: the next request probes)
                self.breaker.probe_ended()
            return
        self._count_in_flight(now)
        flight = Flight(item, now, self._area, probe=probe)
        item.queue_s = now - item.enqueued_at
        self._flights[item.input.id] = flight
        self.serving.worked = True
        flight.task = self._on_io(self._fly(flight))

    async def _fly(self, flight: Flight) -> None:
        """On the I/O thread: the request, its pieces handed out as they arrive, bounded by the caller's deadline."""
        item = flight.item
        left_s = item.deadline - self.clock.now()
        try:
            async with asyncio.timeout(None if math.isinf(left_s) else max(0.0, left_s)):
                async for piece in self.engine.audio(self._client, item.input):
                    flight.pieces.append(piece)
                    self._received += piece.size
                    if item.pieces is not None:
                        item.pieces.push(piece)
        except TimeoutError:
            flight.error = DeadlineExceeded("the upstream had not finished by the request's deadline")
        except asyncio.CancelledError:
            flight.error = ClientGone("the caller has gone")
        except Exception as error:  # UpstreamFailed, UpstreamRejected, or a bug: settled on the loop's thread
            flight.error = error
        flight.ended_at = self.clock.now()
        self._ended.append(flight)
        self.queue.wake()

    # --- settling -------------------------------------------------------------------------------------------

    def _settle_ended(self) -> None:
        while self._ended:
            flight = self._ended.popleft()
            if flight.settled:
                continue
            try:
                outcome = self._outcome(flight)
            except Exception as error:  # a bug in reading its end must not leave its caller waiting for good
                log.exception("upstream %s: settling a request failed", self.engine.name)
                outcome = Overloaded(f"the upstream of model {self.engine.name} answered in a way that could not "
                                     f"be read: {type(error).__name__}", 1, ErrorCode.UPSTREAM_UNAVAILABLE)
            self._settle(flight, outcome)

    def _outcome(self, flight: Flight) -> EngineOutput | ChorusError:
        """What the request's end means for its caller, the breaker and the limit."""
        error, name, now = flight.error, self.engine.name, self.clock.now()
        if error is None:
            self.breaker.succeeded()
            return EngineOutput(np.concatenate(flight.pieces) if flight.pieces else np.zeros(0, np.float32))
        if isinstance(error, UpstreamRejected):
            self.breaker.succeeded()  # it answered: the request was at fault
            self._count_error("rejected")
            return InvalidRequest(str(error), code=ErrorCode.UPSTREAM_REJECTED)
        if isinstance(error, ChorusError):  # the deadline passed, or the caller went
            if isinstance(error, DeadlineExceeded) and not flight.pieces:  # nothing came: a hung upstream
                self.breaker.failed(now)
                self._count_error("deadline")
            return error
        busy = isinstance(error, UpstreamFailed) and error.busy
        if busy:
            self.limit.busy()
            self._count_error("busy")
        else:
            log.warning("upstream %s (%s): %s", name, self.engine.options.url, error)
            self.breaker.failed(now, getattr(error, "retry_after_s", None))
            self._count_error("failed")
        return self._unavailable(str(error), now, getattr(error, "retry_after_s", None), failed=not busy)

    def _count_error(self, kind: str) -> None:
        self._errors[kind] = self._errors.get(kind, 0) + 1
        self.metrics.upstream_errors.labels(self.engine.name, kind).inc()

    def _unavailable(self, why: str, now: float, retry_after_s: float | None = None, failed: bool = True
                     ) -> Overloaded:
        """A 503 whose Retry-After is the breaker's cool-down or the upstream's own, bounded (an upstream's "inf" or
        "1e9" is not what a caller is told); a PartFailed where the upstream failed (not where it said it is busy)."""
        most = self.breaker.most_cool_down_s
        wait = min(most, max(self.breaker.retry_after_s(now), bounded_retry_after(retry_after_s, most), 1.0))
        kind = PartFailed if failed else Overloaded
        return kind(f"the upstream of model {self.engine.name} is unavailable: {why}", math.ceil(wait),
                    ErrorCode.UPSTREAM_UNAVAILABLE)

    def _settle(self, flight: Flight, outcome: EngineOutput | ChorusError) -> None:
        """The loop's thread ends a request: its books, what it teaches, its caller's answer."""
        flight.settled = True
        if flight.probe:  # (its outcome has told the breaker already, where it said anything)
            self.breaker.probe_ended()
        item, now = flight.item, self.clock.now()
        self._count_in_flight(now)
        self._flights.pop(item.input.id, None)
        ended_at = flight.ended_at or now
        seconds = max(1e-6, ended_at - flight.sent_at)
        in_flight = max(1.0, (self._area - flight.in_flight_area) / max(1e-6, now - flight.sent_at))
        item.batch_s, item.batch_size = seconds, round(in_flight)
        self.metrics.upstream_seconds.labels(self.engine.name).observe(seconds)
        if isinstance(outcome, EngineOutput):
            self.serving.item_cost.add(1, item.length, seconds / in_flight)
            self.serving.learn_audio_rate([item.input], [outcome])
            self._latency_s = seconds if not self._latency_s else 0.8 * self._latency_s + 0.2 * seconds
        elif not isinstance(outcome, ClientGone):
            self.metrics.item_errors.labels(self.engine.name).inc()
        if item.pieces is not None:
            item.pieces.end(None if isinstance(outcome, EngineOutput) else outcome)
        self.queue.done(1)
        item.resolve(outcome)

    def _stop_abandoned(self) -> None:
        for flight in [flight for flight in self._flights.values()
                       if flight.item.abandoned or flight.item.future.cancelled()]:
            if flight.task is not None:
                flight.task.cancel()  # closes the response: the upstream stops (vLLM aborts the request)
            self.metrics.dropped.labels("cancelled").inc()
            self._settle(flight, ClientGone("the caller has gone"))

    def _refuse_queued(self, now: float) -> None:
        """The breaker is open: whatever waits fails now, saying when to retry, rather than wait for it."""
        while candidates := self.queue.next_candidates(len(self.queue)):
            self.queue.take(candidates, 0.0)
            for item in candidates:
                refusal = self._unavailable("its circuit breaker is open", now)
                if item.pieces is not None:
                    item.pieces.end(refusal)
                item.resolve(refusal)
            self.queue.done(len(candidates))

    # --- books ----------------------------------------------------------------------------------------------

    def _count_window(self, now: float) -> None:
        """Every WINDOW_S: the audio that arrived, for the limit to learn from (a window in which the limit held
        back work: as many in flight as it allows, on average within BINDING; begun and ended under the same limit,
        not the first after a change). A window with fewer in flight says what the load asked, not what the
        limit allows."""
        began, received, area, under = self._window
        if now - began < WINDOW_S:
            return
        self._count_in_flight(now)
        binding = (self._area - area) / (now - began) >= BINDING * under
        if self._window_counts and binding and under == self.limit.limit:
            self.limit.observe(under, (self._received - received) / self.engine.sample_rate, now - began)
        self._window_counts = under == self.limit.limit
        self._window = (now, self._received, self._area, self.limit.limit)

    def _count_in_flight(self, now: float) -> None:
        self._area += len(self._flights) * (now - self._area_at)
        self._area_at = now

    def _tell_queue(self, now: float) -> None:
        """When a place frees up, for the queue's wait predictions."""
        room = self.limit.limit - len(self._flights)
        if room > 0:
            self.queue.expect_free_in(0.0, room)
        elif self._flights:
            oldest = min(flight.sent_at for flight in self._flights.values())
            self.queue.expect_free_in(max(0.0, self._latency_s - (now - oldest)))

    def _show(self, now: float) -> None:
        name = self.engine.name
        self.metrics.upstream_in_flight.labels(name).set(len(self._flights))
        self.metrics.running_requests.labels(name).set(len(self._flights))
        self.metrics.upstream_limit.labels(name).set(self.limit.limit)
        self.metrics.upstream_breaker_open.labels(name).set(BREAKER_GAUGE[self.breaker.state_now(now)])

    # --- the I/O thread -------------------------------------------------------------------------------------

    def _start_io(self) -> None:
        if self._io_loop is not None:
            return
        self._io_loop = asyncio.new_event_loop()
        self._io_thread = threading.Thread(target=self._io_loop.run_forever, name=f"upstream-{self.engine.name}",
                                           daemon=True)
        self._io_thread.start()
        self._client = self._on_io(self._make_client()).result(10)

    async def _make_client(self):
        return self.engine.client()

    def _on_io(self, coroutine) -> Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self._io_loop)
