"""`python -m bench --quick`: the peer benchmark's smoke run. It checks that the harness runs end
to end and its JSON is complete, not the speed (that is what the full run and docs/ are for)."""

import importlib.util
import json
import subprocess
import sys

import pytest

from bench.harness import PEERS, RAY_PEER
from bench.report import write_docs
from bench.server import ROOT

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)


@pytest.mark.loopback_namespace  # its Ray Serve peer, where Ray is installed
@pytest.mark.timeout(900)  # a few minutes here; CI's machine is slower
def test_quick_benchmark_runs_every_peer_and_writes_complete_results(tmp_path):
    run = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=800)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    ray = importlib.util.find_spec("ray") is not None  # the optional Ray Serve peer runs where Ray is installed
    assert set(results["peers"]) == set(PEERS) | ({RAY_PEER} if ray else set())
    for name, peer in results["peers"].items():
        mixed = peer["closed"]["mixed"]
        assert mixed["ok"] > 0 and mixed["audio_s_per_s"] > 0 and mixed["p99_ms"] >= mixed["p50_ms"] > 0, name
        assert mixed["server"]["batches"] > 0 and sum(mixed["server"]["batch_size_distribution"].values()) > 0
        assert len(peer["open"]) == 2 and all(row["offered_per_s"] > 0 and row["completed_per_s"] >= 0
                                              for row in peer["open"])
        assert peer["streams"]["first_audio_p50_ms"] > 0 and peer["idle_p50_ms"] > 0
        assert isinstance(peer["idle_overhead_ms"], float), name
        assert len(peer["mixed_rounds"]) == 2 and all(value > 0 for value in peer["mixed_rounds"]), name
        assert peer["mixed_all_rounds"]["ok"] > mixed["ok"], name  # every round's requests, pooled
    for rounds in (results["control_rounds"], results["ceiling_rounds"]):
        assert len(rounds) == 2 and all(value > 0 for value in rounds)
    assert results["engine"]["idle_p50_ms"] > 0
    assert results["engine"]["ceiling"]["mixed"]["audio_s_per_s"] > 0
    assert set(results["ratios"]) >= {"chorus_vs_sequential", "chorus_vs_static", "chorus_vs_ceiling",
                                      "short_p95_vs_sequential", "idle_ms_over_raw", "control_vs_sequential"}
    for name, (low, high) in results["ratio_ranges"].items():
        assert 0 < low <= results["ratios"][name] <= high, name
    assert set(results["verdicts"]) == set(results["targets"])
    copies = results["engine"]["copies"]  # the bundled voice's copies alone, one against two (this CPU has two cores)
    assert {"1", "2"} <= set(copies["audio_s_per_s"]) and all(len(values) == 2 and min(values) > 0
                                                                 for values in copies["audio_s_per_s"].values())
    assert results["ratios"]["copies_alone_vs_one"] == copies["best_vs_one"] > 0
    assert results["peers"]["chorus"]["status"]["engines"][results["voice"]]["instances"] >= 1
    assert (tmp_path / "report.html").stat().st_size > 10_000
    assert "targets (CPU" in run.stdout
    assert_precision_measured(results["precision"], run.stdout)  # the bundled voice's, after the servers
    write_docs(results, tmp_path / "docs", "python -m bench --quick")  # the docs page renders from the JSON
    page = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "| engine ceiling (no server) |" in page and "| chorus_vs_ceiling |" in page


# Its quick plan is fixed work: three servers started, two 5 s rounds of 4 clients and a 10 s overload, each waited
# out until the requests in flight are answered. On a loaded two-core machine the rounds' requests wait in the
# upstream's queue (the random model is built first from a fresh clone): the run is given what that takes, and
# tests/conftest.py stops its servers should it still run out.
@pytest.mark.timeout(1500)
def test_the_upstream_benchmark_runs_both_ways_and_writes_its_ratios(tmp_path):
    """`python -m bench --upstream --quick` on the tiny random Pocket TTS (its figures mean nothing: the run is)."""
    run = subprocess.run([sys.executable, "-m", "bench", "--upstream", "--quick", "--voice", "pocket-tiny",
                          "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=1440)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((tmp_path / "upstream.json").read_text())
    for name in ("straight", "front"):
        assert [row["ok"] > 0 and row["audio_s_per_s"] > 0 for row in results["rounds"][name]] == [True], name
    assert results["overload"]["requests"] > 0 and results["overload"]["upstream_made_per_s"] > 0
    assert results["front_policy"]["name"] == "upstream" and results["front_policy"]["limit"] >= 1
    assert set(results["verdicts"]) == {"throughput_vs_straight", "short_p95_vs_straight", "overload_upstream_vs_best"}
    assert set(results["ratios"]) == {*results["verdicts"], "clients_audio_vs_straight"}
    assert results["ratios"]["throughput_vs_straight"] > 0


def assert_precision_measured(results: dict, said: str) -> None:
    """The bundled voice at each level (`python -m bench --precision --quick`'s run, which the quick benchmark makes
    after its servers): each level's speed and word error rate, their ratios and verdicts, printed."""
    for level in ("full", "int8"):
        row = results["levels"][level]
        assert row["audio_s_per_s"] > 0 and len(row["rounds"]) == 1 and 0 <= row["word_error_rate"] < 0.5, level
    assert set(results["ratios"]) == {"int8_vs_full", "wer_int8_minus_full"}
    assert results["ratios"]["int8_vs_full"] > 0 and abs(results["ratios"]["wer_int8_minus_full"]) < 0.5
    assert set(results["verdicts"]) == set(results["ratios"]) and set(results["verdicts"].values()) <= {"met", "MISSED"}
    assert "int8_vs_full" in said and "wer_int8_minus_full" in said and "target >= 1.3" in said
