"""A soak: one real server under mixed traffic for minutes, with an overload in the middle.

    python -m bench --soak MINUTES [--out FOLDER] [--voice VOICE]

One Chorus server (a process on 127.0.0.1, the bundled Piper voice, degrade mode at its defaults).
Its capacity is measured first: a closed loop of CAPACITY_CLIENTS clients for CAPACITY_S with the
same traffic as the soak; then WARM_UP_OVERLOAD_S of open-loop traffic at 3x, whose answers are all
awaited (the capacity run and this are the warm-up: every path the soak takes, the refusals and a
deep queue included, has run once). Then open-loop traffic (Poisson arrivals) in
three phases: MINUTES / 2 at 70% of that capacity ("before"), OVERLOAD_S at 3x ("overload"), and
MINUTES / 2 at 70% again ("after"); below MINUTES = 2 the overload and the capacity run last no
longer than each 70% phase, so a smoke run stays short. The traffic is plain POST /v1/audio/speech
(wav), streamed pcm, server-sent events and WebSocket utterances in equal shares, with distinct
texts, from USERS callers told apart by X-Forwarded-For (the server trusts 127.0.0.1 as a proxy).

Every request is accounted for: the server's status (200; 503, refused at once with Retry-After;
any other), or a loss: "timeout" (no answer within REQUEST_TIMEOUT_S), "connection_error", or
"cut_short" (a stream that broke off or ended without its end: no audio, no speech.audio.done,
no WebSocket `done`). Once a second the server's resident memory, open files, queue length and
degrade state are sampled. Memory growth compares two idle moments: after the warm-up and after
the last answer, each read once the server has nothing queued or running (an engine hands its
working memory back once idle 2 s); the peak under load is printed beside it. (Measured from
after the capacity run alone, the first overload's one-time allocations would read as growth.)

A 503 to a request sent within EDGE_S of the overload's end counts as the overload's, and is
printed apart: the server tells an overload by the work offered over its last EDGE_S (and 2 s and 5 s), so
for that long after the load falls it still sees the overload's (some runs in docs/benchmarks-history.md#soak-runs
had one or two such 503s). The recovery time below still counts them. The capacity run's 503s are printed
apart too: it is a closed loop at saturation (as much as the server can do, long texts
offered in bursts past it), and its clients wait their Retry-After before they send again.

Recovery time: from the end of the overload to the last bad moment that is followed by a clean
hold window (HOLD_S, or half the "after" phase if that is shorter) within the "after" phase;
bad moments are 503 answers and queue_length samples above the 70% level (the longest queue
sampled in the "before" phase). The first such window counts (a later relapse shows in the 503
count of the "after" phase). None: the server did not recover within the run. Printed beside it for
scale: a backlog as long as admission allows in an overload (overload_wait_target_s of predicted
wait) drains at the capacity left over at 70% load in target / (1 - 0.7) seconds.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import re
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from bench.load import PCM_BYTES_PER_S, percentile, user_address
from bench.server import ROOT, ServerProcess, start_server
from bench.workload import MIXES, sentence
from tts_core.errors import ERROR_TYPES
from tts_core.request.operating import OperatorSettings
from tts_core.scheduler.engine_loop import RELEASE_AFTER_IDLE_S
from tts_core.scheduler.queue import OFFERED_WINDOWS_S

KINDS = ("plain", "stream", "sse", "ws")
PHASES = ("capacity", "warm-up", "before", "overload", "after")
STEADY, OVERLOAD = 0.7, 3.0  # offered load, as a share of the measured capacity
OVERLOAD_S, CAPACITY_S, CAPACITY_CLIENTS, HOLD_S, WARM_UP_OVERLOAD_S = 60.0, 15.0, 8, 10.0, 15.0
USERS = 64
REQUEST_TIMEOUT_S = 330.0  # past the enterprise tier's 300 s deadline: the server has its say first
LOST = ("timeout", "connection_error", "cut_short")
EDGE_S = min(OFFERED_WINDOWS_S)  # a refusal this soon after the overload's end is the overload's
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TARGETS = {"lost": 0, "memory_growth_pct": 5.0, "recovery_s": 10.0, "refused_outside_overload": 0}
# Degrade mode at its defaults; anonymous callers unlimited; the audio cache stores nothing: the texts
# never repeat, so it could only fill to its budget (64 MB, bounded by design), which would read as
# memory growth and hide a leak.
OPERATOR = {"anonymous_tier": "enterprise", "cache_max_mb": 0}
WAIT_TARGET_S = OperatorSettings().overload_wait_target_s  # at its default: what admission lets queue up in one
# A WebSocket error event's type -> the HTTP status it stands for (the first status of a type wins)
SOCKET_STATUS = {kind: str(status) for status, kind in reversed(ERROR_TYPES.items())}


@dataclass
class Reply:
    status: str  # "200", "503", ...: the server's answer; or one of LOST
    audio_s: float | None = None  # None: the pcm bytes received say
    retry_after_s: float | None = None
    detail: str = ""


class Audio:
    """The audio bytes of one answer as they come: how many, and when the first came."""

    def __init__(self) -> None:
        self.bytes, self.first = 0, None  # first: time.perf_counter() of the first audio

    def add(self, size: int) -> None:
        if size and self.first is None:
            self.first = time.perf_counter()
        self.bytes += size


@dataclass
class Answer:
    phase: str
    kind: str
    user: int
    status: str
    sent_s: float  # since the run started
    latency_s: float  # to the whole answer (a stream's last byte)
    first_audio_s: float | None  # streams: to the first audio
    audio_s: float
    retry_after_s: float | None
    detail: str

    @property
    def answered_s(self) -> float:
        return self.sent_s + self.latency_s


def _refusal(response: httpx.Response) -> Reply:
    retry = response.headers.get("retry-after")
    return Reply(str(response.status_code), retry_after_s=float(retry) if retry else None,
                 detail=response.text[:200])


class Traffic:
    """Sends one request of a kind and records its answer; texts and callers from a seeded rng."""

    def __init__(self, server: ServerProcess, voice: str, timeout_s: float = REQUEST_TIMEOUT_S, seed: int = 0):
        self.base_url, self.voice, self.timeout_s = server.base_url, voice, timeout_s
        self.socket_url = server.base_url.replace("http://", "ws://") + "/v1/audio/speech/stream"
        # No proxies from the environment: traffic goes to 127.0.0.1 only. No pool limit: an open
        # loop must not queue in the client.
        self.client = httpx.AsyncClient(base_url=server.base_url, timeout=httpx.Timeout(timeout_s), trust_env=False,
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        self.rng = random.Random(seed)
        self.started = time.perf_counter()
        self.answers: list[Answer] = []
        self.in_flight: dict[int, tuple[str, str, int, float]] = {}
        self.sent = 0

    def now(self) -> float:
        return time.perf_counter() - self.started

    async def send(self, phase: str) -> Answer:
        """The next kind (round robin), a new text and a random caller; never raises."""
        kind, user = KINDS[self.sent % len(KINDS)], self.rng.randrange(USERS)
        text, audio = sentence(self.rng, *MIXES["mixed"]), Audio()
        number, sent = self.sent, self.now()
        self.sent += 1
        self.in_flight[number] = (phase, kind, user, sent)  # what is left here at the end was never answered
        headers = {"X-Forwarded-For": user_address(user)}
        try:
            reply = await asyncio.wait_for(getattr(self, f"_{kind}")(text, headers, audio), self.timeout_s)
        except (TimeoutError, httpx.TimeoutException):
            reply = Reply("timeout")
        except (httpx.HTTPError, WebSocketException, OSError) as error:
            reply = Reply("connection_error", detail=f"{type(error).__name__}: {error}"[:200])
        except (ValueError, KeyError) as error:  # an answer that is not what the API says it sends
            reply = Reply("cut_short", detail=f"malformed: {type(error).__name__}: {error}"[:200])
        del self.in_flight[number]
        first = None if audio.first is None or kind == "plain" else audio.first - self.started - sent
        return self._record(phase, kind, user, sent, reply, audio.bytes / PCM_BYTES_PER_S, first)

    def _record(self, phase: str, kind: str, user: int, sent: float, reply: Reply, pcm_s: float = 0.0,
                first_audio_s: float | None = None) -> Answer:
        audio_s = pcm_s if reply.audio_s is None else reply.audio_s
        answer = Answer(phase, kind, user, reply.status, round(sent, 3), round(self.now() - sent, 3),
                        None if first_audio_s is None else round(first_audio_s, 3), round(audio_s, 3),
                        reply.retry_after_s, reply.detail)
        self.answers.append(answer)
        return answer

    def give_up(self) -> None:
        """Requests still unanswered (their tasks cancelled): timeouts."""
        for phase, kind, user, sent in self.in_flight.values():
            self._record(phase, kind, user, sent, Reply("timeout", detail="still unanswered when the run ended"))
        self.in_flight.clear()

    def _body(self, text: str, **extra) -> dict:
        return {"model": "tts-1", "voice": self.voice, "input": text, **extra}

    async def _plain(self, text: str, headers: dict, audio: Audio) -> Reply:
        response = await self.client.post("/v1/audio/speech", json=self._body(text, response_format="wav"),
                                          headers=headers)
        if response.status_code != 200:
            return _refusal(response)
        return Reply("200", float(response.headers.get("x-chorus-audio-duration", 0.0)))

    async def _stream(self, text: str, headers: dict, audio: Audio) -> Reply:
        body = self._body(text, response_format="pcm", stream=True)
        async with self.client.stream("POST", "/v1/audio/speech", json=body, headers=headers) as response:
            if response.status_code != 200:
                await response.aread()
                return _refusal(response)
            try:
                async for chunk in response.aiter_bytes():
                    audio.add(len(chunk))
            except httpx.HTTPError as error:  # the status line was 200: the stream broke off
                return Reply("cut_short", detail=f"{type(error).__name__}: {error}")
        return Reply("200") if audio.bytes else Reply("cut_short", detail="no audio")

    async def _sse(self, text: str, headers: dict, audio: Audio) -> Reply:
        body = self._body(text, response_format="pcm", stream_format="sse")
        async with self.client.stream("POST", "/v1/audio/speech", json=body, headers=headers) as response:
            if response.status_code != 200:
                await response.aread()
                return _refusal(response)
            detail = "ended without speech.audio.done"
            try:
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line[len("data: "):])
                    if event["type"] == "speech.audio.delta":
                        audio.add(len(base64.b64decode(event["audio"])))
                    elif event["type"] == "speech.audio.done":
                        return Reply("200")
                    else:
                        detail = line[:200]
            except httpx.HTTPError as error:
                detail = f"{type(error).__name__}: {error}"
        return Reply("cut_short", detail=detail)

    async def _ws(self, text: str, headers: dict, audio: Audio) -> Reply:
        # proxy=None: never through a proxy; no compression: audio does not compress, and both ends
        # would pay for trying.
        async with connect(self.socket_url, additional_headers=headers, proxy=None, compression=None,
                           open_timeout=self.timeout_s) as socket:
            await socket.send(json.dumps({"text": text, "voice": self.voice}))
            return await _utterance(socket, audio)


async def _utterance(socket, audio: Audio) -> Reply:
    """Reads one utterance's answer: binary audio until `done`; an `error` before `started` is a
    refusal (its type says which status), one after it a stream cut short."""
    started = False
    try:
        async for message in socket:
            if isinstance(message, bytes):
                audio.add(len(message))
                continue
            event = json.loads(message)
            if event["type"] == "started":
                started = True
            elif event["type"] == "done":
                return Reply("200", event.get("audio_s"))
            elif event["type"] == "error":
                if started:
                    return Reply("cut_short", detail=message[:200])
                error = event.get("error", {})
                retry = re.search(r"retry after (\d+) s", error.get("message", ""))
                return Reply(SOCKET_STATUS.get(error.get("type"), "500"),
                             retry_after_s=float(retry.group(1)) if retry else None, detail=message[:200])
    except ConnectionClosed as closed:
        return Reply("cut_short", detail=f"socket closed: {closed}")
    return Reply("cut_short", detail="socket closed without done")


# --- load -------------------------------------------------------------------------------------------

async def measure_capacity(traffic: Traffic, seconds: float, clients: int) -> dict:
    """A closed loop of the soak's own traffic: what the server answers per second at saturation. A
    client told 503 waits its Retry-After before it sends again, as the `openai` client does (one that
    came straight back would offer the server its refused work again and again)."""
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()

    async def client() -> None:
        while time.perf_counter() < deadline:
            answer = await traffic.send("capacity")
            if answer.status == "503" and answer.retry_after_s:
                await asyncio.sleep(min(answer.retry_after_s, max(0.0, deadline - time.perf_counter())))

    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    ok = [answer for answer in traffic.answers if answer.phase == "capacity" and answer.status == "200"]
    if not ok:
        raise RuntimeError("the server answered nothing in the capacity run: "
                           + "; ".join({answer.detail or answer.status for answer in traffic.answers}))
    return {"seconds": round(elapsed, 2), "clients": clients, "requests_per_s": round(len(ok) / elapsed, 3),
            "audio_s_per_s": round(sum(answer.audio_s for answer in ok) / elapsed, 3)}


async def offer(traffic: Traffic, phase: str, rate_per_s: float, seconds: float, tasks: list) -> None:
    """Poisson arrivals for `seconds` (at most twice the expected count), each request a task of
    its own; returns when the phase's time is up, whatever the answers do. A phase offers at least
    one request, and lasts until its first arrival if that comes later (a smoke run's few seconds at a
    slow server's rate may expect only a few; a soak of minutes expects hundreds)."""
    started = time.perf_counter()
    next_at = started
    for sent in range(int(2 * rate_per_s * seconds) + 10):
        next_at += traffic.rng.expovariate(rate_per_s)
        if next_at - started >= seconds and sent:
            break
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        tasks.append(asyncio.ensure_future(traffic.send(phase)))
    await asyncio.sleep(max(0.0, started + seconds - time.perf_counter()))


# --- the server process -------------------------------------------------------------------------------

def process_reading(pid: int) -> dict:
    """Resident memory (MB; of it, anonymous and mapped from files) and open file descriptors of a process,
    from /proc; None once it is gone
    (a server that died mid-run is what a soak is for: its requests still count, as errors)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        kb = {field: int(re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE).group(1))
              for field in ("VmRSS", "RssAnon", "RssFile")}
        ticks = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13]  # utime, stime
        return {"rss_mb": round(kb["VmRSS"] / 1024, 1), "anon_mb": round(kb["RssAnon"] / 1024, 1),
                "file_mb": round(kb["RssFile"] / 1024, 1),
                "open_files": len(list(Path(f"/proc/{pid}/fd").iterdir())),
                "cpu_s": sum(map(int, ticks)) / CLOCK_TICKS, "machine_cpu_s": machine_cpu_s()}
    except (OSError, AttributeError):  # no such process, or a zombie without VmRSS
        return {"rss_mb": None, "anon_mb": None, "file_mb": None, "open_files": None, "cpu_s": None,
                "machine_cpu_s": machine_cpu_s()}


def machine_cpu_s() -> float:
    """CPU seconds every process on the machine has used (all but idle and iowait), from /proc/stat."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def cpu_by_phase(samples: list[dict], bounds: dict) -> dict:
    """Cores the server used in each phase, and cores everything else on the machine used (the load
    generator included): a server that got less than the machine's cores while its queue was long was
    held back by others, and its numbers for that phase say so."""
    shares = {}
    for phase, (start, end) in bounds.items():
        inside = [s for s in samples if start <= s["t"] <= end and s.get("cpu_s") is not None]
        if len(inside) < 2:
            continue
        seconds = inside[-1]["t"] - inside[0]["t"]
        server = (inside[-1]["cpu_s"] - inside[0]["cpu_s"]) / seconds
        machine = (inside[-1]["machine_cpu_s"] - inside[0]["machine_cpu_s"]) / seconds
        shares[phase] = {"server_cores": round(server, 2), "other_cores": round(machine - server, 2)}
    return shares


async def sample(traffic: Traffic, pid: int, stop: asyncio.Event, samples: list[dict]) -> None:
    """Once a second until stop: memory and files, the queue, and whether degrade mode is on."""
    async with httpx.AsyncClient(base_url=traffic.base_url, timeout=5, trust_env=False) as client:
        while not stop.is_set():
            row = {"t": round(traffic.now(), 2), **process_reading(pid), "queue_length": None, "degrade": None}
            try:
                row["queue_length"] = (await client.get("/api/v1/batch/status")).json()["queue_length"]
                metrics = (await client.get("/metrics")).text
                found = re.search(r"^tts_degrade_active (\S+)$", metrics, re.MULTILINE)
                row["degrade"] = bool(float(found.group(1))) if found else None
            except (httpx.HTTPError, ValueError, KeyError):
                pass  # a missed sample stays None; the answers still count
            samples.append(row)
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                pass


async def idle_reading(base_url: str, pid: int, timeout_s: float = 60.0) -> dict:
    """process_reading once the server has had nothing queued or running for a while (an engine hands its
    working memory back RELEASE_AFTER_IDLE_S after it goes idle): growth is then measured between two like
    moments, not against whatever was in flight. Read anyway after timeout_s."""
    async with httpx.AsyncClient(base_url=base_url, timeout=5, trust_env=False) as client:
        deadline, idle_since = time.monotonic() + timeout_s, None
        while time.monotonic() < deadline:
            try:
                idle = (await client.get("/api/v1/batch/status")).json()["pending_requests"] == 0
            except (httpx.HTTPError, ValueError, KeyError):
                idle = False
            idle_since = (idle_since or time.monotonic()) if idle else None
            if idle_since is not None and time.monotonic() - idle_since > RELEASE_AFTER_IDLE_S + 0.5:
                break  # the release has run
            await asyncio.sleep(0.25)
    return process_reading(pid)


# --- the run -----------------------------------------------------------------------------------------

def plan_for(minutes: float) -> dict:
    """Phase lengths: MINUTES split into the two 70% phases; the overload and the capacity run
    no longer than one of them (so only a run under 2 minutes shortens the overload)."""
    steady_s = 30.0 * minutes
    return {"minutes": minutes, "steady_s": steady_s, "overload_s": min(OVERLOAD_S, steady_s),
            "capacity_s": min(CAPACITY_S, steady_s), "capacity_clients": CAPACITY_CLIENTS,
            "warm_up_overload_s": min(WARM_UP_OVERLOAD_S, steady_s),
            "hold_s": min(HOLD_S, steady_s / 2), "request_timeout_s": REQUEST_TIMEOUT_S, "users": USERS,
            "kinds": list(KINDS), "steady_share": STEADY, "overload_share": OVERLOAD, "operator": OPERATOR}


async def await_answers(tasks: list, request_timeout_s: float) -> None:
    """Each request's task ends by itself within the request timeout; the margin is for a stuck client,
    whose task is cancelled (Traffic.give_up then counts it as a timeout)."""
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=request_timeout_s + 30)
        for task in pending:
            task.cancel()


