"""Storage on real SQLite files: migrations, settings with audit, request log, failures."""

import sqlite3
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from sqlalchemy import event

from admin.control import OperatorControl
from storage import Storage, StorageError, sqlite_url
from storage.request_log import RequestLogWriter
from tests.fakes import FakeEngine
from tts_core.config import Settings
from tts_core.metrics import Metrics
from tts_core.service import SpeechService


def tables(path) -> set[str]:
    with sqlite3.connect(path) as connection:
        return {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_empty_database_is_migrated_to_head(tmp_path):
    storage = Storage(sqlite_url(tmp_path / "new.db"))
    storage.migrate()
    assert storage.revision() == "0009"
    expected = {"settings", "audit_log", "request_log", "api_keys", "jobs", "cloned_voices", "lexicon",
                "lexicon_version", "alembic_version"}
    assert expected <= tables(tmp_path / "new.db")
    with sqlite3.connect(tmp_path / "new.db") as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_old_database_upgrades_and_keeps_its_data(tmp_path):
    path = tmp_path / "old.db"
    old = Storage(sqlite_url(path))
    old.migrate("0001")  # a database from before the request log existed
    old.write_settings({"cap_text_chars": 111}, "operator")
    assert "request_log" not in tables(path)
    upgraded = Storage(sqlite_url(path))
    upgraded.migrate()
    assert upgraded.revision() == "0009"
    assert upgraded.read_settings() == {"cap_text_chars": 111}
    assert upgraded.audit()[0]["new_value"] == 111
    upgraded.migrate()  # idempotent
    assert upgraded.revision() == "0009"


def test_a_cloned_voice_is_stored_once_and_each_change_is_audited(tmp_path):
    storage = Storage(sqlite_url(tmp_path / "voices.db"))
    storage.migrate()
    consent = datetime.now(UTC)
    made = storage.add_cloned_voice("alice", "tiny-pocket", "key:3", 4.5, "hello", "voices/cloned/a.safetensors",
                                    consent, "key:3")
    assert (made["owner"], made["public"], made["consent_at"]) == ("key:3", False, consent)
    assert storage.add_cloned_voice("alice", "other", "ip:1.2.3.4", 3.0, None, "x", consent, "ip:1.2.3.4") is None
    assert storage.set_cloned_voice_public("alice", True, "ops")["public"] is True
    assert storage.set_cloned_voice_public("alice", True, "ops")["public"] is True  # no change: no audit row
    assert [row["name"] for row in Storage(sqlite_url(tmp_path / "voices.db")).cloned_voices()] == ["alice"]
    assert storage.delete_cloned_voice("alice", "ops")["path"] == "voices/cloned/a.safetensors"
    assert storage.delete_cloned_voice("alice", "ops") is None and storage.cloned_voices() == []
    assert [(entry["action"], entry["actor"]) for entry in storage.audit()] == [
        ("cloned_voice.delete", "ops"), ("cloned_voice.public", "ops"), ("cloned_voice.create", "key:3")]


def test_a_cloned_voices_prompt_is_kept_in_its_row_and_the_list_leaves_it_out(tmp_path):
    storage = Storage(sqlite_url(tmp_path / "voices.db"))
    storage.migrate()
    prompt = bytes(range(256)) * 64
    storage.add_cloned_voice("alice", "tiny-pocket", "key:3", 4.5, None, "voices/cloned/tiny-pocket/alice.safetensors",
                             datetime.now(UTC), "key:3", prompt)
    statements = []
    event.listen(storage.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    assert [row["name"] for row in storage.cloned_voices()] == ["alice"]
    assert statements and not any("prompt" in statement for statement in statements)  # read every second
    assert storage.cloned_voice_prompt("alice") == prompt and storage.cloned_voice_prompt("nobody") is None


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
    [row] = upgraded.cloned_voices()
    assert (row["name"], row["public"], row["path"]) == ("bob", True, "voices/cloned/tiny-pocket/bob.safetensors")
    assert upgraded.cloned_voice_prompt("bob") is None  # it keeps using its file


def test_settings_and_audit_survive_reopening(tmp_path):
    url = sqlite_url(tmp_path / "c.db")
    first = Storage(url)
    first.migrate()
    first.write_settings({"enter_threshold": 0.9}, "alice")
    assert first.write_settings({"enter_threshold": 0.9}, "alice") == []  # unchanged: no audit row
    first.write_settings({"enter_threshold": 0.7}, "bob")
    again = Storage(url)
    assert again.read_settings() == {"enter_threshold": 0.7}
    audit = again.audit()
    assert [(e["actor"], e["old_value"], e["new_value"]) for e in audit] == [("bob", 0.9, 0.7), ("alice", None, 0.9)]
    # a setting never stored: the audit's old value is the one that was in force (its default)
    again.write_settings({"exit_threshold": 0.3}, "carol", {"exit_threshold": 0.5, "enter_threshold": 0.7})
    assert again.audit()[0]["old_value"] == 0.5
    assert again.write_settings({"cap_text_chars": 500}, "carol", {"cap_text_chars": 500}) == []  # already in force


def test_request_log_is_written_in_the_background_and_bounded(tmp_path):
    storage = Storage(sqlite_url(tmp_path / "c.db"))
    storage.migrate()
    writer = RequestLogWriter(storage, max_rows=5)
    for n in range(8):
        writer.record(client="127.0.0.1", source="api", status=200, voice="v", characters=n)
    writer.flush()
    rows = storage.request_log(10)
    assert storage.count_request_log() == 5 and rows[0]["characters"] == 7


@pytest.fixture
def control(tmp_path):
    storage = Storage(sqlite_url(tmp_path / "c.db"))
    storage.migrate()
    service = SpeechService(Settings(), [FakeEngine()], Metrics())
    return OperatorControl(storage, service, RequestLogWriter(storage))


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
    assert writer.last_error is None and storage.count_request_log() == 1


def test_processes_starting_at_once_on_one_sqlite_file_migrate_it_once(tmp_path):
    url = sqlite_url(tmp_path / "shared.db")
    migrate = f"from storage import Storage; Storage({url!r}).migrate()"
    starting = [subprocess.Popen([sys.executable, "-c", migrate], stderr=subprocess.PIPE, text=True) for _ in range(4)]
    failures = [process.stderr.read() for process in starting if process.wait(120) != 0]
    assert not failures, failures[0]
    alone = Storage(sqlite_url(tmp_path / "alone.db"))
    alone.migrate()
    assert Storage(url).revision() == alone.revision()
