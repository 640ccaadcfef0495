"""The processes tests start (Chorus servers, upstream fakes, Redis, Postgres, the benchmark), found and stopped
whatever becomes of the test: tests/conftest.py stops what a fixture started once the fixture is torn down, what a
test's body started once the test is over (passed, failed or timed out: pytest-timeout's signal method raises in
the test, so the teardown runs), and anything of the session's still running when pytest ends."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

OWNER = "CHORUS_TEST_OWNER"  # in the environment of every process a test starts: who started it
# multiprocessing's and torch's helper processes live as long as the test process: started once, used by
# every test after, they are not a test's servers
HELPERS = ("multiprocessing", "compile_worker")


class Owners:
    """Who (a fixture, a test's body) is starting processes now. subprocess.Popen, patched by watch(), writes the
    owner's mark into each new process's environment, which the servers, daemons and benchmarks it starts in turn
    inherit: so everything an owner started is found by its mark, even a server whose parent has ended."""

    def __init__(self):
        self.session = f"{os.getpid()}-{time.monotonic_ns()}"
        self.stack: list[str] = []
        self.started: set[str] = set()  # owners that started a process (the others need no search)
        self._count = 0

    def push(self, name: str) -> str:
        self._count += 1
        self.stack.append(f"{self.session}/{self._count}/{name}")
        return self.stack[-1]

    def pop(self) -> None:
        self.stack.pop()

    def mark(self, env: dict | None) -> dict:
        owner = self.stack[-1] if self.stack else f"{self.session}/session"
        self.started.add(owner)
        return {**(os.environ if env is None else env), OWNER: owner}

    def watch(self) -> None:
        """Patch subprocess.Popen so that each process started from now on carries the current owner's mark."""
        popen_init, owners = subprocess.Popen.__init__, self

        def init(popen, args, *positional, **options):
            if len(positional) < 10:  # env is Popen's eleventh parameter; everyone passes it by name
                options["env"] = owners.mark(options.get("env"))
            popen_init(popen, args, *positional, **options)

        subprocess.Popen.__init__ = init


def _environ(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _helper(pid: int) -> bool:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return True
    return any(name in command for name in HELPERS)


def marked(owner: str) -> set[int]:
    """The running processes carrying owner's mark, or a mark under it (the session's: every owner's), helpers
    left out."""
    mark = f"{OWNER}={owner}".encode()
    return {int(pid) for pid in os.listdir("/proc") if pid.isdigit() and int(pid) != os.getpid()
            and any(entry == mark or entry.startswith(mark + b"/") for entry in _environ(pid).split(b"\0"))
            and _alive(int(pid)) and not _helper(int(pid))}


def stop(pids: set[int], grace_s: float = 5.0) -> None:
    """SIGTERM to each process, SIGKILL to those still running after grace_s; the ended ones that were this
    process's children are reaped (no zombie left to look alive)."""
    for signal_ in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, signal_)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while (running := {pid for pid in pids if _alive(pid)}) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not running:
            break
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not this process's child, or already reaped (a Popen's wait)
            pass