async def drive(server: ServerProcess, plan: dict, voice: str) -> dict:
    """Capacity, then the three open-loop phases, then every answer awaited; samples throughout."""
    traffic, pid = Traffic(server, voice, plan["request_timeout_s"]), server.process.pid
    stop, samples, tasks = asyncio.Event(), [], []
    try:
        print(f"capacity: closed loop, {CAPACITY_CLIENTS} clients, {plan['capacity_s']:.0f} s ...", flush=True)
        capacity = await measure_capacity(traffic, plan["capacity_s"], CAPACITY_CLIENTS)
        print(f"warm-up: {OVERLOAD:g}x for {plan['warm_up_overload_s']:.0f} s, every answer awaited ...", flush=True)
        warm_up: list = []
        await offer(traffic, "warm-up", OVERLOAD * capacity["requests_per_s"], plan["warm_up_overload_s"], warm_up)
        await await_answers(warm_up, plan["request_timeout_s"])
        warm = await idle_reading(traffic.base_url, pid)
        sampler = asyncio.ensure_future(sample(traffic, pid, stop, samples))
        rates = {"before": STEADY * capacity["requests_per_s"], "overload": OVERLOAD * capacity["requests_per_s"],
                 "after": STEADY * capacity["requests_per_s"]}
        lengths = {"before": plan["steady_s"], "overload": plan["overload_s"], "after": plan["steady_s"]}
        bounds = {}
        for phase, rate in rates.items():
            print(f"{phase}: {rate:.2f} requests/s for {lengths[phase]:.0f} s ...", flush=True)
            started = traffic.now()
            await offer(traffic, phase, rate, lengths[phase], tasks)
            bounds[phase] = [round(started, 2), round(traffic.now(), 2)]
        print(f"waiting for the last {len(traffic.in_flight)} answers ...", flush=True)
        await await_answers(tasks, plan["request_timeout_s"])
        traffic.give_up()
        stop.set()
        await sampler
        end = {**await idle_reading(traffic.base_url, pid), "exit_code": server.process.poll()}  # None: still running
    finally:
        stop.set()
        await traffic.client.aclose()
    return {"capacity": capacity, "rates_per_s": {name: round(rate, 3) for name, rate in rates.items()},
            "bounds_s": bounds, "drained_s": round(traffic.now(), 2), "pid": pid,
            "server": {"after_warm_up": warm, "end": end}, "answers": traffic.answers, "samples": samples}


