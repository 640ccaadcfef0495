"""The GPU check's own logic, fast (the whole check on the CPU: tests/integration/test_gpu_check.py): its time
budget, the verdict on a run that finished too few of its callers' requests, the stop that waits for a loop's
threads, and the page rendered from a small JSON."""

import math
import threading

import numpy as np
import pytest

from bench.gpu_report import render
from bench.gpu_runs import Budget, Tally, closed_loop, fate, loop_threads, stop_and_wait, summary, verdicts
from bench.gpu_stepped import step_times
from tests.fakes import FakeEngine, FakeSteppedEngine
from tts_core.engines.contract import EngineInput
from tts_core.ops.metrics import Metrics
from tts_core.scheduler.queue import RequestQueue
from tts_core.scheduler.records import QueuedItem
from tts_core.scheduler.strategies import make_engine_loop


def test_a_part_may_use_what_the_parts_before_it_left_and_is_refused_past_its_moment(clock):
    budget = Budget({"vits": 90.0, "pocket_tts": 90.0, "kokoro": 180.0}, now=clock.now)
    assert budget.total_s == 360 and budget.deadline("pocket_tts") == 180
    clock.sleep(40)  # VITS ended early: its 50 s left go to the next part
    assert budget.left("pocket_tts") == 140 and budget.refuses("pocket_tts", 140) is None
    why = budget.refuses("pocket_tts", 141)
    assert why.startswith("not started: it needs about 141 s and 140 s of the part's time were left")
    clock.sleep(200)  # a part that overran leaves the next less
    assert budget.refuses("kokoro", 121) and budget.refuses("kokoro", 120) is None


def test_a_run_that_answered_one_request_while_the_others_waited_the_whole_run_failed():
    # the first H200 run's Pocket TTS: 1 request served in 15 s, 16 callers
    spin = Tally(sent=17, latencies=[0.8], audio_s=2.0, unanswered=[15.0] * 15 + [1.0])
    verdict = fate(spin)
    assert verdict["failed"] and verdict["why"].startswith("finished 1 of the 16 requests its callers sent")
    none_answered = fate(Tally(sent=4, unanswered=[0.5] * 4))  # every unanswered one counts
    assert none_answered["failed"] and none_answered["why"].startswith("finished 0 of the 4 requests")
    assert fate(Tally())["failed"]  # nothing sent at all


def test_a_slow_policy_is_not_failed_for_the_requests_the_runs_end_cut():
    # sequential, 8 callers: each request waits for the others', and one of each caller's is in flight at the end
    sequential = Tally(sent=14, latencies=[1.0, 2.0, 3.0, 4.0, 4.0, 4.0], unanswered=[3.9, 3.5, 3.0, 2.0, 1.0, 4.0,
                                                                                       4.0, 4.0])
    assert fate(sequential) == {"failed": False}
    erring = Tally(sent=6, latencies=[1.0, 1.0], errors=4)  # most requests answered with an error
    assert fate(erring)["failed"] and "(4 failed, 0 unanswered" in fate(erring)["why"]


def test_verdicts_say_met_missed_or_not_measured():
    targets = {"wall_vs_busy": ("<=", 3.0), "speed": (">=", 1.4), "every_batch": ("==", True), "codec": (">=", 1.0)}
    assert verdicts({"wall_vs_busy": 3.0, "speed": 1.2, "every_batch": True, "codec": None}, targets) == {
        "wall_vs_busy": "met", "speed": "missed", "every_batch": "met", "codec": "not measured"}


@pytest.fixture
def gated_loop():
    """A loop on a fake engine whose calls wait until the test opens its gate."""
    engine = FakeEngine()
    before = set(threading.enumerate())
    loop = make_engine_loop(engine, RequestQueue(64), Metrics(), "sequential", calibration_sizes=(1,))
    loop.start()
    assert loop.calibrated.wait(30)
    engine.calls_started = threading.Semaphore(0)
    engine.gate.clear()
    yield engine, loop, loop_threads(before)
    engine.gate.set()
    loop.stop()


def _item(position: int) -> QueuedItem:
    return QueuedItem(EngineInput(np.full(4, 7, dtype=np.int64), "fake-voice"), key="k", deadline=math.inf)


