"""Three replicas on one Postgres and one Redis, real servers started here: they migrate the database once
between them, claim every job once, run a killed replica's jobs again once its leases run out, read each
other's results from the shared folder, and see a key revoked on one of them within 2 s."""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections import Counter, defaultdict
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy import text

from admin.charts import replica_charts
from admin.state import state_markdown
from bench.server import free_port, start_server
from storage import Storage
from tests.integration.test_access import redis_url  # noqa: F401 (a fixture: a Redis server of this module's own)
from tests.serve import require_tools, wait_until
from tts_core.request.operating import OperatorSettings

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

TOKEN = "replicas-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
JOBS = 200


def postgres_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not found:
        require_tools("pg_ctl", install="apt-get install postgresql")  # skips, or fails where CI promised it
    return found[-1].parent if found else Path("/usr/bin")


@pytest.fixture(scope="module")
def database_url():
    """A Postgres server of its own on 127.0.0.1 (run as the postgres user when the tests run as root,
    which initdb refuses to be), with a database `chorus`."""
    bin_dir = postgres_bin()
    base = Path(tempfile.mkdtemp(prefix="chorus-pg-"))
    data, port = base / "data", free_port()
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres:
        shutil.chown(base, "postgres", "postgres")
    os.chmod(base, 0o755)
    subprocess.run([*as_postgres, str(bin_dir / "initdb"), "-D", str(data), "-U", "chorus", "--auth=trust",
                    "-E", "UTF8"], check=True, capture_output=True)
    options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    subprocess.run([*as_postgres, str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(base / "log"),
                    "-w", "start"], check=True, capture_output=True)
    try:
        with psycopg.connect(f"host=127.0.0.1 port={port} user=chorus dbname=postgres", autocommit=True) as admin:
            admin.execute("CREATE DATABASE chorus")
        yield f"postgresql+psycopg://chorus@127.0.0.1:{port}/chorus"
    finally:
        subprocess.run([*as_postgres, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def job_body(number: int) -> dict:
    return {"model": "tts-1", "voice": "alloy", "input": f"Job number {number}.", "response_format": "wav"}


def attempts_in(log: str) -> tuple[list[str], list[str]]:
    """The job ids a replica's log says it started (an attempt each) and finished."""
    return (re.findall(r"job (job_\w+): attempt \d+ started on", log), re.findall(r"job (job_\w+): succeeded on", log))


def test_replicas_share_the_database_the_jobs_their_results_and_the_keys(tmp_path, database_url, redis_url):  # noqa: F811
    results = tmp_path / "results"  # the folder every replica mounts
    settings = dict(database_url=database_url, ratelimit_storage=redis_url, results_dir=str(results),
                    job_lease_s="3", calibration_sizes="1", log_level="info", admin_token=TOKEN)
    replicas = [None] * 3

    def start(index: int) -> None:  # at once: their migrations race, and one of them migrates
        replicas[index] = start_server(tmp_path / f"replica-{index}", **settings)

    starting = [threading.Thread(target=start, args=(index,)) for index in range(3)]
    for thread in starting:
        thread.start()
    for thread in starting:
        thread.join()
    try:
        assert all(replicas), "a replica did not start"
        storage = Storage(database_url)
        assert storage.revision() == "0011"
        ids = [httpx.post(f"{replicas[number % 3].base_url}/v1/audio/jobs", json=job_body(number), timeout=30)
               .json()["id"] for number in range(JOBS)]

        def succeeded() -> int:
            with storage.engine.connect() as connection:
                return connection.execute(text("SELECT count(*) FROM jobs WHERE status = 'succeeded'")).scalar()

        assert wait_until(lambda: succeeded() >= 20, timeout_s=120)
        killed = replicas[2]

        def running_on_killed() -> bool:
            starts, ends = attempts_in(killed.log_path.read_text(errors="replace"))
            return bool(set(starts) - set(ends))

        assert wait_until(running_on_killed, timeout_s=60)  # (between two jobs, it would leave none behind)
        killed.process.send_signal(signal.SIGKILL)  # mid-run: it holds leases on jobs it will never finish
        killed.process.wait(10)
        assert wait_until(lambda: succeeded() == JOBS, timeout_s=300), f"{succeeded()} of {JOBS} succeeded"

        # Every job ended once; only a job the killed replica had started ran twice.
        def read_logs() -> tuple[dict, Counter, dict]:
            started, finished, finished_on = defaultdict(list), Counter(), {}
            for index, replica in enumerate(replicas):
                starts, ends = attempts_in(replica.log_path.read_text(errors="replace"))
                for job in starts:
                    started[job].append(index)
                finished.update(ends)
                finished_on.update((job, index) for job in ends)
            return started, finished, finished_on

        def unlogged_on_survivors() -> set:  # a live replica logs a job's end just after storing it
            started, finished, _ = read_logs()
            return {job for job in set(ids) - set(finished) if started[job] != [2]}

        wait_until(lambda: not unlogged_on_survivors(), timeout_s=30)
        started, finished, finished_on = read_logs()
        # A job the killed replica stored as succeeded in the moment before its log line (the kill came between
        # the two) ended there, once: it was started nowhere else.
        unlogged = set(ids) - set(finished)
        assert all(started[job] == [2] for job in unlogged), {job: started[job] for job in unlogged}
        finished_on.update(dict.fromkeys(unlogged, 2))
        assert set(finished) <= set(ids) and set(finished.values()) == {1}
        for job in ids:  # twice only when the killed replica started it and did not finish it
            runs = started[job]
            assert len(runs) == 1 or (sorted(runs)[-1] == 2 and runs.count(2) == 1 and len(runs) == 2
                                      and finished_on[job] != 2), (job, runs, finished_on[job])
        rerun = [job for job in ids if len(started[job]) == 2]
        assert rerun  # the kill came mid-run

        # Results are readable on every live replica, whoever wrote them.
        survivors = replicas[:2]
        for job in [*rerun, *ids[:10], *ids[-10:]]:
            for replica in survivors:
                audio = httpx.get(f"{replica.base_url}/v1/audio/jobs/{job}/audio", timeout=30)
                assert audio.status_code == 200 and audio.content[:4] == b"RIFF", (job, audio.text[:200])

        # Each replica's stats show the whole deployment: the killed replica is gone once it stops reporting.
        def cluster(replica) -> dict[str, bool]:
            rows = httpx.get(f"{replica.base_url}/admin/api/stats", headers=ADMIN, timeout=30).json()["replicas"]
            return {row["id"]: row["gone"] for row in rows}
        expected = {f"{socket.gethostname()}:{replica.base_url.rsplit(':', 1)[1]}": replica is killed
                    for replica in replicas}
        assert wait_until(lambda: cluster(survivors[1]) == expected, timeout_s=15)
        words = state_markdown(httpx.get(f"{survivors[0].base_url}/admin/api/stats", headers=ADMIN).json(),
                               OperatorSettings())  # what the Admin tab shows
        assert "**Replicas:**" in words and "(this one)" in words and words.count("gone (last seen") == 1
        series = httpx.get(f"{survivors[0].base_url}/admin/api/stats", headers=ADMIN).json()["replica_series"]
        lines = [chart.series for chart in replica_charts(series)]  # the Admin tab's: a line per replica
        assert all(len(chart) == 3 for chart in lines)  # the killed one's line too, up to when it stopped

        # An operator setting changed on one replica applies on the other within 2 s.
        changed = httpx.put(f"{survivors[0].base_url}/admin/api/settings", headers=ADMIN, json={"cap_text_chars": 777})
        assert changed.status_code == 200, changed.text
        assert wait_until(lambda: httpx.get(f"{survivors[1].base_url}/admin/api/settings", headers=ADMIN)
                          .json()["settings"]["cap_text_chars"] == 777, timeout_s=2)

        # A key revoked on one replica is refused by the other within 2 s.
        made = httpx.post(f"{survivors[0].base_url}/admin/api/keys", headers=ADMIN, json={"name": "k", "tier": "pro"})
        key = {"Authorization": f"Bearer {made.json()['key']}"}
        assert wait_until(lambda: httpx.post(f"{survivors[1].base_url}/v1/audio/speech", headers=key, timeout=30,
                                             json=job_body(0)).status_code == 200, timeout_s=2)
        revoked = httpx.delete(f"{survivors[0].base_url}/admin/api/keys/{made.json()['id']}", headers=ADMIN)
        assert revoked.status_code == 200, revoked.text
        assert wait_until(lambda: httpx.post(f"{survivors[1].base_url}/v1/audio/speech", headers=key, timeout=30,
                                             json=job_body(0)).status_code == 401, timeout_s=2)
    finally:
        for replica in replicas:
            if replica is not None and replica.process.poll() is None:
                replica.stop()
