"""Admission's overload reading, replayed: the server's own RequestQueue on a simulated clock, under
open-loop traffic shaped like the soak's (bench/soak.py), many times over in seconds.

    python -m bench.overload_replay [--runs 300] [--load 0.7] [--windows 0.5:1,5:1.5 ...]

Each run: PHASE_S at `load` of the engine's capacity, the soak's OVERLOAD_S at its 3x, PHASE_S at `load`
again; Poisson arrivals of the soak's texts (one sentence of 20 to 200 characters) from its USERS
callers, each queued as one piece with the server's default wait targets; an engine that runs one piece
at a time for its predicted cost (Piper on a CPU, where batching gains nothing), a sentence costing
its characters / CHARS_PER_ENGINE_S. Printed per set of offered windows (the server's, then each
--windows): the 503s of the normal-load phases (none is wanted; those sent within the soak's EDGE_S of
the overload's end apart, and those in the 3 s after it), the runs with any, how soon the overload's
first 503 came, and the accepted requests' predicted wait p95 within the overload.

It reads the detector's statistics, not the server's speed: HTTP, tokenizing, the cost model's error
and batching are left out, and the soak's streams are plain pieces here. Its normal load is burstier
than a real server's (the soak's runs refuse less often): compare windows with it, then confirm with
the soak.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from dataclasses import dataclass

import numpy as np

from bench.load import percentile
from bench.soak import EDGE_S, OVERLOAD, OVERLOAD_S, STEADY, USERS
from bench.workload import MIXES, sentence
from tts_core.engines.contract import EngineInput
from tts_core.request.operating import OperatorSettings
from tts_core.scheduler.clock import FakeClock
from tts_core.scheduler.queue import LONG_TOKENS, OFFERED_WINDOWS_S, QueueFull, RequestQueue, WaitTarget
from tts_core.scheduler.records import QueuedItem

PHASE_S = 60.0
CHARS_PER_ENGINE_S = 180.0  # Piper on the soak's slower 2-core machine, ~15 characters a second of speech
TOKENS_PER_CHAR = LONG_TOKENS / 180  # Piper's phoneme ids (see tts_core.scheduler.queue.LONG_TOKENS)
TAIL_S = 3.0  # "just after the overload": its long window still reads it


@dataclass
class Run:
    refused_normal: list[float]  # sent in the normal-load phases: seconds after the overload's end (< 0: before)
    refused_overload: int
    first_refusal_s: float  # after the overload began
    overload_wait_p95_s: float


def replay(seed: int, windows: dict[float, float], load: float = STEADY, phase_s: float = PHASE_S) -> Run:
    rng = random.Random(seed)
    clock = FakeClock(start=0.0)
    settings = OperatorSettings()
    target = WaitTarget(settings.queue_wait_target_s, settings.overload_wait_target_s)
    queue = RequestQueue(512, clock=clock, offered_windows=windows)
    low, high = MIXES["mixed"]
    mean_cost_s = (low + high) / 2 / CHARS_PER_ENGINE_S
    phases = [(phase_s, load), (OVERLOAD_S, OVERLOAD), (phase_s, load)]
    arrivals, start = [], 0.0
    for length_s, share in phases:
        moment = start + rng.expovariate(share / mean_cost_s)
        while moment < start + length_s:
            arrivals.append(moment)
            moment += rng.expovariate(share / mean_cost_s)
        start += length_s
    overload_start, overload_end = phase_s, phase_s + OVERLOAD_S
    running, free_at, refused, overload_waits = 0, math.inf, [], []
    for arrival in arrivals:
        while running and free_at <= arrival:  # the engine's pieces end before this one arrives
            clock.advance_to(free_at)
            queue.done(running)
            running, free_at = _run_next(queue, clock)
        clock.advance_to(arrival)
        text = sentence(rng, low, high)
        tokens = np.zeros(round(len(text) * TOKENS_PER_CHAR), dtype=np.int64)
        piece = QueuedItem(EngineInput(tokens, ""), key=None, deadline=math.inf, caller=f"ip:{rng.randrange(USERS)}",
                           cost_s=len(text) / CHARS_PER_ENGINE_S)
        try:
            wait = queue.put_many([piece], target=target)
            if overload_start <= arrival < overload_end:
                overload_waits.append(wait)
        except QueueFull:
            refused.append(arrival)
        if not running:
            running, free_at = _run_next(queue, clock)
    in_overload = [moment for moment in refused if overload_start <= moment < overload_end]
    return Run(refused_normal=[moment - overload_end for moment in refused
                               if not overload_start <= moment < overload_end],
               refused_overload=len(in_overload),
               first_refusal_s=min(in_overload, default=math.inf) - overload_start,
               overload_wait_p95_s=percentile(overload_waits, 0.95) or 0.0)


def _run_next(queue: RequestQueue, clock: FakeClock) -> tuple[int, float]:
    piece = queue.next_candidates(1)
    if not piece:
        return 0, math.inf
    queue.take(piece, piece[0].cost_s)
    return 1, clock.now() + piece[0].cost_s


def summary(windows: dict[float, float], runs: int, load: float) -> dict:
    results = [replay(seed, windows, load) for seed in range(runs)]
    outside = [[moment for moment in run.refused_normal if not 0 <= moment < EDGE_S] for run in results]
    normal = [moment for run in results for moment in run.refused_normal]
    return {"windows": windows, "runs": runs, "load": load,
            "refused_normal": sum(map(len, outside)),
            "refused_at_edge": sum(1 for moment in normal if 0 <= moment < EDGE_S),
            "refused_in_tail": sum(1 for moment in normal if EDGE_S <= moment < TAIL_S),
            "runs_with_refusals": sum(1 for moments in outside if moments),
            "refused_in_overload": sum(run.refused_overload for run in results),
            "first_refusal_s": statistics.median(run.first_refusal_s for run in results),
            "overload_wait_p95_s": statistics.median(run.overload_wait_p95_s for run in results)}


def describe(result: dict) -> str:
    windows = ", ".join(f"{window:g} s x{factor:g}" for window, factor in result["windows"].items())
    return (f"windows {windows}: 503s at {result['load']:.0%} load {result['refused_normal']} "
            f"({result['refused_in_tail']} in the {TAIL_S:g} s after the overload, "
            f"{result['refused_at_edge']} more within {EDGE_S:g} s of its end), in "
            f"{result['runs_with_refusals']} of {result['runs']} runs; in the overload "
            f"{result['refused_in_overload']}, the first after {result['first_refusal_s']:.2f} s (median), "
            f"accepted wait p95 {result['overload_wait_p95_s']:.1f} s (median)")


def parse_windows(text: str) -> dict[float, float]:
    """"0.5:1,5:1.5" -> {0.5: 1.0, 5.0: 1.5}"""
    try:
        return {float(window): float(factor) for window, factor in (pair.split(":") for pair in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(f"windows are SECONDS:FACTOR,...; got {text!r}") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.overload_replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--load", type=float, default=STEADY, help="the normal phases' load (share of capacity)")
    parser.add_argument("--windows", type=parse_windows, action="append", default=[],
                        help="offered windows to try beside the server's, SECONDS:FACTOR,... (repeatable)")
    args = parser.parse_args(argv)
    for windows in [OFFERED_WINDOWS_S, *args.windows]:
        print(describe(summary(windows, args.runs, args.load)), flush=True)


if __name__ == "__main__":
    main()
