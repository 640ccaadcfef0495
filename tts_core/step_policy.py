"""Who joins the running set of a stepped (autoregressive) engine, and when.

Pure, like tts_core.policy: a policy sees the requests running now and the queued candidates (most
urgent first) and answers with a BatchPlan of the candidates to admit at the next step. The
batcher feeds back every step's timing, every prefill's and every decode's.

`ContinuousPolicy` (TTS_BATCH_POLICY=adaptive, Chorus's): a candidate joins at the next step when a
place is free, its cache fits the memory budget, and the cost model says the server is better off
with it running: one more running request must raise the frames made per second (a short request
always does; a long one joining short ones may not, since every step then attends over its context).
A request that finishes leaves at once; nobody waits for the longest member of a batch. (Asking for a
rise of 2% or more stopped at 11 of 16 on 2 CPU cores, where the codec's cost per frame does not fall
with more running: in a closed loop of 16 clients, 10.2-10.5 audio-s/s against 11.2-11.5 with every
rise taken, side by side; a request kept waiting gains nothing from the others' slightly faster steps,
and a short one waits behind long ones instead of sharing the steps. Holding
streams back to keep the running ones in real time was tried: on 2 CPU cores only 5 streams fit,
and 8 streams' first audio waited 6-10 s for a place, against a p95 of 1.9 s without the hold; a listener
buffers a stream that is made below real time, it cannot buffer one that has not started.)

`RequestLevelPolicy` is how the peers Chorus is measured against batch an autoregressive model:
a batch is admitted only when nothing runs (after waiting up to `max_wait_s` for `max_batch`
requests, like TimeoutPolicy), and every member's audio is held until the whole batch is done,
as one `generate(batch)` call returns it. (Members that finish early leave the step, which
`generate` does not do: the peer is, if anything, faster than the real thing.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .policy import BatchPlan, CostModel


@dataclass(frozen=True)
class StepView:
    """What a policy sees of a running request or a queued candidate."""

    context: int  # context positions it holds now (a candidate: its prompt)
    final_context: int  # positions it will hold when done: what the memory budget counts
    deadline: float = float("inf")
    enqueued_at: float = 0.0


class StepCostModel:
    """Seconds per step, t = a + b*running + c*padded context (running x the longest context),
    fitted as CostModel fits batches; and the codec's seconds per decoded frame and the prefill's
    seconds per prompt position, as moving averages."""

    def __init__(self) -> None:
        self.steps = CostModel()
        self.decode_s_per_frame = 0.0
        self.prefill_s_per_token = 0.0

    @property
    def fitted(self) -> bool:
        return self.steps.fitted

    def step_s(self, running: int, longest: int) -> float:
        return max(self.steps.predict(running, running * longest), 1e-6)

    def frame_s(self, running: int, longest: int) -> float:
        """Each running request's time per frame: the whole step, plus the decoding of every request's frame."""
        return self.step_s(running, longest) + running * self.decode_s_per_frame

    def observe_step(self, running: int, longest: int, seconds: float, calibration: bool = False) -> None:
        self.steps.add(running, running * longest, seconds, calibration)

    def observe_decode(self, frames: int, seconds: float) -> None:
        self.decode_s_per_frame = _moving(self.decode_s_per_frame, seconds / max(1, frames))

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        self.prefill_s_per_token = _moving(self.prefill_s_per_token, seconds / max(1, tokens))


def _moving(average: float, sample: float) -> float:
    return sample if not average else 0.8 * average + 0.2 * sample


class StepPolicy:
    name = "step"
    learns = False
    holds_results = False  # True: members' audio is handed out when their whole batch is done

    def __init__(self, max_running: int):
        self.max_running = max_running
        self.cost = StepCostModel()

    @property
    def max_batch_size(self) -> int:  # what the batcher's candidate limits read
        return self.max_running

    @property
    def cost_model(self) -> CostModel:  # the step-time model, as the dashboard charts a batch policy's
        return self.cost.steps

    def plan(self, running: Sequence[StepView], queued: Sequence[StepView], now: float,
             memory_tokens: int | None = None) -> BatchPlan:
        raise NotImplementedError

    def describe(self) -> dict:
        fixed, per_running, per_token = self.cost.steps.coefficients
        return {"name": self.name, "max_running": self.max_running, "step_cost_model": {
            "fixed_s": round(fixed, 6), "per_running_s": round(per_running, 6),
            "per_context_token_s": round(per_token, 9),
            "decode_s_per_frame": round(self.cost.decode_s_per_frame, 6),
            "prefill_s_per_token": round(self.cost.prefill_s_per_token, 7)}}


class ContinuousPolicy(StepPolicy):
    name = "adaptive"
    learns = True

    def plan(self, running: Sequence[StepView], queued: Sequence[StepView], now: float,
             memory_tokens: int | None = None) -> BatchPlan:
        members = list(running)
        held = sum(view.final_context for view in members)
        take: list[int] = []
        for index, candidate in enumerate(queued):
            if len(members) >= self.max_running:
                break
            fits = memory_tokens is None or held + candidate.final_context <= memory_tokens
            if not fits and members:  # alone it is tried anyway: an out-of-memory error sends it back
                break
            if members and self.cost.fitted and not self._pays(members, candidate):
                break
            members.append(candidate)
            held += candidate.final_context
            take.append(index)
        return BatchPlan(take=tuple(take))

    def _pays(self, members: list[StepView], candidate: StepView) -> bool:
        """Whether one more running request is worth it, by the cost model."""
        count = len(members)
        longest = max(view.context for view in members)
        with_it = max(longest, candidate.context)
        before = count / self.cost.frame_s(count, longest)
        after = (count + 1) / self.cost.frame_s(count + 1, with_it)
        return after > before


class RequestLevelPolicy(StepPolicy):
    learns = False
    holds_results = True

    def __init__(self, name: str, max_batch: int, max_wait_s: float):
        super().__init__(max_batch)
        self.name = name
        self.max_wait_s = max_wait_s

    def plan(self, running: Sequence[StepView], queued: Sequence[StepView], now: float,
             memory_tokens: int | None = None) -> BatchPlan:
        if running:  # a batch runs until its last member is done
            return BatchPlan(take=())
        waited = now - min(view.enqueued_at for view in queued)
        if len(queued) < self.max_running and waited < self.max_wait_s:
            return BatchPlan(take=(), wait_s=self.max_wait_s - waited)
        return BatchPlan(take=tuple(range(min(self.max_running, len(queued)))))


# TTS_BATCH_POLICY for stepped engines: max_running -> policy; the same names as tts_core.policy's
STEP_POLICIES: dict[str, Callable[[int], StepPolicy]] = {
    "adaptive": ContinuousPolicy,
    "sequential": lambda running: RequestLevelPolicy("sequential", 1, 0.0),
    "static": lambda running: RequestLevelPolicy("static", min(8, running), 0.5),
    "window": lambda running: RequestLevelPolicy("window", min(16, running), 0.010),
}


def make_step_policy(name: str, max_running: int) -> StepPolicy:
    if name not in STEP_POLICIES:
        raise ValueError(f"unknown batch policy {name!r}; one of {', '.join(STEP_POLICIES)}")
    return STEP_POLICIES[name](max_running)
