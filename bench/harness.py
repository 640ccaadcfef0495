"""The batcher against its peers, side by side in one run: `python -m bench [--quick] [--docs]`; with the bundled
voice, its lower precision after them (bench/precision.py).

Every peer is the same server (a separate process on 127.0.0.1) with the same engine; only the
batching policy and the queue order differ. All peers' servers are up at once and each scenario
runs on each peer in turn, so drift over the run affects them alike:

  sequential  one request at a time, first come first served (Kokoro-FastAPI, openedai-speech)
  static      batches of 8, 500 ms timeout, FIFO (the usual config-file baseline)
  window      batches of up to 16, 10 ms wait, FIFO (Ray Serve @serve.batch, Triton max_queue_delay)
  chorus      the adaptive policy and the fair queue: the real server configuration

and the engine ceiling: the same texts run in this process, in the best length-sorted batches,
with no server at all (for the mixed workload, in every round too). Degrade mode and the audio
cache are off for every peer (they would measure something else than batching); the anonymous
caller is unlimited.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench.load import closed_loop, open_loop, summarize
from bench.precision import print_results as print_precision
from bench.precision import run as precision_benchmark
from bench.report import LOWER_IS_BETTER, write_docs, write_html
from bench.server import ROOT, ServerProcess, start_ray_peer, start_server
from bench.soak import main as soak
from bench.ttfa import drained
from bench.workload import texts
from tts_core.config import Settings
from tts_core.engines.contract import EngineInput
from tts_core.scheduler.one_shot import INSTANCES_MARGIN
from tts_core.scheduler.strategies import synthesize_batch
from tts_core.voices.registry import load_voice_engine

PEERS = {
    "sequential": {"batch_policy": "sequential", "queue_order": "fifo"},
    "static": {"batch_policy": "static", "queue_order": "fifo"},
    "window": {"batch_policy": "window", "queue_order": "fifo"},
    "chorus": {"batch_policy": "adaptive", "queue_order": "fair"},
}
PLANS = {
    "full": {"workloads": ["short", "mixed", "long", "realistic"], "texts": 32, "closed_s": 25.0, "clients": 8,
             "open_fractions": [0.3, 0.6, 0.9, 1.2], "open_s": 15.0, "streams": 4, "stream_s": 20.0,
             "stream_workload": "realistic", "idle_requests": 30, "max_requests": 5000,
             "ceiling_sizes": [1, 4, 16], "rounds": 3, "calibration_sizes": "1,2,4,8,16", "own_control": True},
    # a smoke run of every part (tests/integration/test_bench.py): the least load that still makes each figure, two
    # rounds (the ratios' ranges), and the A/A control's turns on the sequential server itself (one server less)
    "quick": {"workloads": ["mixed"], "texts": 4, "closed_s": 1.0, "clients": 2, "open_fractions": [0.5, 1.2],
              "open_s": 1.0, "streams": 2, "stream_s": 1.0, "stream_workload": "mixed", "idle_requests": 1,
              "max_requests": 400, "ceiling_sizes": [1, 4], "rounds": 2, "calibration_sizes": "1,2",
              "own_control": False},
}
BUNDLED_VOICE = "en_US-joe-medium"
RAY_PEER = "ray-serve"  # the external peer, run when Ray is installed (bench/ray_peer.py)
CONTROL = "sequential-again"  # a second sequential server: the A/A control of the mixed rounds
CEILING = "engine ceiling"  # the engine alone, in this process, taking its turn in the mixed rounds
CPU_TARGETS = {"chorus_vs_sequential": 1.0, "chorus_vs_static": 1.1, "chorus_vs_ceiling": 0.9,
               "short_p95_vs_sequential": 0.5, "idle_ms_over_raw": 10.0}
COPIES_TARGET = 1.2  # chorus_vs_sequential on a CPU where copies of the model pay (the engine alone measures them)
GPU_TARGETS = {"chorus_vs_static": 1.4, "chorus_vs_ceiling": 0.8}
# An autoregressive voice (a stepped engine), continuous batching against request-level batches: the mixed
# closed loop with 16 clients; time to first audio of a stream that starts while 7 others run (a closed loop
# of 8 streams, each client's first request left out: those 8 start at the same instant, and the last of them
# waits for 8 prefills, which on a CPU cost 8 times one) against one stream's at idle. The 8 opening streams'
# first audio is printed beside it.
STEPPED_TARGETS = {"chorus_vs_sequential": 2.0, "chorus_vs_static": 1.6, "chorus_vs_ceiling": 1.2,
                   "first_audio_p95_vs_idle_p50": 1.5, "short_p95_vs_static": 0.5}
STEPPED_PLAN = {"workloads": ["mixed"], "clients": 16, "streams": 8, "stream_workload": "mixed",
                "ceiling_sizes": [8, 16], "idle_requests": 12}  # (a request takes seconds, not a fraction of one)
# The full plan's, for such a voice. A request of it takes many seconds under that load: in closed-loop rounds of
# 25 s, every client made two requests, all 16 had started at the same instant, and a round measured that opening
# burst and the drain after it rather than the loop (docs/benchmarks-history.md#an-autoregressive-voice). The
# streams' 60 s make about 40 that start while others run.
STEPPED_FULL_PLAN = {"closed_s": 90.0, "stream_s": 60.0}
# Voices the benchmark builds itself (random weights, no download): name -> (engine kind, size for its builder)
BUILT_VOICES = {"pocket-random": ("pocket_tts", "default"), "pocket-tiny": ("pocket_tts", "tiny"),
                "vibevoice-tiny": ("vibevoice", "tiny")}
# Degrade mode, the cache and admission by predicted wait (the longest target allowed) are off: the
# peers differ in batching and queue order only.
OPERATOR = {"anonymous_tier": "enterprise", "degrade_enabled": False, "cache_enabled": False,
            "queue_wait_target_s": 3600, "overload_wait_target_s": 3600}


# --- the engine alone ------------------------------------------------------------------------------

class EngineAlone:
    """The voice's engine in this process: no server, queue, HTTP or encoding. Like a server's engine, it
    loads and runs on one thread of its own: torch work on a second thread of the process would start a
    second OpenMP team, and with two teams on the cores libgomp stops its workers spinning between
    parallel regions, so that every step pays to wake them: two OpenMP teams in one process slow each
    other's steps, and the ceiling would read below the server it is the ceiling of."""

    def __init__(self, voice: str, voices_file: Path | None):
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-alone")
        settings = Settings(voices_file=voices_file, voice_aliases={}, model_aliases={})
        self.voice, self.engine = voice, self._on_its_thread(load_voice_engine, settings, voice)
        self.max_batch_tokens = settings.max_batch_tokens
        self.speak("Warm up the engine first.")

    def _on_its_thread(self, work: Callable, *args):
        return self._thread.submit(work, *args).result()

    def close(self) -> None:
        self._thread.shutdown()

    def _run_batch(self, token_lists: list) -> float:
        """Synthesizes one batch (on the engine's thread); returns its audio seconds."""
        inputs = [EngineInput(tokens, self.voice) for tokens in token_lists]
        return sum(output.audio.size for output in synthesize_batch(self.engine, inputs)) / self.engine.sample_rate

    def _runs(self, token_lists: list, size: int) -> list[list]:
        if not self.engine.capabilities.makes_frames:  # one-shot: padded batches of this size
            return _batches(token_lists, size, self.max_batch_tokens)
        self.engine.max_running = size  # (at most the engine's own: its cache has that many rows)
        return [token_lists]

    def speak(self, text: str) -> float:
        """One text as a server would run it one item at a time (front end included)."""
        return self._on_its_thread(self._speak, text)

    def _speak(self, text: str) -> float:
        return sum(self._run_batch([tokens]) for tokens in self.engine.tokenize(text, self.voice))

    def ceiling(self, workload: str, plan: dict, sizes: list[int]) -> dict:
        """The same texts the served peers get, sorted by length and run in the best of `sizes`:
        the most this engine can do on this machine. For a stepped engine a size is how many run at
        once: all the texts go through one continuous run (each joins as soon as a place is free)."""
        return self._on_its_thread(self._ceiling, workload, plan, sizes)

    def _ceiling(self, workload: str, plan: dict, sizes: list[int]) -> dict:
        batch = texts(workload, plan["texts"])
        started = time.perf_counter()
        token_lists = sorted((tokens for text in batch for tokens in self.engine.tokenize(text, self.voice)), key=len)
        front_end_s = time.perf_counter() - started
        best = None
        for size in sizes:
            started = time.perf_counter()
            audio = sum(self._run_batch(batch) for batch in self._runs(token_lists, size))
            seconds = time.perf_counter() - started + front_end_s
            if best is None or audio / seconds > best["audio_s_per_s"]:
                best = {"batch_size": size, "audio_s_per_s": round(audio / seconds, 3),
                        "requests_per_s": round(len(batch) / seconds, 3)}
        return best


    def copies(self, workload: str, plan: dict) -> dict:
        """A one-shot engine that can run several copies of its model (tts_core.engines.instances): the same texts,
        length-sorted, in batches of as many items as copies (each copy making one item at a time, as a served
        batch is split between them), at each count it can run, in alternating order over plan["rounds"] rounds.
        Returns each count's audio-s/s by round and `best_vs_one`, the best count's median ratio over one copy's
        round by round; leaves the engine with one copy, as the servers run it by default (TTS_ENGINE_INSTANCES):
        copies that pay here did not pay served (docs/benchmarking.md#copies-of-a-model)."""
        return self._on_its_thread(self._copies, workload, plan)

    def _copies(self, workload: str, plan: dict) -> dict:
        counts = self.engine.instance_counts()
        if self.engine.capabilities.makes_frames or len(counts) == 1:
            return {}
        token_lists = sorted((tokens for text in texts(workload, plan["texts"])
                              for tokens in self.engine.tokenize(text, self.voice)), key=len)
        rounds: dict[int, list[float]] = {count: [] for count in counts}
        for number in range(plan["rounds"]):
            for count in counts if number % 2 == 0 else counts[::-1]:
                self.engine.use_instances(count)
                batches = _batches(token_lists, count, self.max_batch_tokens)
                self._run_batch(batches[-1])  # untimed: the new sessions' first run
                started = time.perf_counter()
                audio = sum(self._run_batch(batch) for batch in batches)
                rounds[count].append(round(audio / (time.perf_counter() - started), 3))
        ratios = {count: statistics.median(a / b for a, b in zip(values, rounds[1]))
                  for count, values in rounds.items()}
        best = max(ratios, key=ratios.get)
        self.engine.use_instances(1)
        return {"audio_s_per_s": rounds, "best": best, "best_vs_one": round(ratios[best], 3),
                "pays_alone": ratios[best] >= INSTANCES_MARGIN}


