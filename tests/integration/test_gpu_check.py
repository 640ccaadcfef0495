"""The GPU check's smallest CPU plan (--smoke: --quick's tiny models, with the fewest batch sizes, callers, texts
and seconds that still run every code path): the harness works end to end, every part runs (the codec stage on),
every policy finishes requests, and its JSON is complete (speed is not checked here; the figures that matter come
from a GPU). Its own logic, fast: tests/unit/test_gpu_check.py."""

import json
import os
import subprocess
import sys

import pytest

from bench.server import ROOT

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)


@pytest.mark.timeout(1200)  # (its Kokoro part starts a server: minutes on a busy two-core machine)
def test_gpu_check_runs_on_the_cpu_and_its_json_renders_the_docs_page(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "KOKORO_FASTAPI_DIR"}  # (CI has none)
    run = subprocess.run(["bash", "bench/gpu_check.sh", "--device", "cpu", "--smoke", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=1140, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert list(result["parts"]) == ["vits", "pocket_tts", "vibevoice", "kokoro"]
    assert all(not part["skipped"] and part["seconds"] > 0 for part in result["parts"].values()), result["parts"]
    vits = result["vits"]
    assert result["plan_name"] == "smoke" and [row["batch_size"] for row in vits["sweep"]] == [1, 2]
    assert all(row["audio_s_per_s"] > 0 and row["seconds_per_batch"] > 0 for row in vits["sweep"])
    assert vits["low_precision"]["offered"] is False or vits["low_precision"]["sweep"]  # (none on a CPU today)
    assert [row["policy"] for row in vits["served"]] == ["adaptive", "static", "sequential"]
    for row in vits["served"]:
        assert row["requests"] > 0 and row["p95_ms"] >= row["p50_ms"] > 0 and "threads_left" not in row
    assert set(vits["verdicts"]) == set(vits["targets"]) <= set(vits["ratios"])
    assert list(result["stepped"]) == ["pocket_tts", "vibevoice"]  # the tiny models, through the stepped batcher
    for kind, part in result["stepped"].items():
        staged = kind == "pocket_tts"  # its codec is a stage of its own: adaptive runs again with the codec inline
        assert [row["policy"] for row in part["served"]] == ["adaptive", *["adaptive, codec inline"] * staged,
                                                             "static", "sequential"]
        for row in part["served"]:
            assert row["audio_s_per_s"] > 0 and row["steps"] > 0 and row["requests_done"] > 0, row
            assert "threads_left" not in row and row["stop_s"] >= 0
        assert part["served"][0]["codec_thread"] == staged  # adaptive: the codec a stage of its own where it can be
        assert not staged or part["served"][1]["codec_thread"] is False  # then inline
        assert part["served"][-1]["frames_per_step"] == 1.0  # sequential: one at a time
        assert part["served"][0]["frames_per_step"] > 1 and part["ceiling"]["frames_per_step"] > 1
        assert [row["running"] for row in part["step_times"]] == [1, 4, 16]
        assert all(row["wall_ms"] > 0 and row["busy_share"] is None for row in part["step_times"])  # (a CPU)
        assert ("codec_stage_vs_inline" in part["ratios"]) == staged and part["ratios"]["adaptive_vs_static"] > 0
        assert set(part["verdicts"]) == set(part["targets"]) and part["seconds"] > 0
    assert_kokoro_ran_without_its_peer(result["kokoro"], run.stdout, tmp_path / "kokoro.json")
    assert_renders(tmp_path / "gpu_check.json", result, tmp_path / "docs")


def assert_kokoro_ran_without_its_peer(kokoro: dict, said: str, written) -> None:
    """bench/kokoro.py's run (its smoke plan: the tiny model), the check's Kokoro part: the tiny Kokoro over HTTP
    and the engine ceiling ran; without Kokoro-FastAPI's folder the peer's ratios are not measured, and it says why."""
    assert "KOKORO_FASTAPI_DIR is not set: Kokoro-FastAPI is left out" in said
    assert json.loads(written.read_text())["rounds"] == kokoro["rounds"]
    assert kokoro["rounds"]["chorus"][0] > 0 and kokoro["rounds"]["engine ceiling"][0] > 0
    assert kokoro["served"]["chorus"]["ok"] > 0 and kokoro["ratios"]["chorus_vs_ceiling"] > 0
    assert kokoro["verdicts"] == {"chorus_vs_kokoro_fastapi": "not measured",
                                  "short_p95_vs_kokoro_fastapi": "not measured"}


def assert_renders(path, result, docs):
    """The docs page is generated from the JSON alone, with every figure of it."""
    run = subprocess.run([sys.executable, "-m", "bench.gpu_report", str(path), "--docs", str(docs)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    page = (docs / "benchmarks-gpu.md").read_text()
    assert "--device cpu --smoke" in page and "not a GPU" in page
    for row in result["vits"]["served"]:
        assert f"| {row['policy']} | {row['audio_s_per_s']} |" in page
    for row in result["vits"]["sweep"]:
        assert f"| {row['batch_size']} | {1000 * row['seconds_per_batch']:.1f} |" in page
    for name, (sense, bound) in result["vits"]["targets"].items():
        value = result["vits"]["ratios"][name]
        assert f"| {name} | {'n/a' if value is None else value} | {sense} {bound} |" in page
    for kind, part in result["stepped"].items():
        assert f"### {kind}" in page and f"{part['ceiling']['audio_s_per_s']} audio-s/s" in page
        for row in part["served"]:
            assert f"| {row['policy']} | {row['audio_s_per_s']} | {row['frames_per_step']} |" in page
        for row in part["step_times"]:
            assert f"| {row['running']} | {row['wall_ms']} | not measured" in page
    for line in result["failures"]:
        assert f"- {line}" in page
    assert f"| chorus | {result['kokoro']['rounds']['chorus']} |" in page


def test_gpu_report_refuses_a_file_that_is_not_a_gpu_check_result(tmp_path):
    for name, content in (("empty.json", "{}"), ("broken.json", "{not json"), ("missing.json", None)):
        path = tmp_path / name
        if content is not None:
            path.write_text(content)
        run = subprocess.run([sys.executable, "-m", "bench.gpu_report", str(path), "--docs", str(tmp_path / "docs")],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and "is not a readable gpu_check.json" in run.stderr, name
        assert not (tmp_path / "docs" / "benchmarks-gpu.md").exists()
