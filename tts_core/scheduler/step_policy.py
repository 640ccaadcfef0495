"""Who joins the running set of a stepped (autoregressive) engine, and when.

Pure, like tts_core.scheduler.policy: a policy sees the requests running now and the queued candidates (most
urgent first) and answers with a BatchPlan of the candidates to admit at the next step. The
stepped strategy feeds back every step's timing, every prefill's and every decode's.

`ContinuousPolicy` (TTS_BATCH_POLICY=adaptive, Chorus's): a candidate joins at the next step when a
place is free, its cache fits the memory budget, and the cost model says the server is better off
with it running: one more running request must raise the frames made per second (a short request
always does; a long one joining short ones may not, since every step then attends over its context).
A request that finishes leaves at once; nobody waits for the longest member of a batch. (Asking for a
rise of 2% or more stopped admitting with places still free on a CPU, where the codec's cost per frame
does not fall with more running, and served less than taking every rise (docs/batching.md); a request
kept waiting gains nothing from the others' slightly faster steps, and a short one waits behind long ones
instead of sharing the steps. Holding streams back to keep the running ones in real time was tried: on
a small CPU few streams fit, and the others' first audio waited for a place far longer than it does
without the hold (docs/benchmarks-history.md); a listener buffers a stream that is made below real time,
it cannot buffer one that has not started.)

`FillPolicy` admits whoever has a place: how the engine's own whole-batch `synthesize` runs a batch
(tts_core.scheduler.stepped.synthesize_whole), as one `generate(batch)` call would.

The peers Chorus is measured against (TTS_BATCH_POLICY=sequential, static, window) batch an
autoregressive model by request: they are tts_core.scheduler.policy's one-shot policies, run by the one-shot
strategy over that `synthesize`, so a batch starts only when the one before is done and every member's
audio is handed out with the batch's. (Members that finish early leave the step, which `generate` does
not do: the peer is, if anything, faster than the real thing.)
"""

from __future__ import annotations

from collections.abc import Sequence
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
    seconds per prompt position, as moving averages (the steps and the codec timed as they run, so where
    they run beside each other each time counts what the other takes of the cores)."""

    def __init__(self) -> None:
        self.steps = CostModel()
        self.decode_s_per_frame = 0.0
        self.prefill_s_per_token = 0.0
        self.pipelined = False  # the codec decodes on a stage of its own, beside the steps

    @property
    def fitted(self) -> bool:
        return self.steps.fitted

    def step_s(self, running: int, longest: int) -> float:
        return max(self.steps.predict(running, running * longest), 1e-6)

    def frame_s(self, running: int, longest: int) -> float:
        """Each running request's time per frame: the whole step and the decoding of every request's frame, one
        after the other on one thread, or the slower of the two where the codec is a stage of its own."""
        step_s, decode_s = self.step_s(running, longest), running * self.decode_s_per_frame
        return max(step_s, decode_s) if self.pipelined else step_s + decode_s

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

    def __init__(self, max_running: int):
        self.max_running = max_running
        self.cost = StepCostModel()

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
        # Not lower: where the codec is a stage of its own and the slower one, frames per second stay as they are
        # with one more running, and a request that joins shares them rather than waiting for a place.
        return after > before if not self.cost.pipelined else after >= before * (1 - 1e-9)


class FillPolicy(ContinuousPolicy):
    """Every free place filled at once, memory permitting: a whole batch run as one call runs it."""

    name = "fill"
    learns = False

    def _pays(self, members: list[StepView], candidate: StepView) -> bool:
        return True