def row(answers: list[Answer]) -> dict:
    """Requests by status; p50/p95 of the 200s, to the whole answer and (streams) to the first audio;
    the slowest 503 and the Retry-After range."""
    by_status: dict[str, int] = {}
    for answer in answers:
        by_status[answer.status] = by_status.get(answer.status, 0) + 1
    ok = [answer.latency_s for answer in answers if answer.status == "200"]
    firsts = [answer.first_audio_s for answer in answers if answer.status == "200" and answer.first_audio_s is not None]
    refused = [answer for answer in answers if answer.status == "503"]
    retries = [answer.retry_after_s for answer in refused if answer.retry_after_s is not None]
    return {"requests": len(answers), "by_status": dict(sorted(by_status.items())),
            "lost": sum(by_status.get(status, 0) for status in LOST),
            "p50_ms": _ms(percentile(ok, 0.5)), "p95_ms": _ms(percentile(ok, 0.95)),
            "first_audio_p50_ms": _ms(percentile(firsts, 0.5)), "first_audio_p95_ms": _ms(percentile(firsts, 0.95)),
            "refused_max_ms": _ms(max((answer.latency_s for answer in refused), default=None)),
            "retry_after_s": [min(retries), max(retries)] if retries else None}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 1)


def recovery(answers: list[Answer], samples: list[dict], bounds: dict, hold_s: float) -> dict:
    """See the module docstring. A sample whose queue length could not be read counts as bad."""
    overload_end, run_end = bounds["overload"][1], bounds["after"][1]
    before = [s["queue_length"] for s in samples if s["queue_length"] is not None
              and bounds["before"][0] <= s["t"] < bounds["before"][1]]
    level = max(before, default=0)
    bad = sorted([answer.answered_s for answer in answers if answer.status == "503"
                  and overload_end <= answer.answered_s <= run_end]
                 + [s["t"] for s in samples if overload_end <= s["t"] <= run_end
                    and (s["queue_length"] is None or s["queue_length"] > level)])
    last_bad = overload_end
    for moment in bad:
        if moment >= last_bad + hold_s:
            break  # a clean hold window: recovered at last_bad
        last_bad = moment
    recovered = last_bad + hold_s <= run_end
    overload = [s["queue_length"] for s in samples if s["queue_length"] is not None
                and bounds["overload"][0] <= s["t"] <= overload_end]
    return {"seconds": round(last_bad - overload_end, 1) if recovered else None, "queue_level": level,
            "hold_s": hold_s, "peak_queue_in_overload": max(overload, default=None),
            "after_phase_s": round(run_end - overload_end, 1)}