def idle_latencies(engine: EngineAlone, servers: dict[str, str], plan: dict, voice: str) -> dict[str, dict]:
    """One short request at a time: the engine alone and every server, text by text in turn, so that
    they are measured side by side under the same conditions. Per server: its p50 ms, and its
    overhead, the median over the texts of (server - engine) on the same text moments apart (paired:
    the machine's drift over the run cancels out)."""
    timings: dict[str, list[float]] = {"engine": [], **{name: [] for name in servers}}
    clients = {name: httpx.Client(base_url=url, timeout=120) for name, url in servers.items()}
    try:
        for text in texts("short", plan["idle_requests"], seed=99):
            started = time.perf_counter()
            engine.speak(text)
            timings["engine"].append(time.perf_counter() - started)
            for name, client in clients.items():
                started = time.perf_counter()
                client.post("/v1/audio/speech", json={"model": "tts-1", "voice": voice, "input": text,
                                                      "response_format": "pcm"}).raise_for_status()
                timings[name].append(time.perf_counter() - started)
    finally:
        for client in clients.values():
            client.close()

    alone = timings.pop("engine")
    return {"engine": {"idle_p50_ms": _ms(statistics.median(alone))},
            **{name: {"idle_p50_ms": _ms(statistics.median(served)),
                      "idle_overhead_ms": _ms(statistics.median(s - a for s, a in zip(served, alone)))}
               for name, served in timings.items()}}


