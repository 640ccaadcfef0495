"""`python -m bench.dialogue --quick`: the dialogue benchmark's smoke run, end to end on a real server (the bundled
Piper voice and a tiny random Pocket TTS). It checks that every way is measured and its JSON complete, and that the
dialogue's recording is its turns plus the pauses between them; not the speed (that is the full run's and docs/')."""

import json
import subprocess
import sys

import pytest

from bench.dialogue import ENGINES, PLANS, pauses_s, plan_turns
from bench.dialogue_report import PAGE, write_docs
from bench.server import ROOT

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)


@pytest.mark.timeout(900)  # about a minute here; a loaded two-core machine takes several
def test_the_quick_dialogue_benchmark_measures_every_way_and_its_recording_is_the_turns_and_pauses(tmp_path):
    run = subprocess.run([sys.executable, "-m", "bench.dialogue", "--quick", "--out", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=840)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((tmp_path / "dialogue.json").read_text())
    turns = plan_turns(PLANS["quick"])
    assert results["script"]["turns"] == len(turns) and results["script"]["speakers"] == 3
    assert set(results["engines"]) == set(ENGINES)
    for name, engine in results["engines"].items():
        assert len(engine["rounds"]) == PLANS["quick"]["rounds"], name
        for way in ("dialogue", "sequential", "concurrent"):
            row = engine["ways"][way]
            assert row["wall_s"] > 0 and row["audio_s"] > 0 and row["audio_s_per_s"] > 0, (name, way)
            assert row["items_per_batch"] >= 1, (name, way)  # the server's batches (a stepped engine's steps)
        for round_ in engine["rounds"]:
            assert len(round_["sequential"]["turns_s"]) == len(round_["concurrent"]["turns_s"]) == len(turns)
            assert all(seconds > 0 for seconds in round_["sequential"]["turns_s"]), name
            assert all(round_[way]["server"]["batches"] > 0 for way in ("dialogue", "sequential", "concurrent")), name
        assert set(engine["ratios"]) == set(engine["ranges"]) == {
            "dialogue_vs_sequential", "dialogue_vs_concurrent", "first_audio_vs_turn"}
        assert all(ratio > 0 for ratio in engine["ratios"].values()), name
        assert engine["first_audio"]["dialogue_ms"] > 0 and engine["first_audio"]["first_turn_ms"] > 0, name
        for length in engine["lengths"]:  # the recording: the turns one by one plus the pauses between them
            assert length["pauses_s"] == pytest.approx(pauses_s(turns))
            assert length["recording_s"] == pytest.approx(length["turns_s"] + length["pauses_s"],
                                                          rel=results["length_tolerance"]), name
            assert length["streamed_recording_s"] == pytest.approx(length["recording_s"],
                                                                   rel=results["length_tolerance"]), name
        assert engine["lengths_agree"], name
    pocket = results["engines"]["pocket-tiny"]["lengths"][0]  # its lengths are the model's budget: exact
    assert pocket["recording_s"] == pytest.approx(pocket["turns_s"] + pocket["pauses_s"], abs=0.01)
    assert "dialogue_vs_sequential" in run.stdout and "first audio" in run.stdout
    write_docs(results, tmp_path / "docs", "python -m bench.dialogue --quick")  # the page renders from the JSON
    page = (tmp_path / "docs" / PAGE).read_text()
    assert "| pocket-tiny |" in page and "| one dialogue request |" in page and "agree within 3%" in page