def refused_outside_overload(answers: list[Answer], bounds: dict) -> dict:
    """503s of the 70% phases around the overload ("before", "after"): "edge", those sent within EDGE_S of
    the overload's end, counted as the overload's (see the module's docstring); "outside", the rest. And,
    printed apart, "saturation": the capacity run's (a closed loop that offers as much as the server can
    do, long texts in bursts past it, is no 70% load)."""
    overload_end = bounds["overload"][1]
    refused = [answer for answer in answers if answer.status == "503" and answer.phase in ("before", "after")]
    edge = sum(1 for answer in refused if answer.phase == "after" and answer.sent_s < overload_end + EDGE_S)
    saturation = sum(1 for answer in answers if answer.status == "503" and answer.phase == "capacity")
    return {"outside": len(refused) - edge, "edge": edge, "saturation": saturation}


def degrade_times(samples: list[dict], bounds: dict) -> dict:
    """When degrade mode came on (s after the overload began; negative: before it) and went off
    for good (s after the overload ended); None where it never did. Degrade mode still on from the
    warm-up's overload as the run starts is left out: it leaves within its exit hold."""
    start = next((index for index, s in enumerate(samples) if s["degrade"] is False), len(samples))
    on = [s["t"] for s in samples[start:] if s["degrade"]]
    if not on:
        return {"entered_s": None, "left_s": None, "on_at_end": False}
    off = next((s["t"] for s in samples if s["t"] > on[-1] and s["degrade"] is False), None)
    return {"entered_s": round(on[0] - bounds["overload"][0], 1),
            "left_s": round(off - bounds["overload"][1], 1) if off is not None else None, "on_at_end": off is None}


