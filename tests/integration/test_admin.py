"""Admin API on a real server process: auth, validation, and settings that survive a restart."""

import re

import httpx
import pytest

from bench.server import start_server
from tests.serve import wait_until

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

TOKEN = "s3cret-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}", "X-Chorus-Actor": "ops-alice"}


def test_admin_is_disabled_without_a_token(server):
    response = httpx.get(f"{server}/admin/api/settings", headers={"Authorization": "Bearer anything"})
    assert response.status_code == 403 and "disabled" in response.json()["error"]["message"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("admin")


@pytest.fixture(scope="module")
def admin_server(data_dir):
    server = start_server(data_dir, admin_token=TOKEN, calibration_sizes="1")
    yield server.base_url
    server.stop()


@pytest.mark.parametrize("headers, status", [
    ({}, 401), ({"Authorization": "Bearer wrong"}, 403), ({"Authorization": "Basic " + TOKEN}, 401),
    ({"Authorization": f"Bearer {TOKEN}"}, 200),
])
def test_auth(admin_server, headers, status):
    for path in ("settings", "audit", "stats"):
        assert httpx.get(f"{admin_server}/admin/api/{path}", headers=headers).status_code == status


@pytest.mark.parametrize("body, field", [
    ({"cap_text_chars": -1}, "cap_text_chars"),
    ({"exit_threshold": 0.95}, "exit_threshold"),
    ({"no_such_setting": 1}, "no_such_setting"),
    ({"shed_enabled": "sometimes"}, "shed_enabled"),
])
def test_invalid_values_get_422_naming_the_field(admin_server, body, field):
    response = httpx.put(f"{admin_server}/admin/api/settings", headers=ADMIN, json=body)
    assert response.status_code == 422
    assert response.json()["error"]["param"] == field


def test_unknown_admin_paths_and_wrong_methods_answer_in_the_error_shape(admin_server):
    missing = httpx.get(f"{admin_server}/admin/api/no-such-thing", headers=ADMIN)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"  # was {"detail": ...}
    wrong = httpx.delete(f"{admin_server}/admin/api/stats", headers=ADMIN)
    assert wrong.status_code == 405 and wrong.headers["Allow"] == "GET"
    assert set(wrong.json()["error"]) == {"message", "type", "param", "code"}
    unknown = httpx.post(f"{admin_server}/admin/api/models/piperr/precision/reset", headers=ADMIN)
    assert unknown.status_code == 404 and "the models: " in unknown.json()["error"]["message"]


def test_stats_show_the_live_state(admin_server):
    stats = httpx.get(f"{admin_server}/admin/api/stats", headers=ADMIN).json()
    assert stats["degrade"]["active"] is False and stats["gpu"] is None
    assert stats["storage"]["database"].endswith("chorus.db") and stats["storage"]["settings_error"] is None
    assert len(stats["series"]) >= 1
    model = next(iter(stats["cost_models"].values()))  # what the Admin tab's cost-model chart draws
    assert model["policy"] == "adaptive" and model["observations"][0]["calibration"]


def test_settings_survive_a_restart_and_are_audited(admin_server, data_dir):
    response = httpx.put(f"{admin_server}/admin/api/settings", headers=ADMIN,
                         json={"cap_text_chars": 222, "shed_enabled": True})
    assert response.status_code == 200
    assert response.json()["settings"]["cap_text_chars"] == 222
    restarted = start_server(data_dir, admin_token=TOKEN, calibration_sizes="1")  # same SQLite file
    try:
        settings = httpx.get(f"{restarted.base_url}/admin/api/settings", headers=ADMIN).json()["settings"]
        assert settings["cap_text_chars"] == 222 and settings["shed_enabled"] is True
        audit = httpx.get(f"{restarted.base_url}/admin/api/audit", headers=ADMIN).json()["data"]
        change = next(entry for entry in audit if entry["key"] == "cap_text_chars")
        assert change["actor"] == "ops-alice" and change["new_value"] == 222
        assert change["old_value"] == 300  # never stored before: the default that was in force
    finally:
        restarted.stop()


def test_requests_are_logged(admin_server, data_dir):
    from storage import Storage, sqlite_url

    assert httpx.post(f"{admin_server}/v1/audio/speech", timeout=60,
                      json={"model": "tts-1", "voice": "alloy", "input": "Log me."}).status_code == 200
    bad_voice = {"model": "tts-1", "voice": "x", "input": "Hi"}
    assert httpx.post(f"{admin_server}/v1/audio/speech", json=bad_voice).status_code == 400
    storage = Storage(sqlite_url(data_dir / "chorus.db"))
    assert wait_until(lambda: {200, 400} <= {row["status"] for row in storage.request_log.recent(10)},
                      10)  # flushed each second
    rows = storage.request_log.recent(10)
    ok = next(row for row in rows if row["status"] == 200)
    assert ok["voice"] == "en_US-joe-medium" and ok["characters"] == 7 and ok["batch_size"] == 1
    assert ok["queue_ms"] is not None and ok["synthesis_ms"] > 0 and ok["client"] == "ip:127.0.0.1"
    assert any(row["status"] == 400 for row in rows)


def test_the_admin_tab_labels_every_setting_in_words_with_a_line_of_help(admin_server):
    """The form's labels are the settings' titles (words, with units), never their names; each has its help."""
    from tts_core.request.operating import OperatorSettings

    components = [component["props"] for component in httpx.get(f"{admin_server}/config").json()["components"]]
    labels = {props.get("label"): props for props in components if props.get("label")}
    fields = OperatorSettings.model_fields
    for name, field in fields.items():
        shown = next(props for label, props in labels.items() if label.startswith(field.title))
        if name == "tiers":  # a table, a column per field, with the columns' help in words under it
            assert shown["headers"][:3] == ["tier", "rate limit (empty: none)", "priority"]
            assert any("One row per tier" in str(props.get("value")) and "*priority*: higher runs earlier" in
                       str(props.get("value")) for props in components)
            continue
        other_as_label = re.sub(r"\b[a-z]+(?:_[a-z]+)+\b", lambda found: f"“{fields[found[0]].title}”"
                                if found[0] in fields else found[0], field.description)  # #55: labels, not names
        assert other_as_label in (shown.get("info") or shown["label"]), name
        assert name.replace("_", " ") not in labels, name
    assert "Hold before leaving (s)" in labels and "Audio cache size (MB)" in labels
    entry_id = labels["Entry id"]  # the lexicon form's: empty, for a new entry
    assert not entry_id.get("value") and entry_id["placeholder"] == "empty: a new entry"
