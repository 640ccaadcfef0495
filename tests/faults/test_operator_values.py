"""Operator values (#14): every one has bounds, stated in the schema; a value past them is answered 422
`invalid_setting` before anything is stored; a database that already holds such values starts, says
once which it ignored, and uses the defaults. Real server processes."""

import json
import re
import sqlite3

import httpx
import pytest

from bench.server import start_server
from storage import Storage, sqlite_url
from tests.serve import wait_until
from tts_core.request.access import Tier
from tts_core.request.operating import OperatorSettings

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

TOKEN = "values-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
HUGE = "9" * 4000  # a 4,000-digit integer (Python's json reads up to 4,300 digits)

# Raw JSON bodies: Python's json reads Infinity and NaN, so they reach the validation.
OUT_OF_BOUNDS = [
    (f'{{"request_log_max_rows": {HUGE}}}', "request_log_max_rows"),
    ('{"queue_wait_target_s": Infinity}', "queue_wait_target_s"),
    ('{"overload_wait_target_s": 0}', "overload_wait_target_s"),
    ('{"cache_max_mb": 1e300}', "cache_max_mb"),
    ('{"exit_hold_s": NaN}', "exit_hold_s"),
    ('{"exit_hold_s": 1e12}', "exit_hold_s"),
    ('{"cap_text_chars": 1000000000000}', "cap_text_chars"),
    (f'{{"tiers": {{"free": {{"priority": {HUGE}}}}}}}', "tiers"),
    ('{"tiers": {"free": {"request_timeout_s": Infinity}}}', "tiers"),
    ('{"tiers": {"free": {"max_chars": 100000000000}}}', "tiers"),
    ('{"tiers": {"free": {"rate_limit": "%s"}}}' % ("1/minute;" * 100), "tiers"),
    ('{"tiers": {"%s": {}}, "anonymous_tier": "personal"}' % ("t" * 65), "tiers"),
]


def numeric(model) -> list[str]:
    return [name for name, info in model.model_fields.items() if info.annotation in (int, float)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("values")
    process = start_server(data_dir, admin_token=TOKEN, calibration_sizes="1", operator_defaults="{}")
    yield process.base_url, data_dir
    process.stop()


@pytest.mark.parametrize("body, field", OUT_OF_BOUNDS, ids=[field for _, field in OUT_OF_BOUNDS])
def test_a_value_out_of_bounds_gets_422_and_nothing_is_stored(server, body, field):
    base, data_dir = server
    response = httpx.put(f"{base}/admin/api/settings", headers=ADMIN, content=body)
    assert response.status_code == 422, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "invalid_setting" and error["param"] == field
    assert HUGE not in error["message"]  # the answer names the bound, not the value
    assert httpx.get(f"{base}/admin/api/audit", headers=ADMIN).json()["data"] == []
    with sqlite3.connect(data_dir / "chorus.db") as connection:
        assert connection.execute("SELECT count(*) FROM settings").fetchone()[0] == 0
    assert httpx.get(f"{base}/admin/api/settings", headers=ADMIN).json()["settings"] == OperatorSettings().model_dump()


def test_every_number_states_its_bounds_in_the_admin_api_and_openapi(server):
    base, _ = server
    fields = httpx.get(f"{base}/admin/api/settings", headers=ADMIN).json()["fields"]
    schemas = httpx.get(f"{base}/openapi.json").json()["components"]["schemas"]
    for model, described, schema in ((OperatorSettings, fields, schemas["OperatorSettings"]),
                                      (Tier, fields["tiers"]["tier_fields"], schemas["Tier"])):
        for name in numeric(model):
            for where in (described[name], schema["properties"][name]):
                assert {"maximum", "exclusiveMaximum"} & where.keys(), (name, where)
                assert {"minimum", "exclusiveMinimum"} & where.keys(), (name, where)
    assert fields["tiers"]["maxProperties"] == schemas["OperatorSettings"]["properties"]["tiers"]["maxProperties"]


def test_a_database_holding_values_out_of_bounds_starts_says_which_and_uses_the_defaults(tmp_path):
    storage = Storage(sqlite_url(tmp_path / "chorus.db"))
    storage.migrate()
    # What an older version stored (and audited) without bounds, beside a good value.
    storage.settings.write({"request_log_max_rows": int(HUGE), "queue_wait_target_s": float("inf"),
                            "cache_max_mb": 1e300, "cap_text_chars": 222}, "old-version")
    storage.engine.dispose()
    process = start_server(tmp_path, admin_token=TOKEN, calibration_sizes="1")
    try:
        base = process.base_url
        settings = httpx.get(f"{base}/admin/api/settings", headers=ADMIN).json()["settings"]
        defaults = OperatorSettings()
        assert settings["cap_text_chars"] == 222
        assert (settings["request_log_max_rows"], settings["queue_wait_target_s"], settings["cache_max_mb"]) == (
            defaults.request_log_max_rows, defaults.queue_wait_target_s, defaults.cache_max_mb)
        ignored = httpx.get(f"{base}/admin/api/stats", headers=ADMIN).json()["storage"]["ignored_settings"]
        assert set(ignored) == {"request_log_max_rows", "queue_wait_target_s", "cache_max_mb"}
        audit = httpx.get(f"{base}/admin/api/audit", headers=ADMIN)  # holds the infinite value: still JSON
        assert audit.status_code == 200 and len(audit.json()["data"]) == 4
        # the request log, which such a row count broke every second, writes
        assert httpx.post(f"{base}/v1/audio/speech", timeout=60,
                          json={"model": "tts-1", "voice": "alloy", "input": "Logged."}).status_code == 200
        assert wait_until(lambda: storage.request_log.count() >= 1)
    finally:
        process.stop()
    lines = [line for line in process.log_path.read_text().splitlines() if "ignoring stored operator settings" in line]
    assert len(lines) == 1, lines  # once, although settings are read every second
    assert all(name in lines[0] for name in ("request_log_max_rows", "queue_wait_target_s", "cache_max_mb"))
    assert len(lines[0]) < 1000 and not re.search(r"9{100}", lines[0])  # the value is shortened


def test_the_bounds_hold_in_process_too():
    defaults = json.loads(json.dumps(OperatorSettings().model_dump()))
    for body, field in OUT_OF_BOUNDS:
        settings, ignored = OperatorSettings.from_stored({**defaults, **json.loads(body)})
        assert field in ignored and settings == OperatorSettings()
