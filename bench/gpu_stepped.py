"""The GPU check's autoregressive part: a random-weight Pocket TTS at its released size and a random-weight
VibeVoice at the released 1.5 B layout. For each:

1. Steps: the engine alone, 1, 4 and 16 requests running: a step's wall milliseconds and, on CUDA, the device's
   busy time in it (the profiler's kernel time; CUDA events around the step give its span on the device, which
   counts the gaps between kernels too). On a CPU the busy share is not measured, and said so.
2. Lower precision: where the engine offers one (`set_low_precision`), the ceiling again at it; a failure is
   recorded as one, and the check goes on.
3. The ceiling: synthesize_whole of the first `clients` texts at once.
4. Served: the real engine loop (queue, policy, engine thread; in process, no HTTP) once per policy: adaptive
   (continuous batching), where the engine decodes apart adaptive again with its codec on the engine's thread
   rather than a stage of its own (`codec_stage_vs_inline`, the two back to back on the same footing), static
   (request-level batches of 8, 500 ms, audio held until the batch is done) and sequential; a closed loop of
   callers for a fixed time, what is unanswered at its end cancelled. Every run loads its own engine from the
   same saved model, and the run before has stopped and its threads ended first (bench/gpu_runs.py): no two
   loops ever drive one engine. A run its part's time would not hold is skipped, and the JSON says so.

Throughput is the audio the engine made per second of the run: the frames of every step begun in it (after
the calibration sweep), at the model's frame rate. Counting only the requests done would favour short ones
and miss the work in flight at the end. The requests done, their latency and the audio they delivered are
given too, and a run that finished fewer than half its callers' requests is marked failed, with why.
Weights are random: `fixed_length` makes every request its whole frame budget.

`--device cpu --quick` runs the same with the tiny models, short texts and short runs (a smoke test); `--smoke` the
least of it that still runs every part (two callers of one-token texts).
"""

from __future__ import annotations

import gc
import math
import statistics
import tempfile
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from bench.gpu_runs import (
    Budget,
    closed_loop,
    fate,
    latency_ms,
    loop_threads,
    print_figures,
    ratio,
    runs_in_budget,
    stop_and_wait,
    verdicts,
)
from bench.workload import texts
from tts_core.engines.base import SteppedEngine
from tts_core.engines.contract import EngineInput
from tts_core.ops.metrics import Metrics
from tts_core.scheduler.queue import RequestQueue
from tts_core.scheduler.records import QueuedItem
from tts_core.scheduler.stepped import synthesize_whole
from tts_core.scheduler.strategies import make_engine_loop

# max_tokens: texts cut to this many tokens (the quick plan's requests, 2 s of audio, end well within its short runs
# on a busy CPU)
FULL = {"clients": 16, "served_s": 10.0, "texts": 64, "workload": "mixed", "calibration_sizes": [1, 2, 4, 8, 16],
        "max_tokens": None, "timed_steps": 10}
QUICK = {"clients": 4, "served_s": 5.0, "texts": 16, "workload": "short", "calibration_sizes": [1, 2],
         "max_tokens": 3, "timed_steps": 5}
# smoke: quick's 5 s a run (static's first batch, its 500 ms wait then VibeVoice's 18 steps, must end in it on a busy
# CPU), with fewer callers and frames
SMOKE = {**QUICK, "clients": 2, "served_s": 5.0, "texts": 2, "max_tokens": 1, "timed_steps": 1}
PLANS = {"full": FULL, "quick": QUICK, "smoke": SMOKE}  # quick and smoke: the tiny models
MODELS = {"pocket_tts": "Pocket TTS, released size", "vibevoice": "VibeVoice, the released 1.5 B layout"}
# A served run's time beyond its callers' (loading the engine, its warm-up and calibration, the stop), as first
# guessed on an H200 (not yet measured there); after a part's first run, what it took.
RUN_OVERHEAD_S = {"pocket_tts": 10.0, "vibevoice": 20.0}
STEP_SIZES = (1, 4, 16)  # requests running while steps are timed
WARM_STEPS = 3
CALIBRATION_WAIT_S = 300.0
# Issue #43's targets for a GPU (the first H200 run: Pocket TTS served 21.3 audio-s/s, wanted 5x that; VibeVoice
# adaptive 18.7, wanted 3x), and the stepped voices' targets of bench's harness (continuous batching against
# request-level batches).
HARNESS_TARGETS = {"adaptive_vs_sequential": (">=", 2.0), "adaptive_vs_static": (">=", 1.6),
                   "adaptive_vs_ceiling": (">=", 1.2)}
