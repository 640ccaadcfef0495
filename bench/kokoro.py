"""Chorus serving Kokoro against Kokoro-FastAPI serving the same weights, side by side in one run, with the
engine ceiling: `python -m bench --kokoro [--quick]`.

The model is a random-weight Kokoro at the released size (82 M; --quick: the tiny one), built by
bench/random_kokoro.py and kept in ~/.cache/chorus. Kokoro-FastAPI runs from its own source: the folder in
KOKORO_FASTAPI_DIR (remsky/Kokoro-FastAPI at KOKORO_FASTAPI_COMMIT), with the Python in KOKORO_FASTAPI_PYTHON
(default: this one); docs/benchmarking.md says how to set it up. Without the folder the peer is left out, and the
run says so.

All three run on the GPU where there is one, else on the CPU. The same closed loop (CLIENTS clients, the mixed
texts, each client its own caller, the voice af_heart, raw PCM) goes to each server in turn, round after round
in alternating order, with the engine ceiling (the same texts in this process, in the best length-sorted
batches, no server) taking its turn in every round. Ratios, each the median over rounds of the rounds' own ratios
(short p95: over every round's requests):
- chorus_vs_kokoro_fastapi: Chorus's audio a second over Kokoro-FastAPI's (target >= 1.0 on a CPU, >= 2.0 on a GPU);
- short_p95_vs_kokoro_fastapi: short requests' p95 latency, Chorus over Kokoro-FastAPI (target <= 0.5);
- chorus_vs_ceiling: Chorus over the engine alone (no target).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import httpx
import torch

from bench.harness import OPERATOR, EngineAlone
from bench.load import closed_loop, summarize
from bench.server import ServerProcess, start_kokoro_fastapi, start_server
from bench.workload import texts

CLIENTS = 16
VOICE = "af_heart"
PEER = "kokoro-fastapi"
KOKORO_FASTAPI_COMMIT = "26eec068d8ce6f559afef83f68933127ac38e315"  # v0.8.1-rc1, the one measured
PLANS = {"full": {"rounds": 3, "round_s": 60.0, "texts": 32, "tiny": False, "ceiling_sizes": [1, 4],
                  "calibration_sizes": "1,2,4"},
         "quick": {"rounds": 1, "round_s": 15.0, "texts": 8, "tiny": True, "ceiling_sizes": [1],
                   "calibration_sizes": "1,2"},
         # bench/gpu_check.sh's part: the released size, shorter (the whole check has minutes on a lent GPU)
         "gpu": {"rounds": 2, "round_s": 30.0, "texts": 32, "tiny": False, "ceiling_sizes": [1, 4, 16],
                 "calibration_sizes": "1,2,4,8,16"},
         # bench/gpu_check.sh --smoke's (the test suite's): the least that serves over HTTP, two callers of one text
         "smoke": {"rounds": 1, "round_s": 1.0, "texts": 1, "tiny": True, "ceiling_sizes": [1],
                   "calibration_sizes": "1", "clients": 2}}
TARGETS = {"chorus_vs_kokoro_fastapi": (">=", 1.0), "short_p95_vs_kokoro_fastapi": ("<=", 0.5)}
GPU_TARGETS = {**TARGETS, "chorus_vs_kokoro_fastapi": (">=", 2.0)}  # a batch pays there; Kokoro-FastAPI runs 4 at once
CEILING = "engine ceiling"


def built_kokoro(tiny: bool) -> Path:
    from bench.random_kokoro import save_random_kokoro

    folder = Path.home() / ".cache" / "chorus" / f"bench-kokoro-random{'-tiny' if tiny else ''}"
    if not (folder / "config.json").exists():
        print(f"building the random-weight Kokoro in {folder} ...", flush=True)
        save_random_kokoro(folder, tiny=tiny)
    return folder


def peer_folders(model: Path, folder: Path) -> tuple[Path, Path]:
    """The model as Kokoro-FastAPI reads it (MODEL_DIR/v1_0/kokoro-v1_0.pth and its config.json), and its packs."""
    versioned = folder / "models" / "v1_0"
    versioned.mkdir(parents=True, exist_ok=True)
    for name in ("kokoro-v1_0.pth", "config.json"):
        (versioned / name).unlink(missing_ok=True)
        (versioned / name).symlink_to(model / name)
    return folder / "models", model / "voices"


def run(quick: bool, out: Path, plan_name: str | None = None) -> dict:
    plan = PLANS[plan_name or ("quick" if quick else "full")]
    clients = plan.get("clients", CLIENTS)
    targets = GPU_TARGETS if torch.cuda.is_available() else TARGETS
    model = built_kokoro(plan["tiny"])
    folder = Path(tempfile.mkdtemp(prefix="chorus-kokoro-bench-"))
    registry = folder / "voices.yaml"
    registry.write_text(f"voices:\n  '*': {{engine: kokoro, model: '{model}', pinned: true}}\n")
    mixed = texts("mixed", plan["texts"])  # (the texts the ceiling runs)
    source = os.environ.get("KOKORO_FASTAPI_DIR")
    print("the engine alone (the ceiling) ...", flush=True)
    engine = EngineAlone(VOICE, registry)
    servers: dict[str, ServerProcess] = {}
    try:
        print("starting Chorus ...", flush=True)
        servers["chorus"] = start_server(folder / "chorus", voices_file=str(registry), operator_defaults=json.dumps(
            OPERATOR), trusted_proxies="127.0.0.1", max_queue="4096", calibration_sizes=plan["calibration_sizes"],
            ready_timeout_s=900)  # (its calibration's batches of the released model take minutes on two cores)
        if source:
            print(f"starting Kokoro-FastAPI from {source} ...", flush=True)
            models, voices = peer_folders(model, folder / PEER)
            servers[PEER] = start_kokoro_fastapi(folder / PEER, Path(source),
                                                 os.environ.get("KOKORO_FASTAPI_PYTHON", sys.executable), models,
                                                 voices, gpu=torch.cuda.is_available())  # (as Chorus: where it can)
        else:
            print("KOKORO_FASTAPI_DIR is not set: Kokoro-FastAPI is left out (docs/benchmarking.md)", flush=True)
        names = [*servers, CEILING]
        rounds: dict[str, list[float]] = {name: [] for name in names}
        outcomes: dict[str, list] = {name: [] for name in servers}
        seconds = dict.fromkeys(servers, 0.0)
        for number in range(plan["rounds"]):
            for name in names[number % len(names):] + names[: number % len(names)]:
                if name == CEILING:
                    rounds[name].append(engine.ceiling("mixed", plan, plan["ceiling_sizes"])["audio_s_per_s"])
                    continue
                made, elapsed = asyncio.run(closed_loop(servers[name].base_url, mixed, clients, plan["round_s"],
                                                        100_000, VOICE))
                outcomes[name] += made
                seconds[name] += elapsed
                rounds[name].append(summarize(made, elapsed)["audio_s_per_s"])
            print(f"round {number + 1}: " + ", ".join(f"{name} {values[-1]} audio-s/s" for name, values in
                                                       rounds.items()), flush=True)
        engines = httpx.get(f"{servers['chorus'].base_url}/api/v1/batch/status").json()["engines"]
        chorus_engine = {name: {key: state.get(key) for key in ("instances", "instance_item_s", "policy")}
                         for name, state in engines.items()}
        print(f"Chorus's engine: {json.dumps(chorus_engine)}", flush=True)
    finally:
        for server in servers.values():
            server.stop()
        engine.close()
    served = {name: summarize(outcomes[name], seconds[name]) for name in servers}
    ratios = {"chorus_vs_kokoro_fastapi": _paired(rounds["chorus"], rounds.get(PEER)),
              "short_p95_vs_kokoro_fastapi": _ratio(served["chorus"]["short_p95_ms"],
                                                    served.get(PEER, {}).get("short_p95_ms")),
              "chorus_vs_ceiling": _paired(rounds["chorus"], rounds[CEILING])}
    verdicts = {name: "not measured" if ratios[name] is None else
                "met" if (ratios[name] >= bound if sense == ">=" else ratios[name] <= bound) else "missed"
                for name, (sense, bound) in targets.items()}
    results = {"plan": plan, "clients": clients, "voice": VOICE, "model": str(model), "chorus_engine": chorus_engine,
               "peer": {"source": source, "commit": KOKORO_FASTAPI_COMMIT} if source else None,
               "rounds": rounds, "served": served, "ratios": ratios, "targets": targets, "verdicts": verdicts}
    out.mkdir(parents=True, exist_ok=True)
    (out / "kokoro.json").write_text(json.dumps(results, indent=2))
    _print(results)
    return results


def _paired(ours: list[float], theirs: list[float] | None) -> float | None:
    pairs = [a / b for a, b in zip(ours, theirs or [], strict=False) if a and b]
    return round(statistics.median(pairs), 3) if pairs else None


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return round(ours / theirs, 3) if ours and theirs else None


def _print(results: dict) -> None:
    print(f"\n{'server':16s} {'req/s':>7s} {'audio s/s':>9s} {'p50 ms':>8s} {'p95 ms':>8s} {'short p95':>9s} errors")
    for name, row in results["served"].items():
        print(f"{name:16s} {row['requests_per_s']:7.2f} {row['audio_s_per_s']:9.2f} {row['p50_ms'] or 0:8.0f} "
              f"{row['p95_ms'] or 0:8.0f} {row['short_p95_ms'] or 0:9.0f} {row['errors']}")
    print("audio-s/s by round: " + "; ".join(f"{name} {values}" for name, values in results["rounds"].items()))
    for name, ratio in results["ratios"].items():
        sense, bound = results["targets"].get(name, ("", ""))
        print(f"  {name:28s} measured {ratio!s:>8s}   " + (f"target {sense} {bound}  {results['verdicts'][name]}"
                                                            if name in results["targets"] else "(no target)"))
