"""Chorus in front of an upstream, against the same clients sent straight to the upstream.

    python -m bench --upstream [--quick] [--voice pocket-random] [--out FOLDER]

Two servers on 127.0.0.1: the upstream, a Chorus serving the voice as vLLM-Omni serves its models (continuous
batching, requests in arrival order), and the front, a Chorus whose registry names that voice as
`engine: upstream` on it. The same closed loop (the plan's clients and texts, each client its own caller)
goes straight to the upstream and through the front, in alternating rounds, so that drift over the run shifts
both alike. Then an overload: Poisson arrivals at OVERLOAD_FACTOR times the straight loop's request rate,
offered to the front; the front should refuse what it cannot serve at once (503 with Retry-After) and keep the
upstream at its best.

How much the upstream makes is read from its own `/metrics` while the clients send (frames of its stepped
engine, else the audio it answered with): a round's clients' audio a second also counts the round's end, while
the requests in flight finish with fewer and fewer left, and how long that takes depends on the order they are
served in, not on how full the upstream is kept.

Ratios, each against the straight runs of the same run:
- throughput_vs_straight: what the upstream makes a second while the clients send through the front, over
  straight (target >= 0.95); clients_audio_vs_straight: the clients' audio a second, the same way (no target);
- short_p95_vs_straight: short requests' p95 latency through the front over straight (target <= 0.5);
- overload_upstream_vs_best: what the upstream makes a second during the overload over its best straight round
  (target >= 0.95); and overload_refusals_p95_s: how long a refusal took (p95).
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import tempfile
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import httpx

from bench.harness import OPERATOR
from bench.load import closed_loop, open_loop, percentile, summarize
from bench.server import ServerProcess, start_server
from bench.workload import texts

T = TypeVar("T")
# The quick plan is a smoke run of every phase (tests/integration/test_bench.py) that must get answers through on a
# loaded two-core machine: 4 clients of short texts (20-50 characters), not 16 of the mixed ones. There the mixed
# texts' requests took minutes each (177 s straight, with the machine's load at 13): the upstream's went past its
# deadline (504), the front refused nearly all of its own at once (503: the predicted wait past what can be served
# in time, its callers sending again at once), and the overload offered three times a rate of almost nothing (no
# request arrived in its 10 s). Its rounds last 5 s, which still gets each client an answer; its overload keeps 10 s:
# its first arrival (the seeded Poisson draw) comes 1.9 / rate seconds in, the rate 3x the rounds' requests a second.
# Its upstream runs torch on one thread, as the dialogue benchmark's tiny model does: with two on two busy cores the
# tiny model's millisecond steps stall (4 short requests took 85-125 s each with the machine's load at 15).
# The full plan is unchanged.
PLANS = {"full": {"rounds": 3, "round_s": 60.0, "overload_s": 60.0, "texts": 64, "clients": 16, "workload": "mixed",
                  "upstream_server": {}},
         "quick": {"rounds": 1, "round_s": 5.0, "overload_s": 10.0, "texts": 8, "clients": 4, "workload": "short",
                   "upstream_server": {"torch_threads": "1"}}}
OVERLOAD_FACTOR = 3.0
TARGETS = {"throughput_vs_straight": (">=", 0.95), "short_p95_vs_straight": ("<=", 0.5),
           "overload_upstream_vs_best": (">=", 0.95)}
SERVER = {"trusted_proxies": "127.0.0.1", "max_queue": "4096", "calibration_sizes": "1,2"}
# A server's start (the model's load and calibration) may take minutes on a loaded two-core machine: a wait, not a
# measure (the default 180 s ran out there with the machine's load at 15)
READY_S = 600.0
UPSTREAM = {"queue_order": "fifo"}  # as vLLM's scheduler: first come, first served
# The rounds compare serving, as the peer benchmark does: no cache, no degrade mode, no refusal by predicted wait.
MEASURED = json.dumps(OPERATOR)
# The overload meets the front as it comes (its wait targets refuse what cannot be served in time), without the cache
GUARDED = json.dumps({"anonymous_tier": "enterprise", "cache_enabled": False, "degrade_enabled": False})


def front_registry(folder: Path, upstream: str, voice: str) -> tuple[Path, str]:
    """The front's registry (the voice, on the upstream, under the model the upstream lists it with) and that
    model's name."""
    listed = httpx.get(f"{upstream}/v1/audio/voices").json()["data"]
    model = next(entry["model"] for entry in listed if entry["id"] == voice)
    path = folder / "front.yaml"
    path.write_text(f"voices:\n  {voice}: {{engine: upstream, model: {model}, url: '{upstream}', "
                    f"upstream_voice: {voice}, max_in_flight: 64, pinned: true}}\n")
    return path, model


