"""`python -m bench --soak`: the soak's smoke run, a few seconds per phase against a real server.
It checks that every request is accounted for and got a definite answer, and that the JSON is
complete; not the targets (memory, recovery, 503s), which only a soak of minutes measures."""

import json
import subprocess
import sys

import pytest

from bench.server import ROOT
from bench.soak import EDGE_S, KINDS, LOST, PHASES, TARGETS, Answer, recovery, refused_outside_overload

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)


@pytest.mark.timeout(900)  # a few minutes here; CI's machine is slower
def test_tiny_soak_answers_every_request_and_writes_complete_results(tmp_path):
    # 0.1 minutes: each phase 3 s (and until its first request, bench.soak.offer)
    run = subprocess.run([sys.executable, "-m", "bench", "--soak", "0.1", "--out", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=800)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "soak.json").read_text())
    answers = result["answers"]

    assert {answer["kind"] for answer in answers} == set(KINDS)
    assert {answer["phase"] for answer in answers} == set(PHASES)
    lost = [answer for answer in answers if answer["status"] in LOST]
    assert not lost, lost[:5]  # nothing timed out, broke off or failed to connect
    assert all(answer["status"].isdigit() for answer in answers)
    assert result["lost"] == dict.fromkeys(LOST, 0) and result["measured"]["lost"] == 0
    assert all(answer["audio_s"] > 0 for answer in answers if answer["status"] == "200")

    table = result["table"]
    assert set(table) == set(PHASES)
    assert sum(table[phase]["all"]["requests"] for phase in PHASES) == len(answers)
    for phase in PHASES:
        assert table[phase]["all"]["requests"] == sum(table[phase][kind]["requests"] for kind in KINDS)
    assert table["capacity"]["all"]["p95_ms"] >= table["capacity"]["all"]["p50_ms"] > 0

    bounds, rates = result["bounds_s"], result["rates_per_s"]
    assert bounds["before"][1] <= bounds["overload"][0] < bounds["overload"][1] <= bounds["after"][0]
    assert rates["overload"] > rates["before"] == rates["after"] > 0 and result["capacity"]["requests_per_s"] > 0
    server = result["server"]
    assert server["after_warm_up"]["rss_mb"] > 0 and server["end"]["rss_mb"] > 0 and server["end"]["open_files"] > 0
    assert result["samples"] and all(sample["rss_mb"] > 0 for sample in result["samples"])
    assert set(result["verdicts"]) == set(result["measured"]) == set(TARGETS)
    assert "targets:" in run.stdout and "recovery" in run.stdout


def _refused(at: float) -> Answer:
    return Answer("after", "plain", 0, "503", at, 0.01, None, 0.0, 1.0, "")


def test_recovery_is_the_last_bad_moment_before_a_clean_hold():
    bounds = {"before": [0, 10], "overload": [10, 20], "after": [20, 60]}
    samples = [{"t": t, "queue_length": 2} for t in range(10)]  # the 70% level: 2
    samples += [{"t": t, "queue_length": 50 if t < 27 else 1} for t in range(20, 60)]
    result = recovery([_refused(21.0), _refused(29.5)], samples, bounds, hold_s=10)
    assert result["queue_level"] == 2 and result["seconds"] == 9.5  # the queue at 26, the last 503 at 29.5
    assert recovery([_refused(55.0)], samples, bounds, hold_s=10)["seconds"] == 6.0  # a later relapse is not
    assert recovery([], [{**s, "queue_length": 50} for s in samples[10:]] + samples[:10], bounds,
                    hold_s=10)["seconds"] is None  # never back within the run


def test_a_refusal_sent_at_the_overloads_edge_is_the_overloads():
    bounds = {"before": [0, 10], "overload": [10, 20], "after": [20, 60]}
    answers = [_refused(20.01), _refused(20.0 + EDGE_S - 0.01), _refused(20.0 + EDGE_S + 0.01), _refused(45.0),
               Answer("before", "sse", 0, "503", 5.0, 0.01, None, 0.0, 1.0, ""),
               Answer("overload", "ws", 0, "503", 15.0, 0.01, None, 0.0, 1.0, ""),
               Answer("capacity", "plain", 0, "503", -20.0, 0.01, None, 0.0, 1.0, "")]
    assert refused_outside_overload(answers, bounds) == {"outside": 3, "edge": 2, "saturation": 1}