def idle_first_audio(servers: dict[str, str], plan: dict, voice: str) -> dict[str, float]:
    """Each server's time to first audio of one stream at a time (mixed texts, text by text in turn):
    p50 ms, what a stream gets from an idle server (each stream, cut off at its first audio, is let
    finish on its server before the next is sent, to that server or another)."""
    firsts: dict[str, list[float]] = {name: [] for name in servers}
    clients = {name: httpx.Client(base_url=url, timeout=300) for name, url in servers.items()}
    try:
        for text in texts("mixed", plan["idle_requests"], seed=98):
            for name, client in clients.items():
                body = {"model": "tts-1", "voice": voice, "input": text, "response_format": "pcm", "stream": True}
                started = time.perf_counter()
                with client.stream("POST", "/v1/audio/speech", json=body) as response:
                    response.raise_for_status()
                    for chunk in response.iter_bytes():
                        if chunk and len(firsts[name]) < plan["idle_requests"]:
                            firsts[name].append(time.perf_counter() - started)
                            break
                drained(client)
    finally:
        for client in clients.values():
            client.close()
    return {name: _ms(statistics.median(values)) for name, values in firsts.items() if values}


def built_voice(voice: str, out: Path) -> Path:
    """A registry file for one of BUILT_VOICES (its model: built_model); random weights never end speech, so its
    length is fixed by the model's own budget rule for the text (`fixed_length`)."""
    kind, _ = BUILT_VOICES[voice]
    registry = out / "voices.yaml"
    registry.write_text(f"voices:\n  {voice}: {{engine: {kind}, model: '{built_model(voice)}', fixed_length: true, "
                        "pinned: true}\n")
    return registry


