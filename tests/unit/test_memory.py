"""Device-memory-aware batching: the memory budget, and surviving out-of-memory; the host heap's arenas."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.fakes import FakeEngine
from tests.serve import wait_until
from tests.unit.conftest import make_item
from tts_core.config import Settings
from tts_core.ops.metrics import Metrics
from tts_core.scheduler.engine_loop import RELEASE_AFTER_IDLE_S
from tts_core.scheduler.memory import MemoryBudget
from tts_core.scheduler.policy import make_policy
from tts_core.service import SpeechService

LIMIT = 400  # padded tokens the fake device holds


class SmallDeviceEngine(FakeEngine):
    """Raises CUDA's out-of-memory error for any call above LIMIT padded tokens."""

    out_of_memory_errors = (torch.cuda.OutOfMemoryError,)
    released = 0

    def synthesize(self, batch):
        if len(batch) * max(item.length for item in batch) > LIMIT:
            self.seen.append([int(item.tokens[0]) for item in batch])
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return super().synthesize(batch)

    def release_memory(self):
        self.released += 1


def test_out_of_memory_splits_the_batch_lowers_the_budget_and_loses_nothing(start_loop, clock):
    engine = SmallDeviceEngine(clock=clock)
    batcher = start_loop(engine, policy="static", max_batch_size=8)  # always tries 8 at once
    items = [make_item(100, tag=index + 1) for index in range(16)]
    batcher.submit(items)
    clock.sleep(0.6)  # a batch smaller than 8 runs once static's 0.5 s wait is over
    audio = [item.future.result(timeout=10).audio for item in items]
    assert [round(float(chunk[0]) * 1000) for chunk in audio] == list(range(1, 17))  # every one, its own
    assert batcher.memory.out_of_memory_count >= 1 and engine.released >= 1
    assert batcher.memory.tokens() <= LIMIT  # the budget shrank below what failed
    later = [make_item(100, tag=50 + index) for index in range(8)]
    batcher.submit(later)
    clock.sleep(0.6)
    for item in later:
        item.future.result(timeout=10)
    assert all(len(batch) * 100 <= LIMIT for batch in engine.seen[-2:])  # planned within the budget now


class ReleasingEngine(FakeEngine):
    """Notes the (simulated) moment of each release of its memory."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.releases: list[float] = []

    def release_memory(self):
        self.releases.append(self.clock.now())


def test_memory_goes_back_once_the_engine_was_idle_a_while_not_between_one_callers_requests(start_loop, clock):
    """A caller that sends its sentences one after another does not pay a release (and the arena's regrowth)
    at each."""
    engine = ReleasingEngine(clock=clock)
    loop = start_loop(engine, policy="sequential")

    def idle_until_released(count: int) -> bool:  # simulated time passes while the engine waits
        return wait_until(lambda: clock.sleep(0.25) or len(engine.releases) >= count, every_s=0.01)

    assert idle_until_released(1)  # the calibration's
    for index in range(3):
        item = make_item(50, tag=index + 1)
        loop.submit([item])
        item.future.result(timeout=10)
        clock.sleep(RELEASE_AFTER_IDLE_S / 2)  # the next sentence comes a moment later
    assert len(engine.releases) == 1
    last_done = clock.now() - RELEASE_AFTER_IDLE_S / 2
    assert idle_until_released(2)
    assert engine.releases[1] >= last_done + RELEASE_AFTER_IDLE_S


def test_an_item_too_large_even_alone_fails_alone_with_a_clear_error(start_loop, clock):
    engine = SmallDeviceEngine(clock=clock)
    batcher = start_loop(engine, policy="sequential")
    huge, small = make_item(LIMIT + 1, tag=1), make_item(10, tag=2)
    batcher.submit([huge, small])
    assert small.future.result(timeout=10) is not None
    with pytest.raises(Exception, match="does not fit in device memory even alone"):
        huge.future.result(timeout=10)


def test_the_budget_comes_from_free_memory_less_the_reserve_and_the_policy_takes_the_smaller():
    engine = FakeEngine()
    engine.bytes_per_padded_token = 1000.0
    engine.free_memory_bytes = lambda: 3_000_000
    budget = MemoryBudget(engine, reserve_bytes=1_000_000)
    assert budget.tokens() == 2000
    budget.out_of_memory(1600)
    assert budget.tokens() == 800  # the cap (half the failed batch) is now the smaller
    policy = make_policy("window", 16, 100_000)
    queued = [make_item(100) for _ in range(16)]
    assert len(policy.plan(queued, now=1e9).take) == 16
    assert len(policy.plan(queued, now=1e9, memory_tokens=budget.tokens()).take) == 8


def test_cpu_engines_have_no_memory_budget():
    assert MemoryBudget(FakeEngine(), reserve_bytes=2**31).tokens() is None


def test_status_reports_the_budget_and_out_of_memory_count():
    service = SpeechService(Settings(voice_aliases={}, model_aliases={}), [SmallDeviceEngine()], Metrics())
    engine_status = service.status()["engines"]["fake"]
    assert engine_status["memory_token_budget"] is None and engine_status["out_of_memory"] == 0


def test_nvml_readings_become_gauges_and_no_gpu_leaves_them_out():
    from prometheus_client import generate_latest

    from tts_core.ops.metrics import Metrics

    metrics = Metrics()
    metrics.device_reading(None)
    assert "tts_gpu" not in generate_latest(metrics.registry).decode()  # no GPU: no reading, not a 0
    metrics.device_reading({"free_mb": 1024.0, "total_mb": 4096.0, "used_fraction": 0.75, "utilization_pct": 40})
    text = generate_latest(metrics.registry).decode()
    assert "tts_gpu_free_memory_bytes 1.073741824e+09" in text and "tts_gpu_utilization_percent 40.0" in text


ARENAS_AFTER_THREADS = """
import ctypes, ctypes.util, sys, tempfile, threading
from tts_core.scheduler.memory import limit_heap_arenas
if sys.argv[1] == "limited":
    assert limit_heap_arenas()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes, libc.fclose.argtypes = [ctypes.c_int, ctypes.c_void_p], [ctypes.c_void_p]
start = threading.Barrier(8)

def allocate():
    start.wait()
    for _ in range(5000):
        [bytes(200) for _ in range(20)]

threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
with tempfile.NamedTemporaryFile("r") as report:
    stream = libc.fopen(report.name.encode(), b"w")
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    print(report.read().count("<heap nr="))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_threads_that_allocate_share_two_heap_arenas_once_limited():
    """glibc's default gives each thread that allocates an arena of its own (up to 8 per core), each
    keeping memory no trim gives back; app.create_app caps them (tts_core/memory.py)."""
    def arenas(mode: str) -> int:
        env = {key: value for key, value in os.environ.items() if key != "MALLOC_ARENA_MAX"}
        run = subprocess.run([sys.executable, "-c", ARENAS_AFTER_THREADS, mode], capture_output=True, text=True,
                             cwd=Path(__file__).parents[2], env=env, timeout=120)
        assert run.returncode == 0, run.stderr
        return int(run.stdout)

    assert arenas("limited") <= 2 < arenas("default")
