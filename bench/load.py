"""Load generators against a running server: closed loop (N clients, each sends its next request
when its last is answered) and open loop (Poisson arrivals at a rate, whatever the answers do).

Both are bounded in time and in count and stop by themselves; requests still running when the
open loop's drain time ends are cancelled and counted as timeouts.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import httpx

SHORT_CHARS = 50  # "short requests" in the reports: at most this long
PCM_BYTES_PER_S = 2 * 24000  # OpenAI's pcm: 24 kHz, 16-bit mono


@dataclass
class Outcome:
    chars: int
    status: int  # 0: no answer (connection error or timeout)
    latency_s: float
    audio_s: float = 0.0
    first_audio_s: float | None = None  # streams only
    ended: float = 0.0  # time.perf_counter() when the answer was complete
    opening: bool = False  # a closed loop's client's first request: all of them are sent at the same instant


def user_address(user: int) -> str:
    """The X-Forwarded-For of simulated user number `user`: the servers under test trust 127.0.0.1 as a
    proxy (TTS_TRUSTED_PROXIES), so each user is its own caller, as real users are (one caller's
    requests keep their order; different callers' short ones go first). A header only: all traffic
    goes to 127.0.0.1."""
    return f"10.8.{user // 250 % 250}.{user % 250 + 1}"


async def _speak(client: httpx.AsyncClient, text: str, voice: str, stream: bool, user: int) -> Outcome:
    body = {"model": "tts-1", "voice": voice, "input": text, "response_format": "pcm", "stream": stream}
    started = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/audio/speech", json=body,
                                 headers={"X-Forwarded-For": user_address(user)}) as response:
            received, first = 0, None
            async for chunk in response.aiter_bytes():
                if chunk and first is None:
                    first = time.perf_counter() - started
                received += len(chunk)
            status = response.status_code
    except (TimeoutError, httpx.HTTPError):
        return Outcome(len(text), 0, time.perf_counter() - started, ended=time.perf_counter())
    audio_s = received / PCM_BYTES_PER_S if status == 200 else 0.0
    ended = time.perf_counter()
    return Outcome(len(text), status, ended - started, audio_s, first if stream else None, ended)


def _client(base_url: str, connections: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(300.0),
                             limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections))


async def closed_loop(base_url: str, texts: list[str], clients: int, duration_s: float, max_requests: int,
                      voice: str = "alloy", stream: bool = False) -> tuple[list[Outcome], float]:
    """Outcomes and the wall time they took."""
    deadline = time.perf_counter() + duration_s
    outcomes: list[Outcome] = []
    next_text = iter(range(max_requests))

    async with _client(base_url, clients) as client:
        async def worker(user: int) -> None:
            opening = True
            for index in next_text:
                if time.perf_counter() >= deadline:
                    return
                outcome = await _speak(client, texts[index % len(texts)], voice, stream, user)
                outcome.opening, opening = opening, False
                outcomes.append(outcome)

        started = time.perf_counter()
        await asyncio.gather(*(worker(user) for user in range(clients)))
        return outcomes, time.perf_counter() - started


async def open_loop(base_url: str, texts: list[str], rate_per_s: float, duration_s: float, max_requests: int,
                    drain_s: float = 60.0, voice: str = "alloy", seed: int = 0) -> tuple[list[Outcome], float, float]:
    """Poisson arrivals for duration_s (or max_requests), then up to drain_s for the answers.
    Returns the outcomes, the whole run's time, and the requests/s completed within the arrival
    window (the throughput at this offered rate; a server that keeps up completes what is offered)."""
    rng = random.Random(seed)
    tasks: list[asyncio.Task] = []
    async with _client(base_url, 256) as client:
        started = time.perf_counter()
        next_at = started
        for index in range(max_requests):
            next_at += rng.expovariate(rate_per_s)
            if next_at - started >= duration_s:
                break
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            # Poisson arrivals are independent users: each request its own caller
            tasks.append(asyncio.ensure_future(_speak(client, texts[index % len(texts)], voice, False, index)))
        done, pending = await asyncio.wait(tasks, timeout=drain_s) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        elapsed = time.perf_counter() - started
    outcomes = [task.result() for task in tasks if task in done]
    outcomes += [Outcome(0, 0, elapsed) for _ in pending]
    in_window = sum(1 for outcome in outcomes if outcome.status == 200 and outcome.ended <= started + duration_s)
    return outcomes, elapsed, round(in_window / duration_s, 3)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(outcomes: list[Outcome], elapsed_s: float) -> dict:
    ok = [outcome for outcome in outcomes if outcome.status == 200]
    short = [outcome.latency_s for outcome in ok if outcome.chars <= SHORT_CHARS]

    def ms(values: list[float], q: float) -> float | None:
        value = percentile(values, q)
        return None if value is None else round(1000 * value, 1)

    latencies = [outcome.latency_s for outcome in ok]
    streamed = [outcome for outcome in ok if outcome.first_audio_s is not None]
    firsts = [outcome.first_audio_s for outcome in streamed]
    # a stream that starts while the others run (a closed loop's clients all start at the same instant)
    firsts_running = [outcome.first_audio_s for outcome in streamed if not outcome.opening]
    firsts_opening = [outcome.first_audio_s for outcome in streamed if outcome.opening]
    errors: dict[str, int] = {}
    for outcome in outcomes:
        if outcome.status != 200:
            errors[str(outcome.status or "timeout")] = errors.get(str(outcome.status or "timeout"), 0) + 1
    return {
        "requests": len(outcomes), "ok": len(ok), "errors": errors, "seconds": round(elapsed_s, 2),
        "requests_per_s": round(len(ok) / elapsed_s, 3) if elapsed_s else 0.0,
        "audio_s_per_s": round(sum(outcome.audio_s for outcome in ok) / elapsed_s, 3) if elapsed_s else 0.0,
        "p50_ms": ms(latencies, 0.5), "p95_ms": ms(latencies, 0.95), "p99_ms": ms(latencies, 0.99),
        "short_requests": len(short), "short_p50_ms": ms(short, 0.5), "short_p95_ms": ms(short, 0.95),
        "first_audio_p50_ms": ms(firsts, 0.5), "first_audio_p95_ms": ms(firsts, 0.95),
        "first_audio_running_p50_ms": ms(firsts_running, 0.5), "first_audio_running_p95_ms": ms(firsts_running, 0.95),
        "first_audio_running_requests": len(firsts_running),
        "first_audio_opening_p95_ms": ms(firsts_opening, 0.95),
    }