def summarize(run: dict, plan: dict) -> dict:
    """The tables, the server's memory and files, recovery, and the targets' measured values."""
    answers, samples, bounds = run["answers"], run["samples"], run["bounds_s"]
    table = {phase: {kind: row([a for a in answers if a.phase == phase and kind in (a.kind, "all")])
                     for kind in (*KINDS, "all")} for phase in PHASES}
    warm, end = run["server"]["after_warm_up"], run["server"]["end"]
    server = {**run["server"], "pid": run["pid"],
              "peak_rss_mb": max((s["rss_mb"] for s in samples if s["rss_mb"]), default=None),
              "peak_open_files": max((s["open_files"] for s in samples if s["open_files"]), default=None),
              "memory_growth_pct": round(100 * (end["rss_mb"] / warm["rss_mb"] - 1), 2)
              if end["rss_mb"] and warm["rss_mb"] else None}  # None: the server was gone
    lost = {status: sum(1 for answer in answers if answer.status == status) for status in LOST}
    recovered = recovery(answers, samples, bounds, plan["hold_s"])
    outside = refused_outside_overload(answers, bounds)
    measured = {"lost": sum(lost.values()), "memory_growth_pct": server["memory_growth_pct"],
                "recovery_s": recovered["seconds"], "refused_outside_overload": outside["outside"]}
    met = {"lost": measured["lost"] <= TARGETS["lost"],
           "memory_growth_pct": measured["memory_growth_pct"] is not None
           and measured["memory_growth_pct"] < TARGETS["memory_growth_pct"],
           "recovery_s": measured["recovery_s"] is not None and measured["recovery_s"] < TARGETS["recovery_s"],
           "refused_outside_overload": measured["refused_outside_overload"] <= TARGETS["refused_outside_overload"]}
    return {"table": table, "server": server, "lost": lost, "recovery": recovered, "refused_at_edge": outside["edge"],
            "refused_at_saturation": outside["saturation"],
            "cpu": cpu_by_phase(samples, bounds), "degrade": degrade_times(samples, bounds), "measured": measured,
            "targets": TARGETS,
            "verdicts": {name: "met" if ok else "MISSED" for name, ok in met.items()}}


