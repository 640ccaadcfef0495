"""The GPU check's autoregressive part: a random-weight Pocket TTS at its released size and a random-weight
VibeVoice at the released 1.5 B layout, each through the real engine loop (queue, policy, engine
thread; in process, no HTTP) once per policy: adaptive (continuous batching), sequential and static
(request-level batches of 8, 500 ms, audio held until the batch is done); Pocket TTS's adaptive runs once
more with its codec on the engine's thread rather than a stage of its own (`codec_stage_vs_inline`). A closed
loop of 16 callers of mixed texts for a fixed time; then the engine ceiling, engine.synthesize of the 16 first
texts at once.

Throughput is the audio the engine made per second of the run: the frames every step made (counted at
each step the engine makes, after the calibration sweep), at the model's frame rate. Counting only the
requests done in the window would favour short ones and miss the work in flight at its end. The requests
done, their latency and the audio they delivered are given too. Weights are random: `fixed_length` makes
every request its whole frame budget.

`--device cpu --quick` runs the same with the tiny models, short texts and short runs (a smoke test).
"""

from __future__ import annotations

import math
import tempfile
import threading
import time
import traceback
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import numpy as np
import torch

from bench.workload import texts
from tts_core.engines.base import SteppedEngine
from tts_core.ops.metrics import Metrics
from tts_core.request.records import EngineInput, QueuedItem
from tts_core.scheduler.queue import RequestQueue
from tts_core.scheduler.strategies import make_engine_loop

FULL = {"clients": 16, "served_s": 15.0, "texts": 64, "workload": "mixed", "calibration_sizes": [1, 2, 4, 8, 16]}
QUICK = {"clients": 8, "served_s": 2.0, "texts": 16, "workload": "short", "calibration_sizes": [1, 2]}
POLICIES = ["sequential", "static", "adaptive"]
MODELS = {"pocket_tts": "Pocket TTS, released size", "vibevoice": "VibeVoice, the released 1.5 B layout"}
# What each model's part takes on an H200, about (estimated, not yet measured there): building the random
# model and its tokenizer, three engine-loop warm-ups, three runs (Pocket TTS: four, its codec a stage of its own
# and not), the ceiling.
NEEDS_S = {"pocket_tts": 150.0, "vibevoice": 170.0}
# The stepped voices' targets of bench's harness (continuous batching against request-level batches).
TARGETS = {"adaptive_vs_sequential": 2.0, "adaptive_vs_static": 1.6, "adaptive_vs_ceiling": 1.2}


def voice_clip(sample_rate: int, seconds: float = 3.0) -> np.ndarray:
    """The shipped voice's clip: noise, as random weights make nothing of speech anyway (no Piper needed)."""
    return (0.1 * np.random.default_rng(0).standard_normal(int(seconds * sample_rate))).astype(np.float32)


def build(kind: str, folder: Path, device: str, quick: bool) -> SteppedEngine:
    """A random model saved as a registry folder, then loaded as the server loads it (bf16 on CUDA)."""
    dtype = "bf16" if device == "cuda" else "fp32"
    if kind == "pocket_tts":
        from bench.random_model import save_random_pocket
        from tts_core.engines.pocket_tts import PocketTTSEngine

        save_random_pocket(folder, tiny=quick, clip=voice_clip(24000))
        return PocketTTSEngine(str(folder), [], device, dtype, fixed_length=True, seed=0)
    from bench.random_vibevoice import save_random_vibevoice
    from tts_core.engines.vibevoice import VibeVoiceEngine

    # the 1.5 B model's weights are made on the GPU (seconds, not minutes) and saved at bf16
    save_random_vibevoice(folder, "tiny" if quick else "1.5b", device=device, dtype=torch.bfloat16
                          if device == "cuda" else torch.float32, clip=voice_clip(24000))
    if device == "cuda":
        torch.cuda.empty_cache()
    return VibeVoiceEngine(str(folder), [], device, dtype, fixed_length=True, seed=0)


