"""Jobs and storage under faults (#30), on real servers: a database file that is read-only for a while, and
degrade mode while jobs wait.

- Read-only storage: chorus.db read-only while submissions and key creations arrive, then writable again.
  Before the fix, the connections opened meanwhile stayed read-only for good (33-58% of submissions and 2 of 6
  key creations answered 503 for the 95 s watched) and the job runner's log flapped between "unavailable" and
  "works again". Measured: the 503s after the file is writable again (0), the runner's outage lines (one each).
- Degrade mode: a job refused by degrade mode's text cap waits for the mode to end without spending attempts,
  and a job whose own deadline passes first fails then, saying why it waited. Before the fix, a job had no
  deadline (it waited for ever), and before that it spent its attempts in 2 s and 4 s and failed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from bench.server import start_server
from tests.serve import metric, require_tools, wait_until

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

TOKEN = "jobs-faults-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
SHORT = {"model": "tts-1", "voice": "alloy", "input": "Kept for later.", "response_format": "wav"}


def unprivileged() -> list[str]:
    """A command prefix that makes root obey file permissions (as a server running as a user does): without it
    root writes a read-only file anyway."""
    if os.geteuid() != 0:
        return []
    require_tools("setpriv", install="apt-get install util-linux")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


def log_lines(server, words: str) -> list[str]:
    return [line for line in server.log_path.read_text(errors="replace").splitlines() if words in line]


def submissions_and_keys(base: str, jobs: int, keys: int, tag: str, at_once: int = 8) -> list[httpx.Response]:
    """Job submissions and key creations, at_once at a time (more than the pool holds: the server opens new
    database connections)."""
    def submit(number: int) -> httpx.Response:
        return httpx.post(f"{base}/v1/audio/jobs", json={**SHORT, "input": f"{tag} job {number}."}, timeout=60)

    def create_key(number: int) -> httpx.Response:
        return httpx.post(f"{base}/admin/api/keys", headers=ADMIN, json={"name": f"{tag}-{number}", "tier": "pro"},
                          timeout=60)

    with ThreadPoolExecutor(at_once) as pool:
        answers = [pool.submit(submit, number) for number in range(jobs)]
        answers += [pool.submit(create_key, number) for number in range(keys)]
        return [answer.result() for answer in answers]


def test_a_read_only_database_file_comes_back_for_submissions_keys_and_the_job_runner(tmp_path):
    data = tmp_path / "data"
    server = start_server(data, wrapper=unprivileged(), admin_token=TOKEN, calibration_sizes="1", log_level="info",
                          job_lease_s="3")  # the runner writes (its lease round) every second
    try:
        database = data / "chorus.db"
        before = submissions_and_keys(server.base_url, 4, 1, "before")
        assert [answer.status_code for answer in before] == [202] * 4 + [201]
        database.chmod(0o444)
        try:
            # Connections opened before the chmod keep writing (SQLite checks permissions at open), so the fault
            # shows once the server opens a new one: rounds of 16 at once until it does, however the CPU is shared.
            during = []

            def fault_seen() -> bool:
                during.extend(submissions_and_keys(server.base_url, 16, 3, f"during-{len(during)}", at_once=16))
                return any(answer.status_code == 503 for answer in during)

            assert wait_until(fault_seen, 90), "no new connection met the read-only file"
            assert {answer.status_code for answer in during} <= {201, 202, 503}, [a.text for a in during]
            assert wait_until(lambda: log_lines(server, "job runner: storage unavailable"), 30)
        finally:
            database.chmod(0o644)
        after = submissions_and_keys(server.base_url, 16, 6, "after")
        refused = [answer.text for answer in after if answer.status_code not in (201, 202)]
        assert not refused, f"{len(refused)} of {len(after)} refused once the file was writable: {refused[0]}"
        assert wait_until(lambda: log_lines(server, "job runner: storage works again"), 60)
        job_ids = [answer.json()["id"] for answer in before[:4] + after[:16]]
        assert wait_until(lambda: all(httpx.get(f"{server.base_url}/v1/audio/jobs/{job_id}").json()["status"]
                                      == "succeeded" for job_id in job_ids), 120)
        # one line when the outage began and one when it ended, whatever failed in between
        assert len(log_lines(server, "job runner: storage unavailable")) == 1
        assert len(log_lines(server, "job runner: storage works again")) == 1
        assert not log_lines(server, "could not record")
    finally:
        server.stop()


DEGRADE_EASILY = {"anonymous_tier": "enterprise", "enter_threshold": 0.05, "exit_threshold": 0.01,
                  "exit_hold_s": 1.0, "cap_text_chars": 40}
LONG_TEXT = " ".join(f"This is sentence number {number} of a long answer that keeps the engine busy."
                     for number in range(40))  # about 3,000 characters: seconds of work on any machine


@pytest.fixture(scope="module")
def degrading_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("degrade"), calibration_sizes="1", log_level="info",
                          operator_defaults=json.dumps(DEGRADE_EASILY), trusted_proxies="127.0.0.1")
    yield server
    server.stop()


def test_jobs_wait_out_degrade_mode_and_fail_only_at_their_own_deadline(degrading_server):
    base = degrading_server.base_url
    job_text = "A job of a hundred characters, more than degrade mode's cap of forty characters allows now."

    def job(job_id: str) -> dict:
        return httpx.get(f"{base}/v1/audio/jobs/{job_id}").json()

    # three callers' long texts: a load (one caller's long text alone is none: its sentences take turns with
    # newcomers)
    loads = [threading.Thread(target=lambda caller=caller: httpx.post(
        f"{base}/v1/audio/speech", timeout=300, json={**SHORT, "input": LONG_TEXT},
        headers={"X-Forwarded-For": f"10.3.0.{caller}"})) for caller in range(1, 4)]
    for load in loads:
        load.start()
    try:
        assert wait_until(lambda: metric(base, "tts_degrade_active") == 1, 60), "degrade mode never began"
        hurried = httpx.post(f"{base}/v1/audio/jobs", json={**SHORT, "input": job_text, "deadline_s": 2}).json()
        assert hurried["deadline_at"] - hurried["created_at"] == 2
        assert wait_until(lambda: job(hurried["id"])["status"] == "failed", 30)
        failed = job(hurried["id"])
        assert "not done within its deadline (2 s after it was queued); waiting: " in failed["error"]  # and why
        assert failed["finished_at"] - failed["created_at"] < 10  # at its deadline, not whenever the mode ends
        assert failed["attempts"] <= 1  # waiting spent none
        waiting = httpx.post(f"{base}/v1/audio/jobs", json={**SHORT, "input": job_text}).json()
        assert wait_until(lambda: "texts of up to 40 characters are accepted now" in (job(waiting["id"])["error"]
                                                                                      or ""), 30)
        assert job(waiting["id"])["status"] == "queued"  # put back to wait, not failed
    finally:
        for load in loads:
            load.join(300)
    started = time.monotonic()
    assert wait_until(lambda: job(waiting["id"])["status"] == "succeeded", 120)
    done = job(waiting["id"])
    assert done["attempts"] == 1 and done["error"] is None  # waiting spent no attempt
    assert time.monotonic() - started < 60
