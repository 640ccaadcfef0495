"""GPU check: random-weight models at released sizes through the real engines and the real engine loops.

    bash bench/gpu_check.sh --out DIR                     # on CUDA (a lent GPU): under 8 minutes
    bash bench/gpu_check.sh --device cpu --quick --out DIR   # CPU smoke test (CI), tiny models

1. Engine sweep: batch sizes 1..64 of length-sorted workload sentences (the best batches this
   engine can get): seconds per batch, audio seconds per second, real tokens per second, and
   peak device memory (CUDA) per batch and per padded token; on CUDA also at fp16.
2. Served: the same sentences through the engine loop (queue, policy, engine thread; in process,
   no HTTP) under a closed loop of concurrent clients, once per policy: sequential, static
   (8 items, 500 ms) and adaptive. Throughput, latency percentiles, realised batch sizes.
3. Autoregressive (bench/gpu_stepped.py): a Pocket TTS at its released size and a VibeVoice at the
   released 1.5 B layout through the stepped strategy, adaptive (continuous batching) against
   sequential and static (request-level), 16 callers of mixed texts; audio seconds per second and
   frames per step, and each engine's ceiling. A model whose part would end past the time budget is
   skipped, and the JSON says so.
4. Kokoro (bench/kokoro.py, its "gpu" plan): Chorus serving a random-weight Kokoro at the released size over HTTP
   against Kokoro-FastAPI serving the same weights (when KOKORO_FASTAPI_DIR names its source, else left out and
   said so), 16 clients, the mixed texts; the target on a GPU is 2x Kokoro-FastAPI. It needs the kokoro package
   and misaki; without them, or with under KOKORO_NEEDS_S of the budget left, it is skipped and the JSON says why.

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
from pathlib import Path

import torch

from bench import gpu_stepped
from bench.random_vits import TINY, save_random_vits
from bench.workload import texts
from tts_core.engines.base import VoiceSpec
from tts_core.engines.vits import VitsEngine
from tts_core.ops.metrics import Metrics
from tts_core.request.records import EngineInput, QueuedItem
from tts_core.scheduler.queue import RequestQueue
from tts_core.scheduler.strategies import make_engine_loop

FULL = {"sizes": [1, 2, 4, 8, 16, 32, 64], "sweep_s": 5.0, "served_s": 25.0, "clients": 64, "sentences": 512}
QUICK = {"sizes": [1, 2, 4, 8], "sweep_s": 1.0, "served_s": 4.0, "clients": 8, "sentences": 64}
POLICIES = ["sequential", "static", "adaptive"]
MAX_BATCH_SIZE = 64
MAX_BATCH_TOKENS = 1 << 20  # the memory budget, not this, bounds batches on the GPU
VOICE = "random"
KOKORO_NEEDS_S = 240.0  # the Kokoro part: two servers ready, two rounds of 30 s each way, the ceiling
BUDGET_S = 470.0  # the whole check on an H200, under 8 minutes: a part that would end later is skipped


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


def served(engine: VitsEngine, policy_name: str, token_lists: list, clients: int, seconds: float) -> dict:
    """A closed loop of `clients` callers, each sending the next sentence when its last returns."""
    metrics = Metrics()
    queue = RequestQueue(max_size=4 * clients + 64)
    loop = make_engine_loop(engine, queue, metrics, policy_name, MAX_BATCH_SIZE, MAX_BATCH_TOKENS,
                            calibration_sizes=(1, 2, 4, 8, 16, 32, 64))
    loop.start()
    loop.ready.wait()
    latencies: list[float] = []
    audio = [0.0]
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def client(index: int) -> None:
        position = index
        while time.perf_counter() < stop_at:
            tokens = token_lists[position % len(token_lists)]
            position += clients
            item = QueuedItem(EngineInput(tokens, VOICE), key=engine.batch_key(VOICE, 1.0), deadline=math.inf)
            started = time.perf_counter()
            loop.submit([item])
            output = item.future.result()
            with lock:
                latencies.append(time.perf_counter() - started)
                audio[0] += output.audio.size / engine.sample_rate

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    window = metrics.window()  # the batches of this run (its window outlasts the run)
    loop.stop()
    latencies.sort()
    return {"policy": policy_name, "clients": clients, "seconds": round(elapsed, 2), "requests": len(latencies),
            "requests_per_s": round(len(latencies) / elapsed, 2), "audio_s_per_s": round(audio[0] / elapsed, 2),
            "p50_ms": round(1000 * latencies[len(latencies) // 2], 1),
            "p95_ms": round(1000 * latencies[int(0.95 * (len(latencies) - 1))], 1),
            "avg_batch_size": window["avg_batch_size"], "batches": window["batches_in_window"],
            "policy_state": loop.status()["policy"],
            "memory_token_budget": loop.memory.tokens(), "out_of_memory": loop.memory.out_of_memory_count}


def check_vits(device: str, quick: bool, plan: dict, result: dict) -> None:
    """Parts 1 and 2: the VITS engine's sweep, then served per policy (into result)."""
    with tempfile.TemporaryDirectory() as folder:
        model_dir = save_random_vits(Path(folder) / "random-mms", **(TINY if quick else {}))
        engine = VitsEngine(str(model_dir), [VoiceSpec(VOICE, "en")], device=device)
    parameters = sum(p.numel() for p in engine.model.parameters())
    result["model"] = {"config": "tiny" if quick else "VitsConfig defaults (MMS-TTS size)",
                       "parameters_m": round(parameters / 1e6, 2), "sample_rate": engine.sample_rate}
    sentences = texts("mixed", plan["sentences"], seed=7)
    token_lists = [tokens for text in sentences for tokens in engine.tokenize(text, VOICE)]
    print(f"{result['model']['config']}: {result['model']['parameters_m']} M parameters on {device}"
          + (f" ({result['gpu']})" if "gpu" in result else ""), flush=True)

    print("engine sweep (length-sorted batches):", flush=True)
    result["sweep"] = sweep(engine, token_lists, plan["sizes"], plan["sweep_s"])
    ceiling = max(row["audio_s_per_s"] for row in result["sweep"])
    if engine.set_low_precision(True):  # CUDA: the degrade mode's precision action, measured
        print("engine sweep at fp16 (degrade mode's lower precision):", flush=True)
        result["sweep_fp16"] = sweep(engine, token_lists, [1, 16, 64], plan["sweep_s"] / 2)
        engine.set_low_precision(False)
    result["ceiling_audio_s_per_s"] = ceiling

    print(f"served through the loop, {plan['clients']} concurrent clients, mixed sentences:", flush=True)
    result["served"] = []
    for policy in POLICIES:
        row = served(engine, policy, token_lists, plan["clients"], plan["served_s"])
        result["served"].append(row)
        print(f"  {policy:10s} {row['audio_s_per_s']:9.1f} audio-s/s  {row['requests_per_s']:8.1f} req/s  "
              f"p50 {row['p50_ms']:8.1f} ms  p95 {row['p95_ms']:8.1f} ms  avg batch {row['avg_batch_size']}",
              flush=True)
    by_policy = {row["policy"]: row["audio_s_per_s"] for row in result["served"]}
    result["ratios"] = {
        "adaptive_vs_static": round(by_policy["adaptive"] / by_policy["static"], 3),
        "adaptive_vs_sequential": round(by_policy["adaptive"] / by_policy["sequential"], 3),
        "adaptive_vs_ceiling": round(by_policy["adaptive"] / ceiling, 3),
    }
    result["targets"] = {"adaptive_vs_static": 1.4, "adaptive_vs_ceiling": 0.8}
    for name, value in result["ratios"].items():
        target = result["targets"].get(name)
        print(f"  {name:24s} {value:6.3f}" + (f"  (GPU target >= {target})" if target else ""), flush=True)
    del engine  # its device memory goes before the autoregressive models load
    if device == "cuda":
        torch.cuda.empty_cache()


