"""Storage failures (#14): the repository raises one StorageError of its own, every surface answers it
as 503 `storage_unavailable` with Retry-After and without the driver's text, and a failed write is
shown until a write works again.

The failure is real, at the storage boundary: the database lives on a small tmpfs that the test fills
(a full disk: writes fail, reads go on), or, where mounting is not allowed, the test holds SQLite's
write lock (writes fail after the 5 s busy timeout, reads go on)."""

import contextlib
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from bench.server import start_server
from storage import Storage, StorageError, sqlite_url
from tests.serve import wait_until

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

TOKEN = "storage-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
DRIVER_WORDS = ("full", "locked", "sqlite", "OperationalError", "chorus.db", "disk")
SPEECH = {"model": "tts-1", "voice": "alloy", "input": "Stored for later.", "response_format": "wav"}


@pytest.fixture(scope="module")
def database_dir(tmp_path_factory):
    """A folder for the database: a 4 MB tmpfs when this machine lets the test mount one."""
    path = tmp_path_factory.mktemp("database")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(path)],
                             capture_output=True).returncode == 0
    yield path, mounted
    if mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def outage(path: Path, mounted: bool):
    """Writes fail while inside: the disk is full, or another connection holds the write lock."""
    if mounted:
        filler = path / "filler"
        with open(filler, "wb", buffering=0) as file, contextlib.suppress(OSError):
            while True:
                file.write(bytes(4096))
        try:
            yield
        finally:
            filler.unlink()
        return
    holder = sqlite3.connect(path / "chorus.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        holder.rollback()
        holder.close()


@pytest.fixture(scope="module")
def server(database_dir, tmp_path_factory):
    path, _ = database_dir
    process = start_server(tmp_path_factory.mktemp("data"), admin_token=TOKEN, calibration_sizes="1",
                           database_url=sqlite_url(path / "chorus.db"))
    yield process.base_url
    process.stop()


def refused_for_storage(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "storage_unavailable" and int(response.headers["retry-after"]) >= 1
    assert not any(word.lower() in error["message"].lower() for word in DRIVER_WORDS), error["message"]


def storage_state(base: str) -> dict:
    return httpx.get(f"{base}/admin/api/stats", headers=ADMIN).json()["storage"]


def test_submissions_and_keys_answer_503_while_writes_fail_and_work_once_they_do(server, database_dir):
    assert httpx.post(f"{server}/v1/audio/jobs", json=SPEECH).status_code == 202
    with outage(*database_dir):
        refused_for_storage(httpx.post(f"{server}/v1/audio/jobs", json=SPEECH, timeout=30))
        refused_for_storage(httpx.post(f"{server}/admin/api/keys", headers=ADMIN, timeout=30,
                                       json={"name": "during", "tier": "pro"}))
        refused_for_storage(httpx.put(f"{server}/admin/api/settings", headers=ADMIN, timeout=30,
                                      json={"cap_text_chars": 123}))
        failed_at = time.time()
        assert "write failed" in storage_state(server)["settings_error"]  # the operator sees the driver's text
        # Reads go on working; the error stays until a write works again.
        assert wait_until(lambda: (storage_state(server)["settings_read_at"] or 0) > failed_at + 0.5, 30)
        assert "write failed" in storage_state(server)["settings_error"]
    assert wait_until(lambda: storage_state(server)["settings_error"] is None, 30)
    assert httpx.post(f"{server}/v1/audio/jobs", json=SPEECH).status_code == 202
    created = httpx.post(f"{server}/admin/api/keys", headers=ADMIN, json={"name": "after", "tier": "pro"})
    assert created.status_code == 201
    assert httpx.put(f"{server}/admin/api/settings", headers=ADMIN, json={"cap_text_chars": 123}).status_code == 200


def test_the_repository_raises_its_own_error_for_every_kind_of_call(tmp_path):
    broken = tmp_path / "a-folder.db"
    broken.mkdir()  # SQLite cannot open a folder
    storage = Storage(sqlite_url(broken))
    calls = [storage.migrate, storage.settings.read, lambda: storage.settings.write({"a": 1}, "x"),
             storage.audit.recent, storage.keys.all, lambda: storage.keys.add("p", "h", "n", "pro", "x"),
             lambda: storage.jobs.add("job_1", "ip:x", "pro", 0, {"input": "x"}), storage.jobs.backlog,
             lambda: storage.jobs.claim(1), storage.probe_write, storage.request_log.count]
    for call in calls:
        with pytest.raises(StorageError, match="unable to open database file"):
            call()
    with pytest.raises(StorageError, match="database URL"):
        Storage("no-such-dialect://host/db")


def test_values_stored_as_infinity_come_back_as_json_safe_text(tmp_path):
    storage = Storage(sqlite_url(tmp_path / "c.db"))
    storage.migrate()
    storage.settings.write({"queue_wait_target_s": float("inf")}, "old-version")
    assert storage.settings.read() == {"queue_wait_target_s": "Infinity"}  # fails validation, not the JSON answer
    assert storage.audit.recent()[0]["new_value"] == "Infinity"
