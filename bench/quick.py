"""Quick benchmark: the same mixed workload served through the HTTP API at saturation, against
the raw engine run sequentially in this process. Prints the ratio (target: served >= 0.9x).

    python -m bench.quick [--requests 48] [--concurrency 8] [--policy adaptive]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.server import start_server
from bench.workload import texts
from tts_core.engines.contract import EngineInput
from tts_core.engines.piper import PiperEngine, bundled_voice_path

TARGET_RATIO = 0.9


def raw_sequential(workload: list[str]) -> tuple[float, float]:
    """Seconds and audio seconds for the engine alone, one text at a time (front end included)."""
    engine = PiperEngine(bundled_voice_path())
    engine.synthesize([EngineInput(engine.tokenize("Warm up.", engine.name)[0], engine.name)])
    audio = 0.0
    started = time.perf_counter()
    for text in workload:
        for tokens in engine.tokenize(text, engine.name):
            audio += engine.synthesize([EngineInput(tokens, engine.name)])[0].audio.size / engine.sample_rate
    return time.perf_counter() - started, audio


def served(base_url: str, workload: list[str], concurrency: int) -> tuple[float, float, list[float]]:
    """Seconds, audio seconds and per-request latencies through POST /v1/audio/speech (pcm)."""
    def one(text: str) -> tuple[float, float]:
        started = time.perf_counter()
        response = client.post("/v1/audio/speech", json={"model": "tts-1", "voice": "alloy", "input": text,
                                                         "response_format": "pcm"})
        response.raise_for_status()
        return len(response.content) / 2 / 24000, time.perf_counter() - started

    with httpx.Client(base_url=base_url, timeout=300,
                      limits=httpx.Limits(max_connections=concurrency)) as client:
        one("Warm up.")
        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(one, workload))
        elapsed = time.perf_counter() - started
    return elapsed, sum(audio for audio, _ in results), [latency for _, latency in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--policy", default="adaptive")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    workload = texts("mixed", args.requests)

    raw_s, raw_audio = raw_sequential(workload)
    with tempfile.TemporaryDirectory() as data_dir:
        server = start_server(Path(data_dir), batch_policy=args.policy)
        try:
            served_s, served_audio, latencies = served(server.base_url, workload, args.concurrency)
            status = httpx.get(f"{server.base_url}/api/v1/batch/status").json()
        finally:
            server.stop()

    raw_rate, served_rate = raw_audio / raw_s, served_audio / served_s
    latencies.sort()
    result = {
        "requests": len(workload), "concurrency": args.concurrency, "policy": args.policy,
        "raw_sequential": {"seconds": round(raw_s, 3), "audio_seconds": round(raw_audio, 2),
                           "audio_s_per_s": round(raw_rate, 2), "requests_per_s": round(len(workload) / raw_s, 2)},
        "served": {"seconds": round(served_s, 3), "audio_seconds": round(served_audio, 2),
                   "audio_s_per_s": round(served_rate, 2), "requests_per_s": round(len(workload) / served_s, 2),
                   "p50_latency_s": round(latencies[len(latencies) // 2], 3),
                   "p95_latency_s": round(latencies[int(0.95 * (len(latencies) - 1))], 3),
                   "avg_batch_size": status["avg_batch_size"]},
        "ratio": round(served_rate / raw_rate, 3),
        "target_ratio": TARGET_RATIO,
    }
    print(f"workload: {len(workload)} mixed texts (20-200 chars), {args.concurrency} concurrent clients, "
          f"policy {args.policy}; the raw engine uses the server's onnxruntime settings")
    print(f"raw engine, sequential : {raw_rate:6.2f} audio-s/s  ({len(workload) / raw_s:.2f} req/s)")
    print(f"served over HTTP       : {served_rate:6.2f} audio-s/s  ({len(workload) / served_s:.2f} req/s, "
          f"avg batch {status['avg_batch_size']})")
    verdict = "meets" if result["ratio"] >= TARGET_RATIO else "MISSES"
    print(f"ratio served/raw       : {result['ratio']:.3f}  ({verdict} the >= {TARGET_RATIO}x target)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