def _statuses(by_status: dict) -> str:
    other = {status: count for status, count in by_status.items() if status not in ("200", "503", *LOST)}
    return " ".join(f"{status}:{count}" for status, count in other.items()) or "-"


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def print_report(result: dict) -> None:
    """The table per phase and kind, then the server, the recovery and a verdict per target."""
    plan, capacity = result["plan"], result["capacity"]
    print(f"\nsoak: {plan['minutes']} min at {STEADY:.0%} of capacity around {plan['overload_s']:.0f} s at "
          f"{OVERLOAD:g}x; {len(KINDS)} kinds in equal shares, {USERS} callers")
    if plan["overload_s"] < OVERLOAD_S:
        print(f"  (MINUTES < 2: the overload and the capacity run are shortened to {plan['overload_s']:.0f} s "
              f"and {plan['capacity_s']:.0f} s, the recovery hold to {plan['hold_s']:.0f} s)")
    print(f"capacity: {capacity['requests_per_s']} requests/s, {capacity['audio_s_per_s']} audio-s/s "
          f"(closed loop, {capacity['clients']} clients, {capacity['seconds']} s); offered "
          + ", ".join(f"{phase} {rate}/s" for phase, rate in result["rates_per_s"].items()))
    print(f"\n{'phase':9s} {'kind':7s} {'sent':>5s} {'200':>5s} {'503':>5s} {'lost':>5s} {'p50 ms':>7s} "
          f"{'p95 ms':>7s} {'1st audio p50/p95':>17s} {'503 max ms':>10s} {'Retry-After':>11s}  other")
    for phase, kinds in result["table"].items():
        for kind, cells in kinds.items():
            retry = "-" if not cells["retry_after_s"] else "{}-{} s".format(*map(_cell, cells["retry_after_s"]))
            first = "-" if cells["first_audio_p50_ms"] is None else \
                f"{_cell(cells['first_audio_p50_ms'])}/{_cell(cells['first_audio_p95_ms'])}"
            print(f"{phase:9s} {kind:7s} {cells['requests']:5d} {cells['by_status'].get('200', 0):5d} "
                  f"{cells['by_status'].get('503', 0):5d} {cells['lost']:5d} {_cell(cells['p50_ms']):>7s} "
                  f"{_cell(cells['p95_ms']):>7s} {first:>17s} {_cell(cells['refused_max_ms']):>10s} {retry:>11s}  "
                  f"{_statuses(cells['by_status'])}")
    print("lost: " + ", ".join(f"{status} {count}" for status, count in result["lost"].items()))
    _print_server(result)
    _print_targets(result)