def test_callers_of_a_wedged_loop_give_up_at_the_runs_end_and_the_run_is_marked_failed(gated_loop):
    engine, loop, _ = gated_loop
    tally = closed_loop(loop, _item, clients=3, seconds=0.05, drain_s=0.0, sample_rate=engine.sample_rate)
    assert tally.sent == 3 and not tally.latencies and len(tally.unanswered) == 3
    assert fate(tally)["failed"] and fate(tally)["why"].startswith("finished 0 of the 3 requests")


def test_a_stopped_loop_still_inside_a_batch_is_waited_for_and_what_still_runs_is_said(gated_loop):
    engine, loop, threads = gated_loop
    assert [thread.name for thread in threads] == ["engine-fake"]
    loop.submit([_item(0)])
    assert engine.calls_started.acquire(timeout=30)  # the engine is inside the batch, held at its gate
    row = stop_and_wait(loop, threads, wait_s=0.01)
    assert row["threads_left"] == ["engine-fake"]
    engine.gate.set()  # the batch ends: the loop's thread ends with it
    assert stop_and_wait(loop, threads)["stop_s"] < 30 and not any(thread.is_alive() for thread in threads)


def test_steps_are_timed_at_each_running_size_the_engine_holds_and_never_past_a_requests_end():
    engine = FakeSteppedEngine(max_running=8)
    rows = step_times(engine, np.full(40, 7, dtype=np.int64), timed_steps=5)
    assert rows[2] == {"running": 16, "skipped": "the engine runs at most 8"}
    assert [(row["running"], row["steps"], row["busy_share"], row["busy"]) for row in rows[:2]] == [
        (1, 5, None, "not measured (no CUDA device)"), (4, 5, None, "not measured (no CUDA device)")]
    assert all(row["wall_ms"] >= 0 for row in rows[:2]) and engine.steps_run == [1] * 8 + [4] * 8  # 3 warm, 5 timed
    assert engine.running() == []  # released, for the ceiling next
    engine.steps_run.clear()
    short = step_times(engine, np.full(6, 7, dtype=np.int64), timed_steps=5)  # 6 frames: its first, 3 warm, 2 timed
    assert [row["steps"] for row in short[:2]] == [2, 2] and engine.steps_run == [1] * 5 + [4] * 5