def made(server: ServerProcess) -> float:
    """What the server's engines have made: tts_frames_total (its stepped engines' frames, counted at each step),
    else tts_audio_seconds_total (the audio it has answered with, counted as answers go out)."""
    text = httpx.get(f"{server.base_url}/metrics").text
    frames = [float(value) for value in re.findall(r"^tts_frames_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)]
    audio = re.search(r"^tts_audio_seconds_total ([0-9.e+]+)$", text, re.M)
    return sum(frames) if frames else float(audio.group(1)) if audio else 0.0


async def made_while(upstream: ServerProcess, load: Awaitable[T], seconds: float) -> tuple[T, float]:
    """The load's result, and what the upstream made a second over its first `seconds` (while it sends)."""
    async def measure() -> float:
        before = await asyncio.to_thread(made, upstream)
        await asyncio.sleep(seconds)
        return (await asyncio.to_thread(made, upstream) - before) / seconds

    measuring = asyncio.create_task(measure())
    result = await load
    return result, await measuring


def run(quick: bool, out: Path, voice: str, voices_file: Path | None) -> dict:
    plan = PLANS["quick" if quick else "full"]
    folder = Path(tempfile.mkdtemp(prefix="chorus-upstream-bench-"))
    sent = texts(plan["workload"], plan["texts"], seed=7)
    print("starting the upstream, then the front ...", flush=True)
    upstream = start_server(folder / "upstream", READY_S, operator_defaults=MEASURED, **SERVER, **UPSTREAM,
                            **plan["upstream_server"], **({"voices_file": str(voices_file)} if voices_file else {}))
    registry, model = front_registry(folder, upstream.base_url, voice)
    front = start_server(folder / "front", READY_S, voices_file=str(registry), operator_defaults=MEASURED, **SERVER)
    try:
        rounds: dict[str, list[dict]] = {"straight": [], "front": []}
        for number in range(plan["rounds"]):
            for name, server in (("straight", upstream), ("front", front))[:: 1 if number % 2 == 0 else -1]:
                (outcomes, elapsed), upstream_rate = asyncio.run(made_while(upstream, closed_loop(
                    server.base_url, sent, plan["clients"], plan["round_s"], 100_000, voice), plan["round_s"]))
                rounds[name].append({**summarize(outcomes, elapsed), "upstream_made_per_s": round(upstream_rate, 3)})
                print(f"round {number + 1} {name:8s} upstream made {upstream_rate:7.2f}/s, clients "
                      f"{rounds[name][-1]['audio_s_per_s']:6.2f} audio-s/s, short p95 "
                      f"{rounds[name][-1]['short_p95_ms']} ms, errors {rounds[name][-1]['errors']}", flush=True)
        best = max(row["upstream_made_per_s"] for row in rounds["straight"])
        rate = OVERLOAD_FACTOR * max(row["requests_per_s"] for row in rounds["straight"])
        learned = _policy(front, model)  # what the rounds' front learned
        front.stop()  # the overload meets a front with its wait targets in force (a new one: it learns again)
        front = start_server(folder / "guarded", READY_S, voices_file=str(registry), operator_defaults=GUARDED,
                             **SERVER)
        # it learns its limit at the straight loop's rate first (open loop: refused clients do not spin)
        asyncio.run(open_loop(front.base_url, sent, rate / OVERLOAD_FACTOR, plan["round_s"] / 2, 100_000,
                              drain_s=120.0, voice=voice))
        print(f"overload: {rate:.2f} requests/s offered to the front for {plan['overload_s']:g} s ...", flush=True)
        (outcomes, elapsed, _), upstream_rate = asyncio.run(made_while(upstream, open_loop(
            front.base_url, sent, rate, plan["overload_s"], 100_000, drain_s=120.0, voice=voice), plan["overload_s"]))
        status = _policy(front, model)
    finally:
        front.stop()
        upstream.stop()
    refusals = [outcome.latency_s for outcome in outcomes if outcome.status == 503]
    overload = {**summarize(outcomes, elapsed), "offered_per_s": round(rate, 3), "refused": len(refusals),
                "refusals_p95_s": None if not refusals else round(percentile(refusals, 0.95), 3),
                "upstream_made_per_s": round(upstream_rate, 3)}
    ratios = {"throughput_vs_straight": _paired(rounds, "upstream_made_per_s"),
              "clients_audio_vs_straight": _paired(rounds, "audio_s_per_s"),
              "short_p95_vs_straight": _paired(rounds, "short_p95_ms"),
              "overload_upstream_vs_best": round(upstream_rate / best, 3) if best else None}
    verdicts = {name: None if ratios[name] is None else
                ("met" if (ratios[name] >= bound if sense == ">=" else ratios[name] <= bound) else "missed")
                for name, (sense, bound) in TARGETS.items()}
    results = {"plan": plan, "clients": plan["clients"], "voice": voice, "rounds": rounds, "overload": overload,
               "best": best, "front_policy_rounds": learned, "front_policy": status, "ratios": ratios,
               "targets": TARGETS, "verdicts": verdicts}
    out.mkdir(parents=True, exist_ok=True)
    (out / "upstream.json").write_text(json.dumps(results, indent=2))
    _print(results)
    return results


def _policy(server: ServerProcess, model: str) -> dict:
    return httpx.get(f"{server.base_url}/api/v1/batch/status").json()["engines"][model]["policy"]


def _paired(rounds: dict[str, list[dict]], figure: str) -> float | None:
    """The median over rounds of front / straight (each round's pair ran back to back)."""
    pairs = [front[figure] / straight[figure] for straight, front in zip(rounds["straight"], rounds["front"])
             if front[figure] is not None and straight[figure]]
    return round(statistics.median(pairs), 3) if pairs else None


def _print(results: dict) -> None:
    overload = results["overload"]
    print(f"\noverload: {overload['offered_per_s']} requests/s offered, {overload['ok']} served, "
          f"{overload['refused']} refused (p95 {overload['refusals_p95_s']} s), other errors {overload['errors']}; "
          f"the upstream made {overload['upstream_made_per_s']}/s (its best straight round: {results['best']}/s)")
    for what, policy in (("rounds", results["front_policy_rounds"]), ("overload", results["front_policy"])):
        print(f"the {what}' front's learned limit: {policy['limit']} (settled {policy['settled']}; audio-s/s by count "
              f"in flight: {policy['audio_s_per_s']})")
    for name, ratio in results["ratios"].items():
        sense, bound = TARGETS.get(name, ("", ""))
        print(f"  {name:28s} measured {ratio!s:>8s}   " + (f"target {sense} {bound}  {results['verdicts'][name]}"
                                                            if name in TARGETS else "(no target)"))