def _growth(pct: float | None) -> str:
    return "server gone" if pct is None else f"{pct:+.1f}%"


def _print_server(result: dict) -> None:
    server, recovered, degrade = result["server"], result["recovery"], result["degrade"]
    warm, end = server["after_warm_up"], server["end"]
    if end["exit_code"] is not None:
        print(f"\nTHE SERVER EXITED during the run, with code {end['exit_code']}")
    print(f"\nserver (pid {server['pid']}): resident memory, idle, {warm['rss_mb']} MB after warm-up -> "
          f"{end['rss_mb']} MB at the end ({_growth(server['memory_growth_pct'])}, peak {server['peak_rss_mb']} MB; "
          f"of which anonymous {warm['anon_mb']} -> {end['anon_mb']} MB, mapped files {warm['file_mb']} -> "
          f"{end['file_mb']} MB); "
          f"open files {warm['open_files']} -> {end['open_files']} (peak {server['peak_open_files']})")
    print(f"queue: 70% level {recovered['queue_level']} items (the longest sampled in 'before'); "
          f"peak {recovered['peak_queue_in_overload']} in the overload")
    entered = "never on" if degrade["entered_s"] is None else f"on {degrade['entered_s']} s after the overload began"
    left = "" if degrade["entered_s"] is None else (
        ", still on at the end" if degrade["on_at_end"] else f", off {degrade['left_s']} s after it ended")
    print(f"degrade mode: {entered}{left}")
    seconds = recovered["seconds"]
    print(f"recovery: {'not within the run' if seconds is None else f'{seconds} s'}: from the end of the overload to "
          f"the last 503 or queue sample above {recovered['queue_level']} that is followed by "
          f"{recovered['hold_s']:.0f} s with neither (within the {recovered['after_phase_s']} s after it); "
          f"for scale: a backlog at the overload's wait target ({WAIT_TARGET_S:g} s) drains at {1 - STEADY:.0%} spare "
          f"capacity in {WAIT_TARGET_S / (1 - STEADY):.0f} s")
    cpu = result.get("cpu", {})
    print("cpu: " + "; ".join(f"{phase} server {share['server_cores']} cores, others {share['other_cores']}"
                              for phase, share in cpu.items()) + f" (of {os.cpu_count()})")