def built_model(voice: str) -> Path:
    """The folder of one of BUILT_VOICES' random models, made once and kept in ~/.cache/chorus (for this transformers
    version). It is built beside that folder and moved in whole, so that benchmarks run at once (the suite's workers)
    never read a half-written model. (Torch and transformers are imported to build it only: a model already built
    costs no import, seconds on a busy machine.)"""
    kind, size = BUILT_VOICES[voice]
    transformers = importlib.metadata.version("transformers")
    folder = Path.home() / ".cache" / "chorus" / f"bench-{voice}-transformers-{transformers}"
    if not (folder / "config.json").exists():
        from bench.random_model import save_random_pocket
        from bench.random_vibevoice import save_random_vibevoice

        print(f"building the random-weight model of {voice} in {folder} ...", flush=True)
        building = folder.with_name(f"{folder.name}.building-{os.getpid()}")
        shutil.rmtree(building, ignore_errors=True)
        if kind == "vibevoice":
            save_random_vibevoice(building, size=size, seed=0)
        else:
            save_random_pocket(building, tiny=size == "tiny", seed=0)
        try:
            building.rename(folder)
        except OSError:  # another run moved its own in first
            shutil.rmtree(building)
            if not (folder / "config.json").exists():
                raise
    return folder


def _ms(seconds: float) -> float:
    return round(1000 * seconds, 1)


def _batches(token_lists: list, size: int, max_tokens: int) -> list[list]:
    """Consecutive batches of up to size items whose padded tokens stay within the server's budget."""
    batches: list[list] = []
    for tokens in token_lists:
        last = batches[-1] if batches else None
        if last and len(last) < size and (len(last) + 1) * max(len(tokens), *map(len, last)) <= max_tokens:
            last.append(tokens)
        else:
            batches.append([tokens])
    return batches


# --- the server side ---------------------------------------------------------------------------------

_SAMPLE = re.compile(r'^(tts_\w+?)(?:\{(.*)\})? (\S+)$')


def scrape(base_url: str) -> dict:
    """The server's counters that the report needs: batch sizes, tokens, padding, GPU use."""
    response = httpx.get(f"{base_url}/metrics", timeout=10)
    response.raise_for_status()
    text = response.text
    buckets: dict[str, float] = {}
    totals = {"tokens": 0.0, "padding": 0.0, "items": 0.0, "batches": 0.0, "gpu_utilization": None}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, labels, value = match.group(1), match.group(2) or "", float(match.group(3))
        if name == "tts_batch_size_bucket":
            bound = re.search(r'le="([^"]+)"', labels).group(1)
            buckets[bound] = buckets.get(bound, 0.0) + value
        elif name == "tts_batch_size_sum":
            totals["items"] += value
        elif name == "tts_batch_size_count":
            totals["batches"] += value
        elif name == "tts_tokens_total":
            totals["tokens"] += value
        elif name == "tts_padding_tokens_total":
            totals["padding"] += value
        elif name == "tts_gpu_utilization_percent":
            totals["gpu_utilization"] = value
    return {"batch_size_buckets": buckets, **totals}


def server_delta(before: dict, after: dict) -> dict:
    """Batch sizes (count per size range) and padding waste between two scrapes."""
    cumulative = {bound: after["batch_size_buckets"].get(bound, 0) - before["batch_size_buckets"].get(bound, 0)
                  for bound in after["batch_size_buckets"]}
    bounds = sorted((bound for bound in cumulative if bound != "+Inf"), key=float) + ["+Inf"]
    distribution, previous = {}, 0.0
    for bound in bounds:
        distribution[bound] = round(cumulative.get(bound, 0) - previous)
        previous = cumulative.get(bound, 0)
    tokens = after["tokens"] - before["tokens"]
    padding = after["padding"] - before["padding"]
    batches = after["batches"] - before["batches"]
    return {"batches": round(batches), "batch_size_distribution": distribution,  # None: no batch ran
            "items_per_batch": round((after["items"] - before["items"]) / batches, 2) if batches else None,
            "padding_waste": round(padding / (tokens + padding), 4) if tokens + padding else None,
            "gpu_utilization_pct": after["gpu_utilization"]}


