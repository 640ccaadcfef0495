"""GPU check: random-weight models at released sizes through the real engines and the real engine loops.

    bash bench/gpu_check.sh --out DIR                        # on CUDA (a lent GPU): under 8 minutes
    bash bench/gpu_check.sh --device cpu --quick --out DIR   # CPU smoke test, tiny models (before a GPU run)
    bash bench/gpu_check.sh --device cpu --smoke --out DIR   # the least that runs every part (the test suite's)

1. VITS (MMS size):
   a. the engine alone: batch sizes 1..64 of length-sorted workload sentences (the best batches this engine
      can get): seconds per batch, audio seconds per second, real tokens per second, and peak device memory
      (CUDA) per batch and per padded token;
   b. its lower precision (degrade mode's `set_low_precision`, where the engine offers one): the same sizes
      again, whether every batch ran (a failure is recorded, not fatal), and its speed against full precision;
   c. served: the same sentences through the engine loop (queue, policy, engine thread; in process, no HTTP)
      under a closed loop of concurrent clients, once per policy (adaptive, static: 8 items, 500 ms, and
      sequential), each run on an engine of its own. Throughput, latency percentiles, realised batch sizes.
2. Autoregressive (bench/gpu_stepped.py): a Pocket TTS at its released size and a VibeVoice at the released
   1.5 B layout: step milliseconds at 1, 4 and 16 running and the device's busy share of a step; the lower
   precision; the ceiling; served through the stepped strategy, adaptive (continuous batching, its codec a
   stage and inline) against static and sequential (request-level), each run on an engine of its own.
3. Kokoro (bench/kokoro.py, its "gpu" plan): Chorus serving a random-weight Kokoro at the released size over HTTP
   against Kokoro-FastAPI serving the same weights (when KOKORO_FASTAPI_DIR names its source, else left out and
   said so), 16 clients, the mixed texts; the target on a GPU is 2x Kokoro-FastAPI. It needs the kokoro package
   and misaki; without them it is skipped and the JSON says why.

Time: each part has its share of the check's 470 s (SHARES_S; a part may use what the parts before it left);
a run, or a part, that its time would not hold is skipped, and the JSON says what and why (`parts`). A run
that finished fewer than half its callers' requests, a lower precision whose batch failed, or a part that
raised marks the JSON failed: `"failed": true` and `failures`, one line each (the page shows them first).

Needs torch, transformers 5.23 (for Pocket TTS and VibeVoice: carry its wheel where the machine has an
older one), numpy, tokenizers, safetensors and prometheus_client; no PyAV and no Piper (the random
voices are made from noise). Weights are random: the audio is noise of a speech-like length, enough
to time and size.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from bench import gpu_stepped
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
    summary,
    verdicts,
)
from bench.random_vits import TINY, save_random_vits
from bench.workload import texts
from tts_core.engines.base import VoiceSpec
from tts_core.engines.contract import EngineInput
from tts_core.engines.vits import VitsEngine
from tts_core.ops.metrics import Metrics
from tts_core.scheduler.queue import RequestQueue
from tts_core.scheduler.records import QueuedItem
from tts_core.scheduler.strategies import make_engine_loop

# shares: each part's seconds, in the order they run (on an H200, estimated: not yet measured there; 470 s in
# all, under 8 minutes with the start); kokoro_needs_s: its servers' start, two rounds of 30 s each way, the ceiling
# calibration_sizes: the served loop's warm-up sweep
FULL = {"sizes": [1, 2, 4, 8, 16, 32, 64], "sweep_s": 2.0, "served_s": 10.0, "clients": 64, "sentences": 512,
        "shares": {"vits": 80.0, "pocket_tts": 110.0, "vibevoice": 110.0, "kokoro": 170.0}, "kokoro_needs_s": 170.0,
        "run_overhead_s": 8.0, "calibration_sizes": [1, 2, 4, 8, 16, 32, 64]}
QUICK = {"sizes": [1, 2, 4, 8], "sweep_s": 1.0, "served_s": 4.0, "clients": 8, "sentences": 64,
         "shares": {"vits": 300.0, "pocket_tts": 300.0, "vibevoice": 300.0, "kokoro": 600.0}, "kokoro_needs_s": 0.0,
         "run_overhead_s": 0.0, "calibration_sizes": [1, 2, 4, 8, 16, 32, 64]}
# the least that runs every code path (tests/integration/test_gpu_check.py): two batch sizes, each timed twice, and
# 2 s per policy (static's first batch, after its 500 ms wait, answered within them on a busy CPU)
SMOKE = {**QUICK, "sizes": [1, 2], "sweep_s": 0.0, "served_s": 2.0, "clients": 4, "sentences": 16,
         "calibration_sizes": [1, 2]}
PLANS = {"full": FULL, "quick": QUICK, "smoke": SMOKE}  # quick and smoke: the tiny models
POLICIES = ["adaptive", "static", "sequential"]  # in this order: where time runs short, sequential goes first
MAX_BATCH_SIZE = 64
MAX_BATCH_TOKENS = 1 << 20  # the memory budget, not this, bounds batches on the GPU
VOICE = "random"
TARGETS = {"adaptive_vs_static": (">=", 1.4), "adaptive_vs_ceiling": (">=", 0.8),  # issue #43's, on a GPU
           "low_precision_every_batch": ("==", True), "low_vs_full": (">=", 1.3)}


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def sweep(engine: VitsEngine, token_lists: list, sizes: list[int], seconds_each: float) -> list[dict]:
    """Each batch size on length-sorted sentences, repeated for about seconds_each."""
    ordered = sorted(token_lists, key=len)
    rows = []
    for size in sizes:
        batches = [ordered[start:start + size] for start in range(0, len(ordered) - size + 1, size)]
        middle = batches[len(batches) // 2]  # a typical length, so sizes compare on like sentences
        items = [EngineInput(tokens, VOICE) for tokens in middle]
        engine.synthesize(items)  # warm: kernels, allocator
        if engine.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        runs, audio_s, started = 0, 0.0, time.perf_counter()
        while runs < 2 or time.perf_counter() - started < seconds_each:
            outputs = engine.synthesize(items)
            audio_s += sum(output.audio.size for output in outputs) / engine.sample_rate
            runs += 1
        elapsed = time.perf_counter() - started
        padded = size * max(len(tokens) for tokens in middle)
        row = {"batch_size": size, "runs": runs, "seconds_per_batch": round(elapsed / runs, 5),
               "audio_s_per_s": round(audio_s / elapsed, 2),
               "real_tokens_per_s": round(runs * sum(len(tokens) for tokens in middle) / elapsed, 1),
               "padded_tokens": padded}
        if engine.device == "cuda":
            peak = torch.cuda.max_memory_allocated() - base
            row.update(peak_memory_mb=round(peak / 2**20, 1), bytes_per_padded_token=round(peak / padded, 1))
        rows.append(row)
        print(f"  batch {size:3d}: {row['seconds_per_batch'] * 1000:9.1f} ms  {row['audio_s_per_s']:9.1f} audio-s/s"
              + (f"  peak {row['peak_memory_mb']:8.1f} MB" if "peak_memory_mb" in row else ""), flush=True)
    return rows


def low_precision_sweep(engine: VitsEngine, token_lists: list, plan: dict, full: list[dict]) -> dict:
    """The sweep again at the engine's lower precision (`set_low_precision(True)`, as degrade mode asks): every
    batch size, a failing one recorded as failed (the check goes on), each against full precision."""
    if not engine.set_low_precision(True):
        return {"offered": False, "why": f"the engine offers no lower precision on {engine.device}"}
    rows = []
    try:
        for size in plan["sizes"]:
            try:
                rows += sweep(engine, token_lists, [size], plan["sweep_s"] / 2)
            except Exception as error:  # (fp16 VITS raised in its flows on the first H200 run)
                traceback.print_exc()
                rows.append({"batch_size": size, "error": f"{type(error).__name__}: {error}"})
                print(f"  batch {size:3d}: FAILED {rows[-1]['error']}", flush=True)
        dtypes = sorted({str(weight.dtype).removeprefix("torch.") for weight in engine.model.parameters()})
    finally:
        engine.set_low_precision(False)
    by_size = {row["batch_size"]: row["audio_s_per_s"] for row in full}
    for row in rows:
        if "error" not in row:
            row["vs_full"] = ratio(row["audio_s_per_s"], by_size.get(row["batch_size"]))
    ran = [row["audio_s_per_s"] for row in rows if "error" not in row]
    result = {"offered": True, "dtypes_after": dtypes, "sweep": rows, "every_batch_ran": len(ran) == len(rows),
              "low_vs_full": ratio(max(ran), max(by_size.values())) if ran else None}
    failed = [row for row in rows if "error" in row]
    if failed:
        result.update(failed=True, why=f"{len(failed)} of {len(rows)} batch sizes failed at the lower precision "
                                       f"(batch {failed[0]['batch_size']}: {failed[0]['error']})")
    return result


def served(model_dir: Path, device: str, policy_name: str, token_lists: list, plan: dict) -> dict:
    """A closed loop of `clients` callers on an engine of its own, each sending the next sentence when its
    last returns; what is in flight at the end is waited for up to served_s more."""
    started = time.perf_counter()
    engine = VitsEngine(str(model_dir), [VoiceSpec(VOICE, "en")], device=device)
    metrics = Metrics()
    before = set(threading.enumerate())
    loop = make_engine_loop(engine, RequestQueue(max_size=4 * plan["clients"] + 64), metrics, policy_name,
                            MAX_BATCH_SIZE, MAX_BATCH_TOKENS, calibration_sizes=plan["calibration_sizes"])
    loop.start()
    loop.ready.wait()
    threads = loop_threads(before)
    key = engine.batch_key(VOICE, 1.0)
    tally = closed_loop(loop, lambda position: QueuedItem(EngineInput(token_lists[position % len(token_lists)],
                                                                      VOICE), key=key, deadline=math.inf),
                        plan["clients"], plan["served_s"], plan["served_s"], engine.sample_rate)
    window = metrics.window()  # the batches of this run (its window outlasts the run)
    row = {"policy": policy_name, "clients": plan["clients"], "seconds": round(tally.elapsed, 2), "sent": tally.sent,
           "requests": len(tally.latencies), "errors": tally.errors,
           "requests_per_s": round(len(tally.latencies) / tally.elapsed, 2),
           "audio_s_per_s": round(tally.audio_s / tally.elapsed, 2), **latency_ms(tally),
           "avg_batch_size": window["avg_batch_size"], "batches": window["batches_in_window"],
           "policy_state": loop.status().strategy.policy, "memory_token_budget": loop.memory.tokens(),
           "out_of_memory": loop.memory.out_of_memory_count, **stop_and_wait(loop, threads), **fate(tally)}
    del engine, loop
    gpu_stepped.free_device(device)
    row["run_s"] = round(time.perf_counter() - started, 1)
    return row


def served_runs(model_dir: Path, device: str, token_lists: list, plan: dict, budget: Budget
                ) -> tuple[list[dict], list[dict]]:
    """Each policy's run while the part's time holds: (rows, those skipped)."""
    return runs_in_budget(
        budget, "vits", plan["served_s"], plan["run_overhead_s"], list(POLICIES),
        lambda policy: served(model_dir, device, policy, token_lists, plan), lambda policy: policy,
        lambda row: f"{row['policy']:10s} {row['audio_s_per_s']:9.1f} audio-s/s  {row['requests_per_s']:8.1f} "
                    f"req/s  p50 {row['p50_ms']} ms  p95 {row['p95_ms']} ms  avg batch {row['avg_batch_size']}")


def check_vits(device: str, tiny: bool, plan: dict, budget: Budget) -> dict:
    """Part 1: the engine's sweep, its lower precision's, then served per policy."""
    result: dict = {}
    with tempfile.TemporaryDirectory() as folder:
        model_dir = save_random_vits(Path(folder) / "random-mms", **(TINY if tiny else {}))
        engine = VitsEngine(str(model_dir), [VoiceSpec(VOICE, "en")], device=device)
        parameters = sum(p.numel() for p in engine.model.parameters())
        result["model"] = {"config": "tiny" if tiny else "VitsConfig defaults (MMS-TTS size)",
                           "parameters_m": round(parameters / 1e6, 2), "sample_rate": engine.sample_rate}
        sentences = texts("mixed", plan["sentences"], seed=7)
        token_lists = [tokens for text in sentences for tokens in engine.tokenize(text, VOICE)]
        print(f"vits, {result['model']['config']}: {result['model']['parameters_m']} M parameters on {device}",
              flush=True)
        print("engine sweep (length-sorted batches):", flush=True)
        result["sweep"] = sweep(engine, token_lists, plan["sizes"], plan["sweep_s"])
        result["ceiling_audio_s_per_s"] = max(row["audio_s_per_s"] for row in result["sweep"])
        print("engine sweep at the lower precision (degrade mode's):", flush=True)
        result["low_precision"] = low_precision_sweep(engine, token_lists, plan, result["sweep"])
        if not result["low_precision"]["offered"]:
            print(f"  {result['low_precision']['why']}", flush=True)
        del engine  # each served run loads its own
        gpu_stepped.free_device(device)
        print(f"served through the loop, {plan['clients']} concurrent clients, mixed sentences:", flush=True)
        result["served"], result["skipped_runs"] = served_runs(model_dir, device, token_lists, plan, budget)
    by_policy = {row["policy"]: row["audio_s_per_s"] for row in result["served"]}
    low = result["low_precision"]
    result["ratios"] = {
        "adaptive_vs_static": ratio(by_policy.get("adaptive"), by_policy.get("static")),
        "adaptive_vs_sequential": ratio(by_policy.get("adaptive"), by_policy.get("sequential")),
        "adaptive_vs_ceiling": ratio(by_policy.get("adaptive"), result["ceiling_audio_s_per_s"]),
        "low_precision_every_batch": low.get("every_batch_ran"), "low_vs_full": low.get("low_vs_full")}
    result["targets"] = TARGETS
    result["verdicts"] = verdicts(result["ratios"], TARGETS)
    print_figures(result)
    return result


def check_kokoro(device: str, plan_name: str, plan: dict, budget: Budget, out: Path) -> dict:
    """Part 3 (see the module's docstring); on the CPU (--device cpu) only with --quick or --smoke (the tiny
    model, bench/kokoro.py's plan of that name)."""
    if device == "cpu" and plan_name == "full":
        return {"skipped": "not run: on the CPU, python -m bench --kokoro is the full comparison"}
    why = budget.refuses("kokoro", plan["kokoro_needs_s"])
    if why:
        return {"skipped": why}
    try:
        from bench.kokoro import run
    except ImportError as error:  # a missing package: said, and the check goes on
        return {"skipped": f"not run: {type(error).__name__}: {error}"}
    return run(plan_name != "full", out, "gpu" if plan_name == "full" else plan_name)


def run_part(name: str, device: str, budget: Budget, runner: Callable[[], dict]) -> dict:
    """One part, timed; a part that raises is recorded as failed, and the check goes on to the next."""
    started = time.perf_counter()
    try:
        part = runner()
    except Exception as error:
        traceback.print_exc()
        part = {"failed": True, "why": f"{type(error).__name__}: {error}"}
        gpu_stepped.free_device(device)
    if "skipped" in part:
        print(f"{name}: skipped: {part['skipped']}", flush=True)
    part["seconds"] = round(time.perf_counter() - started, 1)
    return part


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="plan", action="store_const", const="quick",
                      help="tiny models, short runs (a smoke test)")
    size.add_argument("--smoke", dest="plan", action="store_const", const="smoke",
                      help="tiny models, the least work that runs every part (the test suite's)")
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json")
    args = parser.parse_args()
    plan_name = args.plan or "full"
    plan, tiny = PLANS[plan_name], plan_name != "full"
    if args.device == "cpu":  # the tiny models' tensors: more threads only wait on each other (on a busy machine,
        torch.set_num_threads(1)  # VITS's batch took 8x as long on two threads as on one)
    args.out.mkdir(parents=True, exist_ok=True)
    budget = Budget(plan["shares"])
    result: dict = {"device": args.device, "plan_name": plan_name, "torch": torch.__version__,
                    "python": platform.python_version(), "plan": plan}
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name(0)
        result["gpu_memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    result["vits"] = run_part("vits", args.device, budget, lambda: check_vits(args.device, tiny, plan, budget))
    result["stepped"] = {kind: run_part(kind, args.device, budget, lambda kind=kind: gpu_stepped.check_part(
        kind, args.device, plan_name, budget)) for kind in gpu_stepped.MODELS}
    result["kokoro"] = run_part("kokoro", args.device, budget,
                                lambda: check_kokoro(args.device, plan_name, plan, budget, args.out))
    result.update(summary(result, budget))
    (args.out / "gpu_check.json").write_text(json.dumps(result, indent=2))
    print("parts: " + "; ".join(f"{name} {part['seconds']} s of {part['share_s']:.0f}"
                                + (f" ({len(part['skipped'])} skipped)" if part["skipped"] else "")
                                for name, part in result["parts"].items()), flush=True)
    for line in result["failures"]:
        print(f"FAILED {line}", flush=True)
    print(f"wrote {args.out / 'gpu_check.json'} in {result['total_s']} s", flush=True)


if __name__ == "__main__":
    main()
