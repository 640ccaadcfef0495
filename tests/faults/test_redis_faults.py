"""A hung or absent rate-limit store (#14): every Redis call is bounded, the check runs off the event
loop, a circuit breaker stops asking a failing store (serving without limits, logged once, shown with
since-when) and probes it again after a cool-down; an unreachable store is reported at start-up."""

import asyncio
import contextlib
import json
import logging
import socket
import statistics
import subprocess
import threading
import time

import httpx
import pytest
from websockets.sync.client import connect

from access.control import AccessControl, CircuitBreaker
from app import create_app
from bench.server import free_port, start_server
from storage import Storage, sqlite_url
from tests.fakes import FakeEngine
from tests.serve import require_tools, serve_in_thread, wait_until
from tts_core.config import Settings
from tts_core.request.operating import OperatorSettings

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

TOKEN = "redis-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
LIMITED = json.dumps({"tiers": {"free": {"rate_limit": "1000/minute"}, "pro": {}}, "anonymous_tier": "free"})


class HungListener:
    """A server that accepts connections and never answers: a hung Redis."""

    def __init__(self):
        self.socket = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self.socket.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with self.socket:
            while True:
                try:
                    self.accepted.append(self.socket.accept()[0])
                except OSError:  # closed
                    return

    def close(self) -> None:
        with contextlib.suppress(OSError):  # closed already
            self.socket.shutdown(socket.SHUT_RDWR)  # wakes the accept() in progress, so the port is free
        self.socket.close()
        for connection in self.accepted:
            connection.close()


def start_redis(port: int, folder) -> subprocess.Popen:
    process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--dir", str(folder)], stdout=subprocess.DEVNULL)
    def answers() -> bool:
        assert process.poll() is None, "redis-server exited"
        try:
            ping = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, timeout=2)
        except subprocess.TimeoutExpired:
            return False
        return ping.stdout.strip() == b"PONG"

    assert wait_until(answers, 10)
    return process


@pytest.fixture(scope="module")
def hung():
    listener = HungListener()
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def servers(hung, tmp_path_factory):
    """Two servers side by side, alike but for the rate-limit store: in memory, and the hung listener."""
    plain = start_server(tmp_path_factory.mktemp("plain"), admin_token=TOKEN, calibration_sizes="1",
                         operator_defaults=LIMITED)
    stuck = start_server(tmp_path_factory.mktemp("hung"), admin_token=TOKEN, calibration_sizes="1",
                         operator_defaults=LIMITED, redis_cooldown_s="1",
                         ratelimit_storage=f"redis://127.0.0.1:{hung.port}/0")
    yield plain, stuck
    plain.stop()
    stuck.stop()


def timed(method, url: str, **options) -> float:
    started = time.perf_counter()
    response = httpx.request(method, url, timeout=30, **options)
    assert response.status_code < 500, response.text[:200]
    return time.perf_counter() - started


def test_requests_and_health_stay_fast_with_a_hung_store(servers):
    plain, stuck = servers
    times = {plain.base_url: [], stuck.base_url: []}
    for _ in range(12):  # spread over more than the 1 s cool-down, so the breaker's probes are in it
        for base, seen in times.items():
            seen.append(timed("GET", f"{base}/v1/audio/jobs"))  # rate-limited, no synthesis
            seen.append(timed("GET", f"{base}/health"))
            seen.append(timed("POST", f"{base}/v1/audio/speech", json={"model": "tts-1", "voice": "alloy",
                                                                       "input": "Hi.", "response_format": "wav"}))
    base_times, stuck_times = times[plain.base_url], times[stuck.base_url]
    assert statistics.median(stuck_times) < statistics.median(base_times) + 0.25, (base_times, stuck_times)
    assert max(stuck_times) < max(base_times) + 1.5, (base_times, stuck_times)


def test_a_websocket_utterance_does_not_hold_up_the_event_loop(servers):
    _, stuck = servers
    ws_url = stuck.base_url.replace("http", "ws") + "/v1/audio/speech/stream"
    health, done = [], threading.Event()

    def poll_health():
        while not done.is_set():
            health.append(timed("GET", f"{stuck.base_url}/health"))

    poller = threading.Thread(target=poll_health)
    poller.start()
    try:
        with connect(ws_url) as socket_:
            for n in range(6):
                socket_.send(json.dumps({"text": f"Utterance number {n}."}))
                while True:
                    message = socket_.recv(timeout=30)
                    if isinstance(message, str) and json.loads(message)["type"] in ("done", "error"):
                        assert json.loads(message)["type"] == "done", message
                        break
    finally:
        done.set()
        poller.join()
    assert health and max(health) < 1.0, health