async def run_peers(servers: dict[str, str], control: str, ceiling: Callable[[], float], plan: dict,
                    rates: list[float], voice: str) -> dict:
    """Every scenario on every peer in turn (all servers up at once), so that a machine that
    drifts over the run (heat, other load) shifts all peers alike instead of the last ones.
    The mixed closed loop, which the throughput targets compare, runs plan["rounds"] times, each
    round in a rotated order, and also on `control`: a second server configured exactly like
    `sequential`, whose ratio to it shows how far two identical servers differ on this machine;
    `ceiling` (the engine alone on the mixed texts, audio-s/s) takes its turn in every round too."""
    results: dict = {name: {"closed": {}, "open": []} for name in servers}
    rounds: dict[str, list[float]] = {name: [] for name in [*servers, CONTROL, CEILING]}
    everyone = {**servers, CONTROL: control}
    mixed_outcomes: dict[str, list] = {name: [] for name in servers}  # every round's, for the short-request p95
    mixed_seconds = dict.fromkeys(servers, 0.0)

    async def saturate(name: str, workload: str) -> tuple[list, float]:
        outcomes, elapsed = await closed_loop(everyone[name], texts(workload, plan["texts"]), plan["clients"],
                                              plan["closed_s"], plan["max_requests"], voice)
        if workload == "mixed" and name in servers:
            mixed_outcomes[name] += outcomes
            mixed_seconds[name] += elapsed
        return outcomes, elapsed

    async def mixed_turn(name: str) -> float:
        if name == CEILING:
            return await asyncio.to_thread(ceiling)
        outcomes, elapsed = await saturate(name, "mixed")
        return summarize(outcomes, elapsed)["audio_s_per_s"]

    for workload in plan["workloads"]:
        for name, url in (everyone if workload == "mixed" else servers).items():
            before = await asyncio.to_thread(scrape, url)
            outcomes, elapsed = await saturate(name, workload)
            after = await asyncio.to_thread(scrape, url)
            row = {**summarize(outcomes, elapsed), "server": server_delta(before, after)}
            if workload == "mixed":
                rounds[name].append(row["audio_s_per_s"])
                print(f"  {name}: mixed {row['audio_s_per_s']} audio-s/s, p95 {row['p95_ms']} ms", flush=True)
            if name in servers:
                results[name]["closed"][workload] = row
        if workload == "mixed":
            rounds[CEILING].append(await mixed_turn(CEILING))
            print(f"  {CEILING}: mixed {rounds[CEILING][-1]} audio-s/s", flush=True)
    names = list(rounds)
    for round_index in range(1, plan["rounds"]):
        for name in names[round_index % len(names):] + names[: round_index % len(names)]:
            rounds[name].append(await mixed_turn(name))
        print(f"  round {round_index + 1}: " + ", ".join(f"{name} {values[-1]}" for name, values in rounds.items()),
              flush=True)
    for name in servers:
        results[name]["mixed_rounds"] = rounds[name]
        results[name]["mixed_all_rounds"] = summarize(mixed_outcomes[name], mixed_seconds[name])
    for rate in rates:
        for name, url in servers.items():
            outcomes, elapsed, completed = await open_loop(
                url, texts("mixed", plan["texts"], seed=1), rate, plan["open_s"], plan["max_requests"],
                drain_s=max(30.0, 2 * plan["open_s"]), voice=voice)
            results[name]["open"].append({"offered_per_s": round(rate, 3), "completed_per_s": completed,
                                          **summarize(outcomes, elapsed)})
    for name, url in servers.items():
        outcomes, elapsed = await closed_loop(url, texts(plan["stream_workload"], plan["texts"], seed=2),
                                              plan["streams"], plan["stream_s"], plan["max_requests"], voice,
                                              stream=True)
        results[name]["streams"] = summarize(outcomes, elapsed)
    return {"peers": results, "control_rounds": rounds[CONTROL], "ceiling_rounds": rounds[CEILING]}


# --- the run -----------------------------------------------------------------------------------------