def small_result(failed_run: bool = True) -> dict:
    """A GPU check's JSON, cut down: VITS with two runs (one failed), Pocket TTS with its steps, VibeVoice skipped."""
    served = [{"policy": "static", "audio_s_per_s": 556.0, "requests_per_s": 40.0, "p50_ms": 900.0, "p95_ms": 2120.0,
               "avg_batch_size": 8.0, "requests": 400, "sent": 464, "errors": 0, "out_of_memory": 0, "stop_s": 0.2,
               "failed": False},
              {"policy": "adaptive", "audio_s_per_s": 681.0, "requests_per_s": 9.0, "p50_ms": 700.0, "p95_ms": 1400.0,
               "avg_batch_size": 30.6, "requests": 3, "sent": 70, "errors": 0, "out_of_memory": 0, "stop_s": 0.1,
               **({"failed": True, "why": "finished 3 of the 67 requests its callers sent"} if failed_run
                  else {"failed": False})}]
    vits = {"model": {"config": "tiny", "parameters_m": 0.34, "sample_rate": 16000},
            "sweep": [{"batch_size": 1, "runs": 9, "seconds_per_batch": 0.0091, "audio_s_per_s": 110.0,
                       "real_tokens_per_s": 900.0, "padded_tokens": 80}],
            "ceiling_audio_s_per_s": 1036.0,
            "low_precision": {"offered": True, "dtypes_after": ["float16", "float32"], "every_batch_ran": False,
                              "low_vs_full": None, "failed": True, "why": "1 of 1 batch sizes failed",
                              "sweep": [{"batch_size": 1, "error": "ValueError: Discriminant has negative values"}]},
            "served": served, "skipped_runs": [{"policy": "sequential", "skipped": "not started: it needs about 18 s"}],
            "ratios": {"adaptive_vs_static": 1.225, "adaptive_vs_ceiling": 0.657, "low_precision_every_batch": False,
                       "low_vs_full": None, "adaptive_vs_sequential": None},
            "targets": {"adaptive_vs_static": [">=", 1.4], "adaptive_vs_ceiling": [">=", 0.8],
                        "low_precision_every_batch": ["==", True], "low_vs_full": [">=", 1.3]},
            "verdicts": {"adaptive_vs_static": "missed", "adaptive_vs_ceiling": "missed",
                         "low_precision_every_batch": "missed", "low_vs_full": "not measured"}, "seconds": 80.0}
    pocket = {"model": {"config": "tiny", "parameters_m": 0.2, "dtype": "bfloat16", "frame_rate": 12.5,
                        "sample_rate": 24000, "max_running": 16, "decodes_apart": True},
              "plan": {"clients": 16, "served_s": 10.0, "workload": "mixed", "max_tokens": None},
              "step_times": [{"running": 16, "steps": 10, "wall_ms": 105.0, "device_span_ms": 104.0, "busy_ms": 0.86,
                              "busy_share": 0.0082, "wall_vs_busy": 122.09}],
              "ceiling": {"requests": 16, "seconds": 3.0, "audio_s_per_s": 30.0, "frames_per_step": 14.2},
              "low_precision": {"offered": False, "why": "the engine offers no lower precision"},
              "served": [{"policy": "adaptive", "audio_s_per_s": 21.3, "frames_per_step": 14.0, "steps": 150,
                          "requests_done": 13, "sent": 29, "delivered_audio_s_per_s": 20.1, "p50_ms": 4000.0,
                          "p95_ms": 7000.0, "out_of_memory": 0, "stop_s": 0.3, "failed": False}],
              "skipped_runs": [], "ratios": {"adaptive_audio_s_per_s": 21.3, "step_wall_vs_busy_at_16": 122.09},
              "targets": {"adaptive_audio_s_per_s": [">=", 106.5], "step_wall_vs_busy_at_16": ["<=", 3.0]},
              "verdicts": {"adaptive_audio_s_per_s": "missed", "step_wall_vs_busy_at_16": "missed"}, "seconds": 90.0}
    result = {"device": "cuda", "gpu": "NVIDIA H200", "gpu_memory_gb": 139.8, "plan_name": "full", "torch": "2.11",
              "python": "3.12", "plan": {"sentences": 512, "clients": 64, "served_s": 10.0},
              "vits": vits, "stepped": {"pocket_tts": pocket, "vibevoice": {"skipped": "not started", "seconds": 0.0}},
              "kokoro": {"skipped": "not started: it needs about 170 s", "seconds": 0.0}}
    budget = Budget({"vits": 90.0, "pocket_tts": 90.0, "vibevoice": 110.0, "kokoro": 180.0})
    result.update(summary(result, budget))
    return result


def test_the_summary_gathers_every_failure_and_every_skip():
    result = small_result()
    assert result["failed"] and result["failures"] == ["vits adaptive: finished 3 of the 67 requests its callers sent",
                                                       "vits lower precision: 1 of 1 batch sizes failed"]
    assert result["parts"]["vits"]["skipped"] == ["sequential: not started: it needs about 18 s"]
    assert result["parts"]["vibevoice"]["skipped"] == ["not started"] and result["parts"]["kokoro"]["by_s"] == 470


def test_the_page_shows_failures_first_and_each_figure_beside_its_target():
    page = render(small_result())
    assert page.index("**FAILED**:") < page.index("## Time") < page.index("## VITS")
    assert "- vits adaptive: finished 3 of the 67 requests its callers sent" in page
    assert "| adaptive | 681.0 | 9.0 | 700.0 | 1400.0 | 30.6 | 3 of 70 | 0 | 0 | 0.1 | FAILED: finished 3" in page
    assert "| 1 | FAILED: ValueError: Discriminant has negative values | n/a | n/a |" in page
    assert "| adaptive_vs_static | 1.225 | >= 1.4 | missed |" in page
    assert "| step_wall_vs_busy_at_16 | 122.09 | <= 3.0 | missed |" in page
    assert "| 16 | 105.0 | 0.86 | 0.0082 | 122.09 |" in page
    assert "| adaptive_vs_sequential | n/a |  |  |" in page  # a figure without a target
    assert "- sequential skipped: not started: it needs about 18 s" in page
    assert "### vibevoice\n\nSkipped: not started." in page and "| kokoro | 180 | 470 | 0.0 | not started" in page
    passing = render(small_result(failed_run=False) | {"failed": False, "failures": []})
    assert "**FAILED**" not in passing.split("## Time")[0]
