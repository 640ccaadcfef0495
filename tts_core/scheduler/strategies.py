"""The loop each loaded engine gets: the strategy that drives it, by the shape the engine declares
(Capabilities.shape) and the batch policy.

A one-shot engine (Piper, VITS) runs batches planned by tts_core.scheduler.policy. A stepped engine runs
continuously (TTS_BATCH_POLICY=adaptive, tts_core.scheduler.stepped); under the peers' policies (sequential,
static, window) it runs by request, as the peers Chorus is measured against run it: the one-shot
strategy, each batch through the engine's own whole-batch `synthesize`. An upstream engine (a model another
server runs) keeps a learned number of requests in flight there (tts_core.scheduler.upstream), whatever the policy.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..engines.contract import EngineInput, EngineOutput, OneShot, Shape
from ..ops.metrics import Metrics
from .calibration import CalibrationStore
from .engine_loop import EngineLoop, Serving
from .one_shot import OneShotStrategy
from .policy import make_policy
from .queue import RequestQueue
from .step_policy import ContinuousPolicy
from .stepped import SteppedStrategy, synthesize_whole
from .upstream import UpstreamStrategy

# A stepped engine's warm-up lengths (prompt tokens): every token of a prompt costs frames to speak
STEPPED_CALIBRATION_LENGTHS = (4, 12)


def make_engine_loop(engine: OneShot, queue: RequestQueue, metrics: Metrics, policy: str = "adaptive",
                     max_batch_size: int = 16, max_batch_tokens: int = 8192,
                     calibration_sizes: Sequence[int] = (1, 2, 4, 8, 16), min_free_memory_mb: int = 2048,
                     empty_cache_every: int = 100, cpu_cache_mb: int = 1024, instances: int = 1,
                     codec_stage: str = "auto", precision_off: dict[str, str] | None = None,
                     calibrations: CalibrationStore | None = None) -> EngineLoop:
    """The engine's loop, not started. max_batch_size is a one-shot engine's; a stepped engine's is the
    most it runs at once (its max_running). instances: copies of a one-shot engine's model (0: measured).
    codec_stage (TTS_CODEC_STAGE): whether a stepped engine that decodes apart does so on a thread of its own:
    "on", "off", or "auto": where it runs on CUDA. On a CPU the codec's torch work beside the steps' made a second
    OpenMP team in the process, and a lone request 20% slower (docs/batching.md#the-codec-as-a-stage).
    precision_off: the models whose lower precision is off, shared by the service's loops (scheduler/precision.py).
    calibrations: where calibration sweeps are kept across restarts (tts_core.scheduler.calibration)."""
    serving = Serving(engine, queue, metrics, min_free_memory_mb, precision_off)
    shape = engine.capabilities.shape
    if shape is Shape.UPSTREAM:  # another server batches: only how many are in flight is ours
        strategy = UpstreamStrategy(serving)
    elif shape is Shape.ONE_SHOT:
        strategy = OneShotStrategy(serving, make_policy(policy, max_batch_size, max_batch_tokens), calibration_sizes,
                                   empty_cache_every, instances=instances)
    elif policy == "adaptive":
        codec_thread = codec_stage == "on" or (codec_stage == "auto" and engine.device == "cuda")
        strategy = SteppedStrategy(serving, ContinuousPolicy(engine.max_running), calibration_sizes, cpu_cache_mb,
                                   codec_thread)
    else:  # a whole batch at a time, which ends between two steps once the loop stops
        strategy = OneShotStrategy(serving, make_policy(policy, engine.max_running, max_batch_tokens),
                                   calibration_sizes, empty_cache_every, STEPPED_CALIBRATION_LENGTHS,
                                   synthesize=lambda batch: synthesize_whole(engine, batch, lambda: queue.closed))
    return EngineLoop(serving, strategy, calibrations)


def synthesize_batch(engine: OneShot, batch: Sequence[EngineInput]) -> list[EngineOutput]:
    """A whole batch's outputs, whatever the engine's shape (the benchmarks' engines alone): a stepped engine's run
    by the stepped strategy's code (it has no whole-batch call of its own), any other's by its own `synthesize`."""
    if engine.capabilities.shape is Shape.STEPPED:
        return synthesize_whole(engine, batch)
    return engine.synthesize(batch)
