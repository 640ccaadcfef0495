"""bench.steps's smoke: the tiny Pocket TTS at two running, eager and compiled side by side (the compiled
engine traced with aot_eager, seconds; the default, inductor, is what the benchmark measures)."""

import pytest
import torch

from bench.steps import main


@pytest.fixture
def torch_threads_kept():
    """The benchmark runs on one torch thread, set for the process: the tests after it get the threads back (the
    Kokoro engine's copies are counted from them)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_the_steps_benchmark_prints_eager_and_compiled_side_by_side(tmp_path, capsys, torch_threads_kept):
    rows = main(["--running", "2", "--steps", "3", "--backend", "aot_eager", "--json", str(tmp_path / "steps.json")])
    assert [(row["running"], row["mode"]) for row in rows] == [(2, "eager"), (2, "compiled")]
    for row in rows:
        assert row["step_wall_ms"] > 0 and row["aten_ops_per_step"] > 10 and row["host_reads_per_step"] == 1
    assert rows[1]["host_syncs_per_step"] <= 1  # (at one running, transformers' sdpa mask check reads the host)
    assert rows[1]["compile_s"] > 0 and rows[0]["compile_s"] == 0
    assert rows[1]["steps_compiled"] > 0 and rows[1]["steps_eager"] == 0  # (before: its requests outgrew the graphs)
    assert "compiled/eager step wall" in capsys.readouterr().out and (tmp_path / "steps.json").is_file()
