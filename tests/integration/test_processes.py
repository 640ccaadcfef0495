"""tests/conftest.py stops every process a test started, whatever became of the test: a pytest of its own runs
tests that leave a server running (a fixture that never stops it, a failing test, a test timed out while a
benchmark's server ran under it), and once it is over, none of those servers is left."""

import os
import subprocess
import sys
import textwrap

from bench.server import ROOT
from tests.processes import _alive

CARELESS = textwrap.dedent('''
    import os, subprocess, sys, pytest

    SERVER = [sys.executable, "-c", "import time; time.sleep(600)"]

    def note(pid):
        with open(os.environ["PIDS_FILE"], "a") as pids:
            pids.write(f"{pid}\\n")

    @pytest.fixture
    def careless_server():
        note(subprocess.Popen(SERVER).pid)  # and no teardown
        yield

    def test_a_fixture_never_stops_its_server(careless_server):
        assert False

    def test_a_test_fails_before_it_stops_its_server():
        note(subprocess.Popen(SERVER).pid)
        assert False

    @pytest.mark.timeout(3, method="signal")
    def test_a_benchmark_times_out_while_its_server_runs():
        starts_a_server = f"import subprocess, time; print(subprocess.Popen({SERVER!r}).pid, flush=True); time.sleep(9)"
        benchmark = subprocess.Popen([sys.executable, "-c", starts_a_server], stdout=subprocess.PIPE, text=True)
        note(benchmark.stdout.readline().strip())
        try:
            benchmark.wait()  # as subprocess.run does: the benchmark is killed, its server is left to itself
        finally:
            benchmark.kill()
''')


def test_servers_a_test_started_are_gone_after_it_failed_or_timed_out(tmp_path):
    (tmp_path / "test_careless.py").write_text(CARELESS)
    pids = tmp_path / "pids"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                          str(tmp_path / "test_careless.py")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PIDS_FILE": str(pids)})
    assert "3 failed" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    started = [int(pid) for pid in pids.read_text().split()]
    assert len(started) == 3
    assert [pid for pid in started if _alive(pid)] == []