def test_the_breaker_opens_shows_since_when_and_a_real_redis_closes_it(servers, hung, tmp_path):
    require_tools("redis-server", "redis-cli", install="apt-get install redis-server")
    _, stuck = servers

    def store() -> dict:
        return httpx.get(f"{stuck.base_url}/admin/api/stats", headers=ADMIN).json()["storage"]["rate_limit_store"]

    opened = store()
    assert opened["state"] in ("open", "half_open") and opened["since"] <= time.time() and opened["error"]
    assert stuck.log_path.read_text().count("rate-limit store failing") == 1  # once, not per request
    hung.close()
    redis = start_redis(hung.port, tmp_path)  # the store comes back on the same address
    try:
        def probe() -> bool:  # each request may be the half-open probe
            httpx.get(f"{stuck.base_url}/v1/audio/jobs")
            return store()["state"] == "closed"

        assert wait_until(probe, 30)
        assert store()["since"] is None and "answers again" in stuck.log_path.read_text()
        spoken = httpx.post(f"{stuck.base_url}/v1/audio/speech", timeout=60,
                            json={"model": "tts-1", "voice": "alloy", "input": "Counted.", "response_format": "wav"})
        assert spoken.headers["x-ratelimit-limit"] == "1000"  # limits apply again
    finally:
        redis.terminate()
        redis.wait(10)


def test_an_absent_store_is_reported_at_start_up_and_once(tmp_path, caplog):
    absent = f"redis://127.0.0.1:{free_port()}/0"
    settings = Settings(data_dir=tmp_path, ratelimit_storage=absent, admin_token=TOKEN, calibration_sizes=[1],
                        model_aliases={}, voice_aliases={}, operator_defaults=json.loads(LIMITED))
    with caplog.at_level(logging.WARNING, logger="access.control"):
        app = create_app(settings, engines=[FakeEngine()])
        assert [r.getMessage() for r in caplog.records if "start-up" in r.getMessage()], caplog.text
        with serve_in_thread(app) as base:
            for _ in range(5):
                assert httpx.get(f"{base}/v1/audio/jobs").status_code == 200  # served, without limits
            state = httpx.get(f"{base}/admin/api/stats", headers=ADMIN).json()["storage"]["rate_limit_store"]
    assert state["state"] == "open" and absent in state["uri"]
    assert sum("rate-limit store failing" in r.getMessage() for r in caplog.records) == 1


def test_the_check_runs_off_the_event_loop(tmp_path):
    """The store's round trip (made slow here) happens in a worker thread: the loop keeps ticking."""
    storage = Storage(sqlite_url(tmp_path / "c.db"))
    storage.migrate()
    access = AccessControl(storage, Settings(), OperatorSettings)
    access.remote = True  # as a Redis store is

    def slow_hit(*args, **options):  # slowapi passes cost=
        time.sleep(0.5)
        return True

    access.strategy.hit = slow_hit

    async def admit_while_ticking() -> int:
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        await access.admit(None, "192.0.2.1", None)
        ticker.cancel()
        return ticks

    assert asyncio.run(admit_while_ticking()) >= 10


def test_the_breaker_opens_after_failures_probes_once_after_the_cool_down_and_logs_each_outage_once(caplog):
    now = [0.0]
    breaker = CircuitBreaker(cool_down_s=10, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="access.control"):
        for _ in range(2):
            breaker.failed("timeout")
        assert breaker.allow() and breaker.state()["state"] == "closed"  # two failures alone do not open it
        breaker.failed("timeout")
        assert not breaker.allow() and breaker.state()["state"] == "open"
        now[0] = 10.0
        assert breaker.allow() and not breaker.allow()  # one probe at a time
        breaker.failed("timeout")  # the probe failed: open for another cool-down, no new line
        assert not breaker.allow()
        now[0] = 20.0
        assert breaker.allow()
        breaker.succeeded()
        assert breaker.state() == {"state": "closed", "since": None, "error": None} and breaker.allow()
    messages = [record.getMessage() for record in caplog.records]
    assert sum("failing" in message for message in messages) == 1
    assert sum("answers again" in message for message in messages) == 1