def ratios(results: dict) -> tuple[dict, dict]:
    """The measured values of the targets, and for the throughput ratios their range over the
    rounds (each ratio is the median of the rounds' own ratios: peers in one round ran minutes apart,
    not the whole run apart)."""
    peers = results["peers"]
    rounds = {name: peer["mixed_rounds"] for name, peer in peers.items()}

    def per_round(a: list[float], b: list[float]) -> list[float]:
        return [x / y for x, y in zip(a, b) if x and y]

    throughput = {f"chorus_vs_{name}": per_round(rounds["chorus"], values)
                  for name, values in rounds.items() if name != "chorus"}
    throughput["chorus_vs_ceiling"] = per_round(rounds["chorus"], results["ceiling_rounds"])
    throughput["control_vs_sequential"] = per_round(results["control_rounds"], rounds["sequential"])
    measured = {name: round(statistics.median(values), 3) if values else None for name, values in throughput.items()}
    chorus, sequential = peers["chorus"]["mixed_all_rounds"], peers["sequential"]["mixed_all_rounds"]
    measured["short_p95_vs_sequential"] = (round(chorus["short_p95_ms"] / sequential["short_p95_ms"], 3)
                                           if chorus["short_p95_ms"] and sequential["short_p95_ms"] else None)
    measured["idle_ms_over_raw"] = peers["chorus"]["idle_overhead_ms"]
    static = peers["static"]["mixed_all_rounds"]
    measured["short_p95_vs_static"] = (round(chorus["short_p95_ms"] / static["short_p95_ms"], 3)
                                       if chorus["short_p95_ms"] and static["short_p95_ms"] else None)
    idle_first = peers["chorus"].get("idle_first_audio_p50_ms")
    loaded_first = peers["chorus"]["streams"]["first_audio_running_p95_ms"]
    measured["first_audio_p95_vs_idle_p50"] = (round(loaded_first / idle_first, 3)
                                               if idle_first and loaded_first else None)
    ranges = {name: [round(min(values), 3), round(max(values), 3)] for name, values in throughput.items() if values}
    if results["engine"].get("copies"):
        measured["copies_alone_vs_one"] = results["engine"]["copies"]["best_vs_one"]
    return measured, ranges


def verdicts(measured: dict, targets: dict) -> dict:
    out = {}
    for name, target in targets.items():
        value = measured.get(name)
        if value is None:
            out[name] = "not measured"
        else:
            met = value <= target if name in LOWER_IS_BETTER else value >= target
            out[name] = "met" if met else "MISSED"
    return out


def machine() -> dict:
    info = {"python": platform.python_version(), "platform": platform.platform(), "cpus": _cpu_count()}
    try:
        from tts_core.ops import gpu

        info["gpu"] = gpu.readings()
    except Exception:  # NVML missing is normal
        info["gpu"] = None
    return info


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _maybe(value: float | None, scale: float = 1.0) -> str:
    return "n/a" if value is None else f"{scale * value:.2f}"