TARGETS = {"pocket_tts": {"step_wall_vs_busy_at_16": ("<=", 3.0), "adaptive_audio_s_per_s": (">=", 106.5),
                          "codec_stage_vs_inline": (">=", 1.0), **HARNESS_TARGETS},
           "vibevoice": {"adaptive_audio_s_per_s": (">=", 56.1), **HARNESS_TARGETS}}


def voice_clip(sample_rate: int, seconds: float = 3.0) -> np.ndarray:
    """The shipped voice's clip: noise, as random weights make nothing of speech anyway (no Piper needed)."""
    return (0.1 * np.random.default_rng(0).standard_normal(int(seconds * sample_rate))).astype(np.float32)


def save(kind: str, folder: Path, device: str, tiny: bool) -> None:
    """A random model saved as a registry folder (the 1.5 B VibeVoice's weights are made on the GPU: seconds, not
    minutes, and saved at bf16)."""
    if kind == "pocket_tts":
        from bench.random_model import save_random_pocket

        save_random_pocket(folder, tiny=tiny, clip=voice_clip(24000))
        return
    from bench.random_vibevoice import save_random_vibevoice

    save_random_vibevoice(folder, "tiny" if tiny else "1.5b", device=device, dtype=torch.bfloat16
                          if device == "cuda" else torch.float32, clip=voice_clip(24000))
    free_device(device)


def load(kind: str, folder: Path, device: str) -> SteppedEngine:
    """The saved model, loaded as the server loads it (bf16 on CUDA)."""
    dtype = "bf16" if device == "cuda" else "fp32"
    if kind == "pocket_tts":
        from tts_core.engines.pocket_tts import PocketTTSEngine

        return PocketTTSEngine(str(folder), [], device, dtype, fixed_length=True, seed=0)
    from tts_core.engines.vibevoice import VibeVoiceEngine

    return VibeVoiceEngine(str(folder), [], device, dtype, fixed_length=True, seed=0)