def check_kokoro(device: str, quick: bool, started: float, out: Path) -> dict:
    """Part 4 (see the module's docstring); on the CPU (--device cpu) only with --quick (the tiny model)."""
    spent = time.perf_counter() - started
    if device == "cpu" and not quick:
        return {"skipped": "not run: on the CPU, python -m bench --kokoro is the full comparison"}
    if not quick and spent + KOKORO_NEEDS_S > BUDGET_S:
        return {"skipped": f"not started: {spent:.0f} s of the check's {BUDGET_S:.0f} s were spent"}
    try:
        from bench.kokoro import run

        return run(quick, out, None if quick else "gpu")
    except Exception as error:  # (a missing package, a server that did not start): said, and the check goes on
        print(f"kokoro: skipped ({type(error).__name__}: {error})", flush=True)
        return {"skipped": f"failed: {type(error).__name__}: {error}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="tiny models, short runs (a smoke test)")
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    result: dict = {"device": args.device, "quick": args.quick, "torch": torch.__version__,
                    "python": platform.python_version(), "plan": plan}
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name(0)
        result["gpu_memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    check_vits(args.device, args.quick, plan, result)
    result["stepped"] = gpu_stepped.check(args.device, args.quick, started, BUDGET_S)
    result["kokoro"] = check_kokoro(args.device, args.quick, started, args.out)
    result["total_s"] = round(time.perf_counter() - started, 1)
    (args.out / "gpu_check.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out / 'gpu_check.json'} in {result['total_s']} s", flush=True)


if __name__ == "__main__":
    main()
