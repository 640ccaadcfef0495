"""Time to first audio of a 2,000-character text, streamed over HTTP from a real server.

Three measurements, one run, one server (the default configuration, degrade mode off):
  idle       one stream at a time (each closed after its first audio, the server drained between);
  8 at once  eight streams started together (every one's first audio counts);
  under load a new stream while eight others are streaming.

    python -m bench.ttfa [--rounds 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.load import percentile, user_address
from bench.server import start_server
from bench.workload import texts

TEXT_CHARS = 2000
TARGETS_MS = {"idle_p50": 150, "concurrent_p95": 400}


def long_text(seed: int) -> str:
    text = " ".join(texts("long", 16, seed=seed))
    return text[:TEXT_CHARS].rsplit(" ", 1)[0] + "."


def first_audio_s(client: httpx.Client, text: str, user: int, stop: threading.Event | None = None) -> float:
    """Seconds until the first audio bytes; then reads on until `stop` is set (or leaves at once)."""
    started = time.perf_counter()
    body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm", "stream": True}
    with client.stream("POST", "/v1/audio/speech", json=body, headers={"X-Forwarded-For": user_address(user)}
                       ) as response:
        response.raise_for_status()
        chunks = response.iter_bytes()
        next(chunks)
        elapsed = time.perf_counter() - started
        if stop is not None:
            for _ in chunks:
                if stop.is_set():
                    break
    return elapsed


def drained(client: httpx.Client) -> None:
    """Until the server has nothing queued or running (a stream cut off after its first audio runs on until
    its next step). A server without Chorus's status (the Ray peer: it does not stream) has nothing left."""
    while (status := client.get("/api/v1/batch/status")).status_code != 404 and status.json()["pending_requests"]:
        time.sleep(0.05)


def summary(seconds: list[float]) -> dict:
    ms = [1000 * value for value in seconds]
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 1), "p95_ms": round(percentile(ms, 0.95), 1),
            "max_ms": round(max(ms), 1)}


def in_parallel(count: int, work) -> list[float]:
    results: list[float] = [0.0] * count

    def run(index: int) -> None:
        results[index] = work(index)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def measure(base_url: str, rounds: int) -> dict:
    with httpx.Client(base_url=base_url, timeout=120, limits=httpx.Limits(max_connections=16)) as client:
        first_audio_s(client, "Warm up.", user=0)
        idle = []
        for seed in range(rounds):
            drained(client)
            idle.append(first_audio_s(client, long_text(seed), user=0))
        concurrent = []
        for round_ in range(max(1, rounds // 3)):
            drained(client)
            texts = [long_text(100 * round_ + index) for index in range(8)]
            concurrent += in_parallel(8, lambda index, texts=texts: first_audio_s(client, texts[index], user=index))
        under_load = []
        stop = threading.Event()
        background = threading.Thread(target=in_parallel, args=(
            8, lambda index: first_audio_s(client, long_text(1000 + index), index, stop)))
        drained(client)
        background.start()
        time.sleep(1.0)  # the eight are past their first chunks, streaming
        for seed in range(rounds):
            under_load.append(first_audio_s(client, long_text(2000 + seed), user=100 + seed))
            time.sleep(0.2)
        stop.set()
        background.join()
    return {"idle": summary(idle), "eight_at_once": summary(concurrent), "new_stream_under_8": summary(under_load)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        # Degrade mode off: eight 2,000-character streams queue minutes of audio at once, which is
        # the load at which it would (rightly) cap new texts at 300 characters.
        server = start_server(Path(data_dir), trusted_proxies="127.0.0.1", operator_defaults=json.dumps(
            {"anonymous_tier": "enterprise", "degrade_enabled": False}))
        try:
            result = measure(server.base_url, args.rounds)
        finally:
            server.stop()
    result["text_chars"], result["targets_ms"] = TEXT_CHARS, TARGETS_MS
    print(f"time to first audio, {TEXT_CHARS}-character texts, streamed pcm over HTTP on 127.0.0.1")
    for name, label in (("idle", "idle"), ("eight_at_once", "8 started together"),
                        ("new_stream_under_8", "new stream, 8 streaming")):
        row = result[name]
        print(f"  {label:26s} p50 {row['p50_ms']:7.1f} ms   p95 {row['p95_ms']:7.1f} ms   max {row['max_ms']:7.1f} ms"
              f"   (n={row['n']})")
    idle_ok = result["idle"]["p50_ms"] <= TARGETS_MS["idle_p50"]
    print(f"  target idle p50 <= {TARGETS_MS['idle_p50']} ms: {'met' if idle_ok else 'MISSED'}")
    for name in ("eight_at_once", "new_stream_under_8"):
        met = result[name]["p95_ms"] <= TARGETS_MS["concurrent_p95"]
        print(f"  target p95 <= {TARGETS_MS['concurrent_p95']} ms with 8 streams ({name}): "
              f"{'met' if met else 'MISSED'}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
