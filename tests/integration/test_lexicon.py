"""The pronunciation lexicon over HTTP, with the real bundled Piper voice: two app instances on one
SQLite file, as two replicas. An entry added through one changes what both say (within the settings
refresh on the other), goes out and comes back as TSV, is audited, and goes again when deleted."""

from contextlib import ExitStack

import httpx
import pytest

from app import create_app
from tests.serve import serve_in_thread, wait_until
from tts_core.config import Settings
from tts_core.engines.piper import PiperEngine, bundled_voice_path

TOKEN = "lexicon-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}", "X-Chorus-Actor": "ops-lex"}
TEXT = "We drove to Worcester today."
ENTRY = {"language": "en", "phrase": "Worcester", "ipa": "ˈwʊstəɹʃaɪɚ"}


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("lexicon")
    settings = Settings(data_dir=data_dir, admin_token=TOKEN, calibration_sizes=[1],
                        operator_defaults={"cache_enabled": False, "anonymous_tier": "enterprise"})
    with ExitStack() as stack:
        apps = [create_app(settings, engines=[PiperEngine(bundled_voice_path(), noise_scale=0.0, noise_w=0.0)])
                for _ in range(2)]
        yield [(app, stack.enter_context(serve_in_thread(app))) for app in apps]


def spoken_bytes(base: str, text: str = TEXT) -> int:
    response = httpx.post(f"{base}/v1/audio/speech", timeout=60,
                          json={"model": "piper", "voice": "en_US-joe-medium", "input": text, "response_format": "wav"})
    assert response.status_code == 200, response.text
    return len(response.content)


def phrases(app) -> list[str]:
    """The phrases of the lexicon the app applies now."""
    return [entry.phrase for entry in app.state.service.admission.lexicon.entries]


def test_an_entry_changes_what_every_replica_says(replicas):
    (first_app, first), (second_app, second) = replicas
    before = spoken_bytes(first)
    assert spoken_bytes(second) == before
    added = httpx.post(f"{first}/admin/api/lexicon", headers=ADMIN, json=ENTRY)
    assert added.status_code == 201, added.text
    entry = added.json()
    assert entry["updated_by"] == "ops-lex" and entry["case_sensitive"] is False
    again = httpx.post(f"{first}/admin/api/lexicon", headers=ADMIN, json={**ENTRY, "ipa": "x"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "lexicon_entry_exists"
    listed = httpx.get(f"{second}/admin/api/lexicon", headers=ADMIN, params={"language": "en"}).json()["data"]
    assert [row["phrase"] for row in listed] == ["Worcester"]

    with_entry = spoken_bytes(first)
    assert with_entry != before
    assert spoken_bytes(first, "We drove to [Worcester](/ˈwʊstəɹʃaɪɚ/) today.") == with_entry  # inline: the same
    assert wait_until(lambda: phrases(second_app) == ["Worcester"], timeout_s=5)
    assert spoken_bytes(second) == with_entry

    exported = httpx.get(f"{first}/admin/api/lexicon/export", headers=ADMIN)
    assert exported.headers["content-type"].startswith("text/tab-separated-values")
    assert exported.text.splitlines()[1] == "en\tWorcester\tˈwʊstəɹʃaɪɚ\t\tfalse"
    more = exported.text + "en\tNguyen\t\twin\n"
    imported = httpx.post(f"{second}/admin/api/lexicon/import", content=more.encode(),
                          headers={**ADMIN, "Content-Type": "text/tab-separated-values"})
    assert imported.status_code == 200 and imported.json() == {"added": 1, "changed": 0, "unchanged": 1}

    deleted = httpx.delete(f"{second}/admin/api/lexicon/{entry['id']}", headers=ADMIN)
    assert deleted.status_code == 200 and deleted.json()["phrase"] == "Worcester"
    assert httpx.delete(f"{second}/admin/api/lexicon/{entry['id']}", headers=ADMIN).status_code == 404
    assert wait_until(lambda: phrases(first_app) == ["Nguyen"], timeout_s=5)
    assert spoken_bytes(first) == before
    audit = httpx.get(f"{first}/admin/api/audit", headers=ADMIN).json()["data"]
    assert [row["action"] for row in audit[:3]] == ["lexicon.delete", "lexicon.import", "lexicon.add"]
    assert all(row["actor"] == "ops-lex" for row in audit[:3])


def test_bad_input_is_refused_naming_what_is_wrong(replicas):
    _, base = replicas[0]
    bad_file = "language\tphrase\tipa\trespelling\tcase_sensitive\nen\tfine\tfaɪn\nen\t!!\tə\nxx1\tword\tə\n"
    response = httpx.post(f"{base}/admin/api/lexicon/import", headers=ADMIN, content=bad_file.encode())
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "line 3" in message and "line 4" in message and "line 2" not in message
    assert all(row["phrase"] != "fine" for row in httpx.get(f"{base}/admin/api/lexicon", headers=ADMIN).json()["data"])
    for body in ({**ENTRY, "ipa": None}, {**ENTRY, "phrase": "x" * 500}, {**ENTRY, "language": 5}, {"phrase": "a"}):
        response = httpx.post(f"{base}/admin/api/lexicon", headers=ADMIN, json=body)
        assert response.status_code == 422 and response.json()["error"]["type"] == "invalid_request_error"
    assert httpx.put(f"{base}/admin/api/lexicon/999999", headers=ADMIN, json=ENTRY).status_code == 404
    assert httpx.post(f"{base}/admin/api/lexicon/import", headers=ADMIN, content=b"\xff\xfe").status_code == 400
    assert httpx.get(f"{base}/admin/api/lexicon", headers={"Authorization": "Bearer wrong"}).status_code == 403