def _print_targets(result: dict) -> None:
    measured, verdicts = result["measured"], result["verdicts"]
    lines = {"lost": ("nothing lost (timeouts, errors, cut short)", f"{measured['lost']}", "0"),
             "memory_growth_pct": ("memory growth after warm-up", _growth(measured["memory_growth_pct"]), "< 5%"),
             "recovery_s": ("recovery after the overload",
                            "never" if measured["recovery_s"] is None else f"{measured['recovery_s']} s", "< 10 s"),
             "refused_outside_overload": ("503s outside the overload", f"{measured['refused_outside_overload']}", "0")}
    print("\ntargets:")
    for name, (label, value, target) in lines.items():
        print(f"  {label:44s} measured {value:>8s}   target {target:6s} {verdicts[name]}")
    if result["refused_at_edge"]:
        print(f"  (and {result['refused_at_edge']} 503s to requests sent within {EDGE_S:g} s of the overload's end, "
              "the server's shortest window of offered work: the overload's)")
    if result["refused_at_saturation"]:
        print(f"  (and {result['refused_at_saturation']} 503s in the capacity run, at saturation: no 70% phase)")


def main(minutes: float, out: Path | None = None, voice: str = "alloy") -> dict:
    """`python -m bench --soak MINUTES`: run, print, write soak.json under out; the server is
    stopped at the end whatever happens."""
    if minutes <= 0:
        raise SystemExit("--soak needs a positive number of minutes")
    plan = plan_for(minutes)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out = out or ROOT / "bench" / "results" / stamp
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        print("starting the server ...", flush=True)
        server = start_server(Path(folder), trusted_proxies="127.0.0.1", operator_defaults=json.dumps(OPERATOR))
        try:
            run = asyncio.run(drive(server, plan, voice))
        finally:
            server.stop()
    result = {"started_at": stamp, "plan": plan, "voice": voice, "capacity": run["capacity"],
              "rates_per_s": run["rates_per_s"], "bounds_s": run["bounds_s"], "drained_s": run["drained_s"],
              **summarize(run, plan), "answers": [asdict(answer) for answer in run["answers"]],
              "samples": run["samples"]}
    (out / "soak.json").write_text(json.dumps(result, indent=1))
    print_report(result)
    print(f"\nwrote {out / 'soak.json'}")
    return result
