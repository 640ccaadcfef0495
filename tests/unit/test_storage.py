"""Storage on real SQLite files: migrations, settings with audit, request log, failures."""

import json
import os
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import event, select

from admin.control import OperatorControl
from storage import Storage, StorageError, sqlite_url
from storage.models import Job
from storage.request_log import RequestLogWriter
from tests.fakes import FakeEngine
from tests.serve import require_tools
from tts_core.config import Settings
from tts_core.controls import ServiceControls
from tts_core.ops.metrics import Metrics
from tts_core.service import SpeechService

ROOT = Path(__file__).resolve().parents[2]


def tables(path) -> set[str]:
    with sqlite3.connect(path) as connection:
        return {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_empty_database_is_migrated_to_head(tmp_path):
    storage = Storage(sqlite_url(tmp_path / "new.db"))
    storage.migrate()
    assert storage.revision() == "0011"
    expected = {"settings", "audit_log", "request_log", "api_keys", "jobs", "cloned_voices", "lexicon",
                "lexicon_version", "alembic_version"}
    assert expected <= tables(tmp_path / "new.db")
    with sqlite3.connect(tmp_path / "new.db") as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_old_database_upgrades_and_keeps_its_data(tmp_path):
    path = tmp_path / "old.db"
    old = Storage(sqlite_url(path))
    old.migrate("0001")  # a database from before the request log existed
    old.settings.write({"cap_text_chars": 111}, "operator")
    assert "request_log" not in tables(path)
    upgraded = Storage(sqlite_url(path))
    upgraded.migrate()
    assert upgraded.revision() == "0011"
    assert upgraded.settings.read() == {"cap_text_chars": 111}
    assert upgraded.audit.recent()[0]["new_value"] == 111
    upgraded.migrate()  # idempotent
    assert upgraded.revision() == "0011"


def test_a_cloned_voice_is_stored_once_and_each_change_is_audited(tmp_path):
    storage = Storage(sqlite_url(tmp_path / "voices.db"))
    storage.migrate()
    consent = datetime.now(UTC)
    made = storage.cloned_voices.add("alice", "tiny-pocket", "key:3", 4.5, "hello", "voices/cloned/a.safetensors",
                                    consent, "key:3")
    assert (made["owner"], made["public"], made["consent_at"]) == ("key:3", False, consent)
    assert storage.cloned_voices.add("alice", "other", "ip:1.2.3.4", 3.0, None, "x", consent, "ip:1.2.3.4") is None
    assert storage.cloned_voices.set_public("alice", True, "ops")["public"] is True
    assert storage.cloned_voices.set_public("alice", True, "ops")["public"] is True  # no change: no audit row
    assert [row["name"] for row in Storage(sqlite_url(tmp_path / "voices.db")).cloned_voices.all()] == ["alice"]
    assert storage.cloned_voices.delete("alice", "ops")["path"] == "voices/cloned/a.safetensors"
    assert storage.cloned_voices.delete("alice", "ops") is None and storage.cloned_voices.all() == []
    assert [(entry["action"], entry["actor"]) for entry in storage.audit.recent()] == [
        ("cloned_voice.delete", "ops"), ("cloned_voice.public", "ops"), ("cloned_voice.create", "key:3")]


def test_a_cloned_voices_prompt_is_kept_in_its_row_and_the_list_leaves_it_out(tmp_path):
    storage = Storage(sqlite_url(tmp_path / "voices.db"))
    storage.migrate()
    prompt = bytes(range(256)) * 64
    storage.cloned_voices.add("alice", "tiny-pocket", "key:3", 4.5, None, "voices/cloned/tiny-pocket/alice.safetensors",
                             datetime.now(UTC), "key:3", prompt)
    statements = []
    event.listen(storage.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    assert [row["name"] for row in storage.cloned_voices.all()] == ["alice"]
    assert statements and not any("prompt" in statement for statement in statements)  # read every second
    assert storage.cloned_voices.prompt("alice") == prompt and storage.cloned_voices.prompt("nobody") is None


def test_a_cloned_voice_from_before_prompts_were_kept_has_none(tmp_path):
    path = tmp_path / "old.db"
    old = Storage(sqlite_url(path))
    old.migrate("0008")
    with sqlite3.connect(path) as connection:
        connection.execute("INSERT INTO cloned_voices (name, model, owner, public, created_at, duration_s, path, "
                           "consent_at) VALUES ('bob', 'tiny-pocket', 'ip:1.2.3.4', 1, '2025-01-02 03:04:05', 4.0, "
                           "'voices/cloned/tiny-pocket/bob.safetensors', '2025-01-02 03:04:05')")
    upgraded = Storage(sqlite_url(path))
    upgraded.migrate()
    [row] = upgraded.cloned_voices.all()
    assert (row["name"], row["public"], row["path"]) == ("bob", True, "voices/cloned/tiny-pocket/bob.safetensors")
    assert upgraded.cloned_voices.prompt("bob") is None  # it keeps using its file


def test_settings_and_audit_survive_reopening(tmp_path):
    url = sqlite_url(tmp_path / "c.db")
    first = Storage(url)
    first.migrate()
    first.settings.write({"enter_threshold": 0.9}, "alice")
    assert first.settings.write({"enter_threshold": 0.9}, "alice") == []  # unchanged: no audit row
    first.settings.write({"enter_threshold": 0.7}, "bob")
    again = Storage(url)
    assert again.settings.read() == {"enter_threshold": 0.7}
    audit = again.audit.recent()
    assert [(e["actor"], e["old_value"], e["new_value"]) for e in audit] == [("bob", 0.9, 0.7), ("alice", None, 0.9)]
    # a setting never stored: the audit's old value is the one that was in force (its default)
    again.settings.write({"exit_threshold": 0.3}, "carol", {"exit_threshold": 0.5, "enter_threshold": 0.7})
    assert again.audit.recent()[0]["old_value"] == 0.5
    assert again.settings.write({"cap_text_chars": 500}, "carol", {"cap_text_chars": 500}) == []  # already in force


def test_request_log_is_written_in_the_background_and_bounded(tmp_path):
    storage = Storage(sqlite_url(tmp_path / "c.db"))
    storage.migrate()
    writer = RequestLogWriter(storage, max_rows=5)
    for n in range(8):
        writer.record(client="127.0.0.1", source="api", status=200, voice="v", characters=n)
    writer.flush()
    rows = storage.request_log.recent(10)
    assert storage.request_log.count() == 5 and rows[0]["characters"] == 7


@pytest.fixture
def control(tmp_path):
    storage = Storage(sqlite_url(tmp_path / "c.db"))
    storage.migrate()
    service = SpeechService(Settings(), [FakeEngine()], Metrics())
    return OperatorControl(storage, ServiceControls(service), RequestLogWriter(storage))


def test_a_failing_database_keeps_the_last_settings_and_says_so(control, tmp_path):
    control.update({"cap_text_chars": 150}, "alice")
    broken_dir = tmp_path / "not-a-file.db"
    broken_dir.mkdir()
    control.storage = Storage(sqlite_url(broken_dir))  # SQLite cannot open a directory
    control.reload()
    assert control.settings.cap_text_chars == 150
    assert "unable to open database file" in control.storage_error
    with pytest.raises(StorageError):
        control.update({"cap_text_chars": 90}, "alice")
    assert control.settings.cap_text_chars == 150  # not applied when it could not be saved


def test_request_log_keeps_rows_while_the_database_fails(tmp_path):
    broken_dir = tmp_path / "broken.db"
    broken_dir.mkdir()
    writer = RequestLogWriter(Storage(sqlite_url(broken_dir)))
    writer.record(client="c", source="api", status=200)
    writer.flush()
    assert writer.last_error and len(writer._buffer) == 1
    storage = Storage(sqlite_url(tmp_path / "good.db"))
    storage.migrate()
    writer.storage = storage
    writer.flush()
    assert writer.last_error is None and storage.request_log.count() == 1


def test_processes_starting_at_once_on_one_sqlite_file_migrate_it_once(tmp_path):
    url = sqlite_url(tmp_path / "shared.db")
    migrate = f"from storage import Storage; Storage({url!r}).migrate()"
    starting = [subprocess.Popen([sys.executable, "-c", migrate], stderr=subprocess.PIPE, text=True) for _ in range(4)]
    failures = [process.stderr.read() for process in starting if process.wait(120) != 0]
    assert not failures, failures[0]
    alone = Storage(sqlite_url(tmp_path / "alone.db"))
    alone.migrate()
    assert Storage(url).revision() == alone.revision()


# --- storage that comes back ------------------------------------------------------------------------

# Run in a process of its own: root (as tests often run) writes read-only files anyway, so there the process
# runs without that privilege (setpriv drops CAP_DAC_OVERRIDE), as a server running as a user does.
READ_ONLY_SPELL = """
import json, os, sys
from storage import Storage, StorageError, sqlite_url
from storage.models import Job

path = sys.argv[1]
storage = Storage(sqlite_url(path))

def write(n):
    try:
        storage.jobs.add(f"job_{n}", "ip:x", "pro", 0, {"input": "x"})
        return "ok"
    except StorageError as error:
        return str(error)

outcomes = [write(1)]
os.chmod(path, 0o444)
storage.engine.dispose()  # the next connection opens while the file is read-only, as a busy server's new ones do
outcomes += [write(2), storage.jobs.get("job_1")["id"]]  # reads go on
os.chmod(path, 0o644)
outcomes += [write(n) for n in range(3, 6)]
print(json.dumps(outcomes))
"""


def test_writes_work_again_as_soon_as_a_read_only_database_file_is_writable(tmp_path):
    """SQLite opens a file it cannot write read-only and that connection stays so; pool_pre_ping does not see
    it. Before the fix, every write on such a pooled connection failed for as long as the process ran."""
    path = tmp_path / "chorus.db"
    Storage(sqlite_url(path)).migrate()
    unprivileged = []
    if os.geteuid() == 0:
        require_tools("setpriv", install="apt-get install util-linux")
        unprivileged = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    done = subprocess.run([*unprivileged, sys.executable, "-c", READ_ONLY_SPELL, str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    outcomes = json.loads(done.stdout)
    assert outcomes[0] == "ok" and "readonly database" in outcomes[1] and outcomes[2] == "job_1"
    assert outcomes[3:] == ["ok", "ok", "ok"]  # at once, not after a failed write that finds the stale connection


def test_a_connection_left_read_only_is_dropped_at_its_first_failed_write(tmp_path):
    """A pooled connection that turned read-only (here by SQLite's query_only; a remount or a Postgres failover to
    a standby do it too) answers every write with SQLITE_READONLY: after the first, a fresh one takes its place."""
    storage = Storage(sqlite_url(tmp_path / "c.db"))
    storage.migrate()
    with storage.engine.connect() as connection:  # the pool's one connection, from now on read-only
        connection.exec_driver_sql("PRAGMA query_only = ON")
    with pytest.raises(StorageError, match="readonly database"):
        storage.keys.add("p1", "h1", "first", "pro", "ops")
    assert storage.keys.add("p2", "h2", "second", "pro", "ops")["name"] == "second"


def test_a_stale_lease_holder_cannot_finish_renew_or_put_back_a_job_another_took_over(tmp_path):
    """Two replicas (two Storage objects on one database). A's lease on attempt 1 ran out while it was paused;
    B queued the job again and claimed it (attempt 2). Whatever A does afterwards changes nothing."""
    url = sqlite_url(tmp_path / "shared.db")
    a, b = Storage(url), Storage(url)
    a.migrate()
    job = a.jobs.add("job_1", "ip:x", "pro", 0, {"input": "x"})
    [stale] = a.jobs.claim(1, "replica-a", -1)  # its lease already past
    assert b.jobs.requeue_expired() == 1
    [taken] = b.jobs.claim(1, "replica-b", 3600)
    assert (stale["attempts"], taken["attempts"]) == (1, 2)
    lease = lease_until(b, job["id"])
    a.jobs.renew_leases("replica-a", {job["id"]: 1}, 7200)
    assert a.jobs.finish(job["id"], "replica-a", 1, "succeeded", result_path="stale.wav") is None
    assert a.jobs.finish(job["id"], "replica-a", 1, "queued", attempts=0) is None  # a put-back
    assert a.jobs.finish(job["id"], "replica-b", 1, "failed") is None  # the owner alone is not enough
    row = b.jobs.get(job["id"])
    assert (row["status"], row["attempts"], row["result_path"]) == ("running", 2, None)
    assert lease_until(b, job["id"]) == lease  # the renewal did not touch B's lease either
    a.jobs.renew_leases("replica-b", {job["id"]: 1}, 7200)  # B's id with A's attempt: no more
    assert lease_until(b, job["id"]) == lease
    b.jobs.renew_leases("replica-b", {job["id"]: 2}, 7200)
    assert lease_until(b, job["id"]) > lease
    assert b.jobs.finish(job["id"], "replica-b", 2, "succeeded", result_path="job_1.2.wav")["status"] == "succeeded"
    assert b.jobs.claim(1, "replica-b", 3600) == []  # it ran once


def lease_until(storage: Storage, job_id: str) -> datetime:
    with storage.engine.connect() as connection:
        return connection.execute(select(Job.lease_until).where(Job.id == job_id)).scalar_one()
