"""Memory after long texts: `python -m bench.memory [--texts 20]`.

One server (a process on 127.0.0.1, the bundled voice) streams long texts (5,000 characters of
long clauses: the 400-character pieces that grow onnxruntime's arena the most), one after the
other. Its resident memory is read, idle, after the first 2 and after all of them: an engine hands
its working memory back once idle 2 s, so the two readings should match (target: within 10%).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

import httpx

from bench.server import start_server
from bench.soak import idle_reading

TARGET_GROWTH_PCT = 10.0


def long_text(seed: int) -> str:
    clauses = (f"this is clause {seed}-{n} of a long text that runs on and on without a full stop" for n in range(80))
    return ", ".join(clauses)[:4999] + "."  # TTS_MAX_CHARS is 5,000


async def stream(client: httpx.AsyncClient, text: str) -> int:
    body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm", "stream": True}
    received = 0
    async with client.stream("POST", "/v1/audio/speech", json=body) as response:
        response.raise_for_status()
        async for chunk in response.aiter_bytes():
            received += len(chunk)
    return received


async def measure(base_url: str, pid: int, count: int) -> dict:
    readings = {}
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        for index in range(count):
            await stream(client, long_text(index))
            if index + 1 in (2, count):
                readings[index + 1] = (await idle_reading(base_url, pid))["rss_mb"]
                print(f"after {index + 1} long texts: {readings[index + 1]} MB resident, idle", flush=True)
    return readings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        server = start_server(Path(data_dir), operator_defaults=json.dumps(
            {"anonymous_tier": "enterprise", "degrade_enabled": False, "cache_enabled": False}))
        try:
            readings = asyncio.run(measure(server.base_url, server.process.pid, max(3, args.texts)))
        finally:
            server.stop()
    first, last = readings[2], readings[max(readings)]
    growth = 100 * (last / first - 1)
    verdict = "met" if growth <= TARGET_GROWTH_PCT else "MISSED"
    print(f"resident memory after {max(readings)} long texts vs after 2: {growth:+.1f}% "
          f"(target within {TARGET_GROWTH_PCT:.0f}%): {verdict}")


if __name__ == "__main__":
    main()
