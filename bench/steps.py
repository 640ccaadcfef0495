"""`python -m bench.steps`: the stepped engine's step, eager and compiled side by side (issue 51).

Per running count (1, 4, 16 by default): a step's wall milliseconds (median of `--steps`), the aten ops it
dispatches and the host syncs it makes (the profiler: `aten::_local_scalar_dense`, `aten::item`, device-to-host
copies; on CUDA also `cudaStreamSynchronize` / `cudaMemcpy*` and the kernels' time over the wall), and the time
compiling took at load. Each mode loads its own engine from the same saved model; requests make their whole
budgets (`fixed_length`), so the running set stays as asked. A `tolist` of a CPU tensor dispatches nothing: on the
CPU the step's one host read (which rows ended) is not seen by the profiler, and the `host_reads` column says what
the engine's step does by construction (1). `--quick`: the tiny random Pocket TTS at 1 and 2 running, few steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench.random_model import save_random_pocket
from tts_core.engines.contract import EngineInput
from tts_core.engines.pocket_tts import PocketTTSEngine

SYNC_OPS = ("aten::_local_scalar_dense", "aten::item")
CUDA_SYNCS = ("cudaStreamSynchronize", "cudaMemcpy", "cudaMemcpyAsync", "cudaDeviceSynchronize")
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the deep forest."
# cache positions per row the compiled steps are made for: TEXT's prompt and its whole frame budget need 538, past
# the engine's default 512 (there the step runs eager: a compiled row whose steps ran none is refused below)
STEP_CONTEXT = 1024


def load(folder: Path, mode: str, running: int, device: str, backend: str) -> tuple[PocketTTSEngine, float]:
    started = time.perf_counter()
    engine = PocketTTSEngine(str(folder), [], device=device, max_running=running, fixed_length=True, seed=0,
                             step_mode=mode, step_backend=backend, step_buckets=[running], step_context=STEP_CONTEXT)
    return engine, time.perf_counter() - started


def profiled(engine: PocketTTSEngine, steps: int) -> dict:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            engine.step()
        if engine.device == "cuda":
            torch.cuda.synchronize()
    events = prof.events()
    aten = [event for event in events if event.name.startswith("aten::")]
    syncs = [event for event in events if event.name in SYNC_OPS or event.name in CUDA_SYNCS]
    d2h = [event for event in events if "DtoH" in event.name or "Memcpy DtoH" in event.name]
    kernel_us = sum(event.device_time for event in events if getattr(event, "device_type", None) is not None
                    and str(event.device_type).endswith("CUDA"))
    return {"aten_ops_per_step": round(len(aten) / steps, 1), "host_syncs_per_step": round(len(syncs) / steps, 2),
            "d2h_copies_per_step": round(len(d2h) / steps, 2), "kernel_us": kernel_us}


def measure(folder: Path, mode: str, running: int, steps: int, device: str, backend: str) -> dict:
    engine, load_s = load(folder, mode, running, device, backend)
    [tokens] = engine.tokenize(TEXT, "default")
    engine.admit([EngineInput(tokens, "default") for _ in range(running)])
    for _ in range(3):
        engine.step()
    walls = []
    for _ in range(steps):
        started = time.perf_counter()
        engine.step()
        if device == "cuda":
            torch.cuda.synchronize()
        walls.append(time.perf_counter() - started)
    figures = profiled(engine, min(steps, 5))
    wall_ms = statistics.median(walls) * 1e3
    status = engine.step_status()
    if status["step_mode"] == "compiled" and not status["steps_compiled"]:
        raise SystemExit(f"pocket_tts at {running} running: compiled mode ran every measured step eager "
                         f"({status['steps_eager']} steps): its figures would be eager's")
    busy = figures.pop("kernel_us") / 1e3 / min(steps, 5)
    return {"engine": "pocket_tts", "running": running, "mode": status["step_mode"], "asked": mode,
            "step_wall_ms": round(wall_ms, 3), **figures, "host_reads_per_step": 1,
            "kernel_over_wall": round(busy / wall_ms, 3) if device == "cuda" else None,
            "steps_compiled": status["steps_compiled"], "steps_eager": status["steps_eager"],
            "compile_s": status["step_compile_total_s"], "load_s": round(load_s, 1),
            "why": status["step_mode_reason"]}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m bench.steps", description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend for the compiled step")
    parser.add_argument("--model", help="a Pocket TTS folder (default: the tiny random one)")
    parser.add_argument("--quick", action="store_true", help="the tiny model at 1 and 2 running, 5 steps")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args(argv)
    if args.quick:
        args.running, args.steps = [1, 2], 5
    torch.set_num_threads(1) if args.device == "cpu" else None
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.model) if args.model else save_random_pocket(Path(scratch) / "tiny", tiny=True, seed=0)
        rows = [measure(folder, mode, running, args.steps, args.device, args.backend)
                for running in args.running for mode in ("eager", "compiled")]
    for row in rows:
        print(json.dumps(row))
    for running in args.running:
        eager, compiled = (row for row in rows if row["running"] == running)
        share = compiled["step_wall_ms"] / eager["step_wall_ms"]
        print(f"pocket_tts at {running} running: compiled/eager step wall {share:.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