def free_device(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _items(engine: SteppedEngine, token_lists: list[np.ndarray]) -> list[QueuedItem]:
    voice = engine.voices()[0].name
    return [QueuedItem(EngineInput(tokens, voice), key=engine.batch_key(voice, 1.0), deadline=math.inf)
            for tokens in token_lists]


# --- the engine alone -------------------------------------------------------------------------------------


def step_times(engine: SteppedEngine, tokens: np.ndarray, timed_steps: int) -> list[dict]:
    """At each of STEP_SIZES running (copies of one text, long enough not to end while timed): a step's wall
    milliseconds (the median), and on CUDA the device's part of it."""
    voice = engine.voices()[0].name
    rows = []
    for size in STEP_SIZES:
        if size > engine.max_running:
            rows.append({"running": size, "skipped": f"the engine runs at most {engine.max_running}"})
            continue
        inputs = [EngineInput(tokens, voice) for _ in range(size)]
        rounds = 3 if engine.device == "cuda" else 1  # (wall, CUDA events, the profiler)
        steps = min(timed_steps, (engine.frames_needed(inputs[0]) - 1 - WARM_STEPS) // rounds)
        engine.admit(inputs)
        try:
            for _ in range(WARM_STEPS):
                engine.step()
            rows.append({"running": len(engine.running()), "steps": steps, **_timed(engine, steps)})
        finally:
            for item_id in engine.running():
                engine.release(item_id)
    return rows


def _timed(engine: SteppedEngine, steps: int) -> dict:
    """`steps` steps of the running set: the wall milliseconds of one (the median), and the device's part."""
    walls = []
    for _ in range(steps):
        synchronize(engine.device)
        started = time.perf_counter()
        engine.step()
        synchronize(engine.device)
        walls.append(time.perf_counter() - started)
    wall_ms = 1000 * statistics.median(walls)
    if engine.device != "cuda":
        return {"wall_ms": round(wall_ms, 2), "busy_ms": None, "busy_share": None,
                "busy": "not measured (no CUDA device)"}
    row = {"wall_ms": round(wall_ms, 2), "device_span_ms": round(_device_span_ms(engine, steps), 3)}
    try:
        busy_ms = _device_busy_ms(engine, steps)
    except Exception as error:  # (a profiler without CUPTI, say): the wall time and span still count
        return {**row, "busy_ms": None, "busy_share": None, "busy": f"not measured: {type(error).__name__}: {error}"}
    return {**row, "busy_ms": round(busy_ms, 3), "busy_share": round(busy_ms / wall_ms, 4),
            "wall_vs_busy": round(wall_ms / busy_ms, 2) if busy_ms else None}


def _device_span_ms(engine: SteppedEngine, steps: int) -> float:
    """A step's span on the device, the median: CUDA events before and after it, so its kernels and the gaps
    between them (the host's time launching them) alike."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    spans = []
    for _ in range(steps):
        start.record()
        engine.step()
        end.record()
        end.synchronize()
        spans.append(start.elapsed_time(end))
    return statistics.median(spans)


def _device_busy_ms(engine: SteppedEngine, steps: int) -> float:
    """The device's busy time in a step, the mean: the profiler's kernel and copy time (as its table's
    "Self CUDA time total")."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    device_us = sum(event.self_device_time_total for event in profile.key_averages()
                    if event.device_type == torch.autograd.DeviceType.CUDA
                    and not getattr(event, "is_user_annotation", False))
    return device_us / 1000 / steps


def ceiling(engine: SteppedEngine, token_lists: list) -> dict:
    """These texts run whole at once (synthesize_whole): every request runs from the first step to its last."""
    inputs = [item.input for item in _items(engine, token_lists)]
    synthesize_whole(engine, inputs[:1])  # warm
    started = time.perf_counter()
    outputs = synthesize_whole(engine, inputs)
    seconds = time.perf_counter() - started
    frames = [output.audio.size / engine.sample_rate * engine.frame_rate for output in outputs]
    return {"requests": len(inputs), "seconds": round(seconds, 2),
            "audio_s_per_s": round(sum(output.audio.size for output in outputs) / engine.sample_rate / seconds, 2),
            "frames_per_step": round(sum(frames) / max(frames), 2)}


def low_precision(engine: SteppedEngine, token_lists: list, full: dict) -> dict:
    """The ceiling again at the engine's lower precision, where it offers one."""
    try:
        if not engine.set_low_precision(True):
            return {"offered": False, "why": "the engine offers no lower precision"}
        low = ceiling(engine, token_lists)
    except Exception as error:  # a lower precision that fails is a finding, not the end of the check
        traceback.print_exc()
        return {"offered": True, "failed": True, "why": f"{type(error).__name__}: {error}"}
    finally:
        engine.set_low_precision(False)
    return {"offered": True, "every_batch_ran": True, "ceiling": low,
            "low_vs_full": ratio(low["audio_s_per_s"], full["audio_s_per_s"])}


# --- served ----------------------------------------------------------------------------------------------


def served(kind: str, folder: Path, device: str, policy_name: str, codec_stage: str, token_lists: list,
           plan: dict) -> dict:
    """One run on an engine of its own: `clients` callers for served_s, then the loop stopped and its threads
    ended. codec_stage "off": the codec decodes on the engine's thread."""
    started = time.perf_counter()
    engine = load(kind, folder, device)
    before = set(threading.enumerate())
    loop = make_engine_loop(engine, RequestQueue(max_size=4 * plan["clients"] + 64), Metrics(), policy_name,
                            calibration_sizes=plan["calibration_sizes"], codec_stage=codec_stage)
    loop.start()
    calibrated = loop.calibrated.wait(CALIBRATION_WAIT_S)
    threads = loop_threads(before)
    steps = _count_steps(engine)
    warm_s = time.perf_counter() - started
    voice = engine.voices()[0].name
    key = engine.batch_key(voice, 1.0)
    tally = closed_loop(loop, lambda position: QueuedItem(EngineInput(token_lists[position % len(token_lists)], voice),
                                                          key=key, deadline=math.inf),
                        plan["clients"], plan["served_s"], 0.0, engine.sample_rate)
    stop_at = tally.started + plan["served_s"]
    sizes = [running for moment, running in steps if moment < stop_at]  # the steps begun in the run
    name = policy_name if codec_stage == "on" or not engine.decodes_apart else f"{policy_name}, codec inline"
    status = loop.status().strategy  # (codec_thread: the engine's pieces were decoded on a thread of their own)
    row = {"policy": name, "clients": plan["clients"], "seconds": plan["served_s"],
           "audio_s_per_s": round(sum(sizes) / engine.frame_rate / plan["served_s"], 2), "steps": len(sizes),
           "frames_per_step": round(sum(sizes) / len(sizes), 2) if sizes else 0.0, "sent": tally.sent,
           "requests_done": len(tally.latencies), "errors": tally.errors,
           "delivered_audio_s_per_s": round(tally.audio_s / plan["served_s"], 2), **latency_ms(tally),
           "policy_state": status.policy, "codec_thread": getattr(status, "codec_thread", False),
           "out_of_memory": loop.memory.out_of_memory_count, "warm_s": round(warm_s, 1),
           **({} if calibrated else {"calibrated": False}),
           **stop_and_wait(loop, threads), **fate(tally)}
    del engine, loop
    free_device(device)
    row["run_s"] = round(time.perf_counter() - started, 1)
    return row


def _count_steps(engine: SteppedEngine) -> list[tuple[float, int]]:
    """When each step the engine makes from now on begins, and how many requests run in it (one frame each),
    whoever drives it (the stepped strategy, or the request-level peers' whole batches)."""
    steps: list[tuple[float, int]] = []
    step = engine.step

    def counted():
        steps.append((time.perf_counter(), len(engine.running())))
        return step()
    engine.step = counted
    return steps


def served_runs(kind: str, folder: Path, device: str, plan: dict, token_lists: list, budget: Budget,
                decodes_apart: bool) -> tuple[list[dict], list[dict]]:
    """The runs while the part's time holds, the codec's pair (where the engine decodes apart) first and back
    to back: (rows, those skipped)."""
    runs = [("adaptive", "on"), *[("adaptive", "off")] * decodes_apart, ("static", "on"),
            ("sequential", "on")]
    return runs_in_budget(
        budget, kind, plan["served_s"], RUN_OVERHEAD_S[kind] if device == "cuda" else 0.0, runs,
        lambda run: served(kind, folder, device, *run, token_lists, plan),
        lambda run: run[0] if run[1] == "on" else f"{run[0]}, codec inline",
        lambda row: f"{row['policy']:22s} {row['audio_s_per_s']:8.2f} audio-s/s  {row['frames_per_step']:6.2f} "
                    f"frames/step  {row['requests_done']:4d} of {row['sent']} done  p50 {row['p50_ms']} ms")


# --- a model's part ---------------------------------------------------------------------------------------


def _token_lists(engine: SteppedEngine, plan: dict) -> list[np.ndarray]:
    """The workload's texts as the engine tokenizes them (whole: the quick plan's cut comes later)."""
    voice = engine.voices()[0].name
    return [np.concatenate(engine.tokenize(text, voice)) for text in texts(plan["workload"], plan["texts"], seed=7)]


def _parameters_m(engine: SteppedEngine) -> float:
    """Millions of weights: parameters, and the weights and biases a CPU engine prepacked (held as buffers)."""
    modules = [engine.model] + ([engine.codec] if hasattr(engine, "codec") else [])
    weights = [tensor for module in modules for tensor in module.parameters()]
    weights += [tensor for module in modules for name, tensor in module.named_buffers()
                if name.rsplit(".", 1)[-1] in ("weight", "bias")]
    return round(sum(tensor.numel() for tensor in weights) / 1e6, 1)


def engine_alone(engine: SteppedEngine, token_lists: list, longest: np.ndarray, plan: dict) -> dict:
    """Steps (copies of the longest text), the ceiling and the lower precision, on an engine no loop drives."""
    result = {"step_times": step_times(engine, longest, plan["timed_steps"]),
              "ceiling": ceiling(engine, token_lists[: plan["clients"]])}
    result["low_precision"] = low_precision(engine, token_lists[: plan["clients"]], result["ceiling"])
    for row in result["step_times"]:
        if "skipped" not in row:
            print(f"  step at {row['running']:2d} running: {row['wall_ms']:8.2f} ms wall, device busy "
                  + (f"{row['busy_ms']} ms ({row['busy_share']:.1%})" if row["busy_ms"] is not None
                     else "not measured"), flush=True)
    print(f"  {'ceiling':22s} {result['ceiling']['audio_s_per_s']:8.2f} audio-s/s  "
          f"{result['ceiling']['frames_per_step']:6.2f} frames/step; lower precision: "
          f"{result['low_precision'].get('why') or result['low_precision']['low_vs_full']}", flush=True)
    return result


def check_model(kind: str, device: str, plan_name: str, budget: Budget) -> dict:
    plan, tiny = PLANS[plan_name], plan_name != "full"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / kind
        save(kind, path, device, tiny)
        engine = load(kind, path, device)
        whole = _token_lists(engine, plan)
        token_lists = [tokens[: plan["max_tokens"]] for tokens in whole]
        result = {"model": {"config": "tiny" if tiny else MODELS[kind], "parameters_m": _parameters_m(engine),
                            "dtype": str(engine.dtype).removeprefix("torch."), "frame_rate": engine.frame_rate,
                            "sample_rate": engine.sample_rate, "max_running": engine.max_running,
                            "decodes_apart": engine.decodes_apart},
                  "plan": {key: plan[key] for key in ("clients", "served_s", "workload", "max_tokens")}}
        print(f"{kind}: {result['model']['parameters_m']} M parameters, {result['model']['dtype']}, "
              f"{plan['clients']} clients, {plan['served_s']} s per policy:", flush=True)
        result.update(engine_alone(engine, token_lists, max(whole, key=len), plan))
        engine_decodes_apart = engine.decodes_apart
        del engine
        free_device(device)
        result["served"], result["skipped_runs"] = served_runs(kind, path, device, plan, token_lists, budget,
                                                                     engine_decodes_apart)
    result["ratios"] = _ratios(result)
    result["targets"] = TARGETS[kind]
    result["verdicts"] = verdicts(result["ratios"], result["targets"])
    print_figures(result)
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def _ratios(result: dict) -> dict:
    by_policy = {row["policy"]: row["audio_s_per_s"] for row in result["served"]}
    adaptive = by_policy.get("adaptive")
    at_16 = [row for row in result["step_times"] if row["running"] == 16 and "skipped" not in row]
    ratios = {"adaptive_audio_s_per_s": adaptive,
              "adaptive_vs_sequential": ratio(adaptive, by_policy.get("sequential")),
              "adaptive_vs_static": ratio(adaptive, by_policy.get("static")),
              "adaptive_vs_ceiling": ratio(adaptive, result["ceiling"]["audio_s_per_s"]),
              "step_wall_vs_busy_at_16": at_16[0].get("wall_vs_busy") if at_16 else None}
    if result["model"]["decodes_apart"]:
        ratios["codec_stage_vs_inline"] = ratio(adaptive, by_policy.get("adaptive, codec inline"))
    return ratios


def check_part(kind: str, device: str, plan_name: str, budget: Budget) -> dict:
    """One model's part, if the check's time allows it to start (else why not); one model's fault is recorded
    as its part's failure (the other parts' figures still come back)."""
    # to start: about two runs' overhead (the build and the engine alone) and one run
    why = budget.refuses(kind, 2 * RUN_OVERHEAD_S[kind] + PLANS[plan_name]["served_s"])
    return {"skipped": why} if why else check_model(kind, device, plan_name, budget)