def print_table(results: dict) -> None:
    print(f"\n{'peer':12s} {'workload':10s} {'req/s':>7s} {'audio s/s':>9s} {'p50 ms':>8s} {'p95 ms':>8s} "
          f"{'p99 ms':>8s} {'short p95':>9s} {'batch':>6s} {'pad %':>6s} {'errors':>6s}")
    for name, peer in results["peers"].items():
        for workload, row in peer["closed"].items():
            server = row["server"]
            print(f"{name:12s} {workload:10s} {row['requests_per_s']:7.2f} {row['audio_s_per_s']:9.2f} "
                  f"{row['p50_ms'] or 0:8.0f} {row['p95_ms'] or 0:8.0f} {row['p99_ms'] or 0:8.0f} "
                  f"{row['short_p95_ms'] or 0:9.0f} {_maybe(server['items_per_batch']):>6s} "
                  f"{_maybe(server['padding_waste'], 100):>6s} {sum(row['errors'].values()):6d}")
    for workload, row in results["engine"]["ceiling"].items():
        print(f"{'ceiling':12s} {workload:10s} {row['requests_per_s']:7.2f} {row['audio_s_per_s']:9.2f}   "
              f"(offline, batch {row['batch_size']}, length-sorted)")
    print("\nopen loop (mixed), completed req/s and p95 ms at each offered rate:")
    for name, peer in results["peers"].items():
        cells = "  ".join(f"{row['offered_per_s']:.2f}->{row['completed_per_s']:.2f}/{row['p95_ms'] or 0:.0f}"
                          for row in peer["open"])
        print(f"  {name:12s} {cells}")
    print(f"\n{results['settings']['streams']} streams ({results['settings']['stream_workload']}), time to first "
          "audio p50 / p95 ms: all; starting while the others run; the opening ones (started at the same instant), p95")
    for name, peer in results["peers"].items():
        streams = peer["streams"]
        print(f"  {name:12s} {streams['first_audio_p50_ms']} / {streams['first_audio_p95_ms']};  "
              f"{streams['first_audio_running_p50_ms']} / {streams['first_audio_running_p95_ms']} "
              f"({streams['first_audio_running_requests']} requests);  {streams['first_audio_opening_p95_ms']}")
    print(f"\nidle single request p50: raw engine {results['engine']['idle_p50_ms']} ms; "
          + ", ".join(f"{name} {peer['idle_p50_ms']} ms (+{peer['idle_overhead_ms']})"
                      for name, peer in results["peers"].items()))
    rounds = len(results["control_rounds"])
    print(f"\nmixed closed loop, audio-s/s in each of {rounds} rounds: "
          + "; ".join(f"{name} {peer['mixed_rounds']}" for name, peer in results["peers"].items())
          + f"; {CONTROL} {results['control_rounds']}; {CEILING} {results['ceiling_rounds']}")
    print("\ntargets (" + results["target_set"] + "; throughput ratios: median of the rounds [range]):")
    for name in [*results["targets"], *(name for name in results["ratios"] if name not in results["targets"])]:
        spread = results["ratio_ranges"].get(name)
        wanted = f"target {results['targets'][name]}  {results['verdicts'][name]}" if name in results["targets"] \
            else "(no target)" if name != "control_vs_sequential" else "(A/A: two identical servers)"
        print(f"  {name:26s} measured {results['ratios'].get(name)!s:>8s} {str(spread or ''):16s} {wanted}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run of every part (under 2 minutes)")
    parser.add_argument("--out", type=Path, help="folder for results.json and report.html "
                                                 "(default bench/results/<time>)")
    parser.add_argument("--docs", action="store_true", help="regenerate docs/benchmarks.md and its chart")
    parser.add_argument("--voice", help="the voice every request uses (default en_US-joe-medium; with --upstream, "
                                         "pocket-random)")
    parser.add_argument("--voices-file", type=Path, help="TTS_VOICES_FILE for the servers and the ceiling")
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated subset of peers to run")
    parser.add_argument("--no-ray", action="store_true", help="leave out the Ray Serve peer even if Ray is installed")
    parser.add_argument("--soak", type=float, metavar="MINUTES",
                        help="instead of the peers, soak one server: MINUTES at 70%% of its capacity around 60 s "
                             "at 3x (bench/soak.py); writes soak.json under --out")
    parser.add_argument("--upstream", action="store_true",
                        help="instead of the peers, Chorus in front of a second Chorus (engine: upstream) against "
                             "the same clients sent straight to it (bench/upstream.py); writes upstream.json")
    parser.add_argument("--precision", action="store_true",
                        help="instead of the peers, the bundled voice at full precision and at int8, its speed and "
                             "word error rate (bench/precision.py); writes precision.json")
    parser.add_argument("--kokoro", action="store_true",
                        help="instead of the peers, Chorus serving a random-weight Kokoro against Kokoro-FastAPI "
                             "serving the same weights, and the engine ceiling (bench/kokoro.py); writes kokoro.json")
    args = parser.parse_args()
    args.voice = args.voice or ("pocket-random" if args.upstream else BUNDLED_VOICE)
    if args.soak is not None:
        soak(args.soak, args.out, args.voice)
        return
    plan_name = "quick" if args.quick else "full"
    plan = PLANS[plan_name]
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out = args.out or ROOT / "bench" / "results" / stamp
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if args.precision:
        print_precision(precision_benchmark(args.quick, out))
        return
    if args.kokoro:
        from bench.kokoro import run as kokoro_benchmark

        kokoro_benchmark(args.quick, out)
        return
    if args.voice in BUILT_VOICES and not args.voices_file:
        with ThreadPoolExecutor(max_workers=1) as builder:  # on a thread that ends: see EngineAlone
            args.voices_file = builder.submit(built_voice, args.voice, out).result()
    if args.upstream:
        from bench.upstream import run as upstream_benchmark  # (it reads this module's OPERATOR)

        upstream_benchmark(args.quick, out, args.voice, args.voices_file)
        return

    print(f"engine alone ({args.voice}): the ceiling ...", flush=True)
    engine = EngineAlone(args.voice, args.voices_file)
    stepped = engine.engine.capabilities.makes_frames  # an autoregressive engine (its declared shape)
    if stepped:  # an autoregressive voice: its own scenario sizes and targets
        plan = {**plan, **STEPPED_PLAN,
                **({"clients": 4, "streams": 4} if args.quick else STEPPED_FULL_PLAN)}
    workloads = list(dict.fromkeys([*plan["workloads"], "mixed"]))
    copies = engine.copies("mixed", plan)  # ({} for an engine that runs one copy, or steps)
    if copies:
        print(f"copies of the model alone, audio-s/s by round: {copies['audio_s_per_s']} (best {copies['best']}: "
              f"{copies['best_vs_one']}x one copy)", flush=True)
    ceiling = {workload: engine.ceiling(workload, plan, plan["ceiling_sizes"]) for workload in workloads}
    rates = [round(fraction * ceiling["mixed"]["requests_per_s"], 3) for fraction in plan["open_fractions"]]
    results = {"plan": plan_name, "settings": plan, "machine": machine(), "voice": args.voice,
               "started_at": stamp, "engine": {"ceiling": ceiling, "copies": copies}, "offered_rates": rates,
               "peers": {}}
    ray = importlib.util.find_spec("ray") is not None and not args.no_ray
    results["ray_serve"] = (f"run as the peer {RAY_PEER!r}: the same engine, Ray's @serve.batch (16 texts, 10 ms)"
                            if ray else "not run (--no-ray)" if args.no_ray else "not installed")

    servers, folders = {}, []
    try:
        peers = [*args.peers.split(","), *([RAY_PEER] if ray else [])]
        launched = [*peers, *([CONTROL] if plan["own_control"] or "sequential" not in peers else [])]
        print(f"starting {len(launched)} servers: {', '.join(launched)} ...", flush=True)

        def launch(name: str) -> ServerProcess:
            folders.append(tempfile.TemporaryDirectory())
            if name == RAY_PEER:
                return start_ray_peer(Path(folders[-1].name), args.voice, args.voices_file)
            settings = {**PEERS.get(name, PEERS["sequential"]), "calibration_sizes": plan["calibration_sizes"],
                        "operator_defaults": json.dumps(OPERATOR), "max_queue": "4096",
                        "trusted_proxies": "127.0.0.1"}  # each simulated user is its own caller (bench.load)
            if args.voices_file:
                settings["voices_file"] = str(args.voices_file)
            return start_server(Path(folders[-1].name), **settings)

        # One after another: each calibrates its cost model on a quiet machine, and torch servers started
        # together fight for the cores: since models load on threads that end (tts_core/pool.py), libgomp
        # lets each process's lone OpenMP team spin between its parallel regions, and servers started at
        # once take far longer to be ready than in turn (docs/voices.md#autoregressive-voices).
        for name in launched:
            servers[name] = launch(name)
        urls = {name: servers[name].base_url for name in peers}
        print("idle latency: the engine alone and every server, text by text in turn ...", flush=True)
        idle = idle_latencies(engine, urls, plan, args.voice)
        if stepped:
            print("idle time to first audio: one stream at a time on every server ...", flush=True)
            for name, first in idle_first_audio(urls, plan, args.voice).items():
                idle[name]["idle_first_audio_p50_ms"] = first
        best_size = [ceiling["mixed"]["batch_size"]]
        control = (servers.get(CONTROL) or servers["sequential"]).base_url
        results.update(asyncio.run(run_peers(
            urls, control, lambda: engine.ceiling("mixed", plan, best_size)["audio_s_per_s"], plan, rates, args.voice)))
        results["engine"].update(idle["engine"])
        for name, url in urls.items():
            results["peers"][name].update(idle[name])
            if name != RAY_PEER:
                results["peers"][name]["status"] = httpx.get(f"{url}/api/v1/batch/status").json()
    finally:
        for server in servers.values():
            server.stop()
        for folder in folders:
            folder.cleanup()
        engine.close()

    if args.voice == BUNDLED_VOICE and not args.voices_file:  # (after the servers: alone on the machine)
        results["precision"] = precision_benchmark(args.quick)
    on_gpu = bool(results["machine"]["gpu"])
    results["target_set"] = ("autoregressive, " if stepped else "") + ("GPU" if on_gpu else "CPU")
    results["targets"] = STEPPED_TARGETS if stepped else GPU_TARGETS if on_gpu else CPU_TARGETS
    if copies.get("pays_alone") and not on_gpu and results["peers"].get("chorus", {}).get("status", {}).get(
            "engines", {}).get(args.voice, {}).get("instances", 1) > 1:  # copies pay alone, and chorus runs them
        results["targets"] = {**results["targets"], "chorus_vs_sequential": COPIES_TARGET}
    results["engine_shape"] = "stepped (autoregressive)" if stepped else "one-shot"
    if set(PEERS) <= set(results["peers"]):
        results["ratios"], results["ratio_ranges"] = ratios(results)
        results["verdicts"] = verdicts(results["ratios"], results["targets"])
    results["total_s"] = round(time.perf_counter() - started, 1)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    write_html(results, out / "report.html")
    if "ratios" in results:
        print_table(results)
    if "precision" in results:
        print_precision(results["precision"])
    if args.docs:
        write_docs(results, ROOT / "docs", " ".join(["python -m bench", *(["--quick"] if args.quick else [])]))
    print(f"\nwrote {out / 'results.json'} and {out / 'report.html'} in {results['total_s']} s")
