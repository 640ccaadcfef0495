"""bench/overload_replay.py: the server's queue on a simulated clock (seeded: the same run every time)."""

import argparse

import pytest

from bench.overload_replay import main, parse_windows, replay
from tts_core.scheduler.queue import OFFERED_WINDOWS_S


def test_an_overload_is_refused_and_a_light_load_around_it_is_not():
    run = replay(seed=0, windows=OFFERED_WINDOWS_S, load=0.3, phase_s=20.0)
    assert run.refused_overload > 100  # 60 s at 3x: two thirds of the work offered cannot be done
    assert run.first_refusal_s < 10.0  # found within seconds
    assert run.overload_wait_p95_s <= 10.0  # the usual target holds until it is found, the overload's after
    assert run.refused_normal == []


def test_windows_are_read_from_the_command_line_and_each_set_is_replayed(capsys):
    assert parse_windows("0.5:1,5:1.5") == {0.5: 1.0, 5.0: 1.5}
    with pytest.raises(argparse.ArgumentTypeError):
        parse_windows("0.5")
    main(["--runs", "2", "--windows", "0.5:1,5:1.5"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("windows 0.5 s x1, 5 s x1.5: 503s at 70% load ")  # the server's first, then each tried
    assert all(" of 2 runs; in the overload " in line for line in lines)