def _items(engine: SteppedEngine, token_lists: list[np.ndarray]) -> list[QueuedItem]:
    voice = engine.voices()[0].name
    return [QueuedItem(EngineInput(tokens, voice), key=engine.batch_key(voice, 1.0), deadline=math.inf)
            for tokens in token_lists]


def served(engine: SteppedEngine, policy_name: str, token_lists: list, plan: dict, codec_stage: str = "on") -> dict:
    """`clients` callers, each sending the next text when its last returns, for served_s; what is still
    queued or running then is cancelled. codec_stage "off": the codec decodes on the engine's thread."""
    loop = make_engine_loop(engine, RequestQueue(max_size=4 * plan["clients"] + 64), Metrics(), policy_name,
                            calibration_sizes=plan["calibration_sizes"], codec_stage=codec_stage)
    loop.start()
    loop.calibrated.wait()
    steps = _count_steps(engine)
    latencies: list[float] = []
    delivered, errors = [0.0], [0]
    lock = threading.Lock()
    started = time.perf_counter()
    stop_at = started + plan["served_s"]

    def client(index: int) -> None:
        position = index
        while time.perf_counter() < stop_at:
            [item] = _items(engine, [token_lists[position % len(token_lists)]])
            position += plan["clients"]
            sent = time.perf_counter()
            loop.submit([item])
            try:
                audio = item.future.result(timeout=max(0.0, stop_at - sent)).audio
            except (FutureTimeout, CancelledError):
                item.future.cancel()  # the caller goes: the loop drops it at its next turn
                return
            except Exception:  # a failed request (out of memory, say): counted, and the caller goes on
                with lock:
                    errors[0] += 1
                continue
            with lock:
                latencies.append(time.perf_counter() - sent)
                delivered[0] += audio.size / engine.sample_rate

    threads = [threading.Thread(target=client, args=(index,)) for index in range(plan["clients"])]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, stop_at - time.perf_counter()))
    elapsed, sizes = time.perf_counter() - started, list(steps)  # the steps of this run
    with lock:
        done, audio_s = sorted(latencies), delivered[0]
    for thread in threads:
        thread.join()
    loop.stop()
    del engine.step  # the class's own again
    frames = sum(sizes)
    name = policy_name if codec_stage == "on" or not engine.decodes_apart else f"{policy_name}, codec inline"
    return {"policy": name, "clients": plan["clients"], "seconds": round(elapsed, 2),
            "audio_s_per_s": round(frames / engine.frame_rate / elapsed, 2), "steps": len(sizes),
            "frames_per_step": round(frames / len(sizes), 2) if sizes else 0.0, "requests_done": len(done),
            "delivered_audio_s_per_s": round(audio_s / elapsed, 2),
            "p50_ms": round(1000 * done[len(done) // 2], 1) if done else None,
            "p95_ms": round(1000 * done[int(0.95 * (len(done) - 1))], 1) if done else None,
            "errors": errors[0], "policy_state": loop.status()["policy"],
            "out_of_memory": loop.memory.out_of_memory_count}


def _count_steps(engine: SteppedEngine) -> list[int]:
    """The requests running at each step the engine makes from now on, whoever drives it (the stepped
    strategy, or the request-level peers' whole batches): one frame each."""
    sizes: list[int] = []
    step = engine.step

    def counted():
        sizes.append(len(engine.running()))
        return step()
    engine.step = counted
    return sizes


def ceiling(engine: SteppedEngine, token_lists: list) -> dict:
    """engine.synthesize of these texts at once: every request runs from the first step to its last."""
    inputs = [item.input for item in _items(engine, token_lists)]
    engine.synthesize(inputs[:1])  # warm
    started = time.perf_counter()
    outputs = engine.synthesize(inputs)
    seconds = time.perf_counter() - started
    frames = [output.audio.size / engine.sample_rate * engine.frame_rate for output in outputs]
    return {"requests": len(inputs), "seconds": round(seconds, 2),
            "audio_s_per_s": round(sum(output.audio.size for output in outputs) / engine.sample_rate / seconds, 2),
            "frames_per_step": round(sum(frames) / max(frames), 2)}


def _parameters_m(engine: SteppedEngine) -> float:
    """Millions of weights: parameters, and the weights and biases a CPU engine prepacked (held as buffers)."""
    modules = [engine.model] + ([engine.codec] if hasattr(engine, "codec") else [])
    weights = [tensor for module in modules for tensor in module.parameters()]
    weights += [tensor for module in modules for name, tensor in module.named_buffers()
                if name.rsplit(".", 1)[-1] in ("weight", "bias")]
    return round(sum(tensor.numel() for tensor in weights) / 1e6, 1)


def check_model(kind: str, device: str, quick: bool) -> dict:
    plan = QUICK if quick else FULL
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        engine = build(kind, Path(folder) / kind, device, quick)
    sentences = texts(plan["workload"], plan["texts"], seed=7)
    voice = engine.voices()[0].name
    token_lists = [np.concatenate(engine.tokenize(text, voice)) for text in sentences]
    result = {"model": {"config": "tiny" if quick else MODELS[kind], "parameters_m": _parameters_m(engine),
                        "dtype": str(engine.dtype).removeprefix("torch."), "frame_rate": engine.frame_rate,
                        "sample_rate": engine.sample_rate, "max_running": engine.max_running},
              "plan": {key: plan[key] for key in ("clients", "served_s", "workload")}, "served": []}
    print(f"{kind}: {result['model']['parameters_m']} M parameters, {result['model']['dtype']}, "
          f"{plan['clients']} clients, {plan['served_s']} s per policy:", flush=True)
    runs = [(policy, "on") for policy in POLICIES] + [("adaptive", "off")] * engine.decodes_apart
    for policy, codec_stage in runs:  # (with a codec stage, adaptive with the codec on the engine's thread too)
        row = served(engine, policy, token_lists, plan, codec_stage)
        result["served"].append(row)
        print(f"  {row['policy']:10s} {row['audio_s_per_s']:8.2f} audio-s/s  {row['frames_per_step']:6.2f} "
              f"frames/step  {row['requests_done']:4d} done  p50 {row['p50_ms']} ms", flush=True)
    result["ceiling"] = ceiling(engine, token_lists[: plan["clients"]])
    print(f"  {'ceiling':10s} {result['ceiling']['audio_s_per_s']:8.2f} audio-s/s  "
          f"{result['ceiling']['frames_per_step']:6.2f} frames/step", flush=True)
    by_policy = {row["policy"]: row["audio_s_per_s"] for row in result["served"]}
    adaptive = by_policy["adaptive"]
    result["ratios"] = {"adaptive_vs_sequential": round(adaptive / max(by_policy["sequential"], 1e-9), 3),
                        "adaptive_vs_static": round(adaptive / max(by_policy["static"], 1e-9), 3),
                        "adaptive_vs_ceiling": round(adaptive / max(result["ceiling"]["audio_s_per_s"], 1e-9), 3)}
    if "adaptive, codec inline" in by_policy:
        result["ratios"]["codec_stage_vs_inline"] = round(adaptive / max(by_policy["adaptive, codec inline"], 1e-9), 3)
    result["targets"] = TARGETS
    result["seconds"] = round(time.perf_counter() - started, 1)
    del engine
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def check(device: str, quick: bool, started: float, budget_s: float) -> dict:
    """Each model in turn, while the check's time allows; a model not started, or failing, says why in
    its place (the other parts' figures still come back)."""
    if device == "cpu":
        torch.set_num_threads(1)  # the tiny models' tensors: more threads only wait on each other
    results = {}
    for kind in MODELS:
        spent = time.perf_counter() - started
        if not quick and spent + NEEDS_S[kind] > budget_s:
            results[kind] = {"skipped": f"not started: {spent:.0f} s of the check's {budget_s:.0f} s were spent"}
            print(f"{kind}: {results[kind]['skipped']}", flush=True)
            continue
        try:
            results[kind] = check_model(kind, device, quick)
        except Exception as error:  # one model's fault must not lose the others' figures
            traceback.print_exc()
            results[kind] = {"skipped": f"failed: {type(error).__name__}: {error}"}
            if device == "cuda":
                torch.cuda.empty_cache()
    return results
