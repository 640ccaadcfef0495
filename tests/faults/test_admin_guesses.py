"""Wrong admin tokens (#14): after five in a minute from one address, that address is answered 429 with
Retry-After, for longer each time, by the admin API and the Admin tab's sign-in alike; other addresses
are not affected, and a right token clears the count."""

from types import SimpleNamespace

import httpx
import pytest

from admin.gate import AdminGate, AdminRefused
from app import create_app
from tests.fakes import FakeEngine
from tests.serve import serve_in_thread
from tts_core.config import Settings

TOKEN = "guess-admin-token"


@pytest.fixture
def world(tmp_path):
    settings = Settings(data_dir=tmp_path, admin_token=TOKEN, trusted_proxies=["127.0.0.1"], calibration_sizes=[1],
                        model_aliases={}, voice_aliases={})
    app = create_app(settings, engines=[FakeEngine()])
    with serve_in_thread(app) as base:
        yield base, app


def admin_api(base: str, token: str, address: str) -> httpx.Response:
    return httpx.get(f"{base}/admin/api/settings",
                     headers={"Authorization": f"Bearer {token}", "X-Forwarded-For": address})


def tab_sign_in(app, token: str, address: str) -> tuple[bool, str]:
    """The Admin tab's sign-in handler, as Gradio calls it for a browser at address (via the proxy)."""
    blocks = next(route.app.blocks for route in app.routes if hasattr(getattr(route, "app", None), "blocks"))
    sign_in = next(function.fn for function in blocks.fns.values() if function.name == "sign_in")
    request = SimpleNamespace(client=SimpleNamespace(host="127.0.0.1"), headers={"x-forwarded-for": address})
    outputs = sign_in(token, request)
    return outputs[0], outputs[3]


def test_wrong_tokens_are_slowed_down_per_address_in_the_api_and_the_tab(world):
    base, app = world
    assert [admin_api(base, "wrong", "198.51.100.1").status_code for _ in range(5)] == [403] * 4 + [429]
    blocked = admin_api(base, TOKEN, "198.51.100.1")  # even the right token, while blocked
    assert blocked.status_code == 429 and blocked.json()["error"]["code"] == "rate_limit_exceeded"
    assert 50 <= int(blocked.headers["retry-after"]) <= 60
    assert admin_api(base, TOKEN, "198.51.100.2").status_code == 200  # another address
    signed_in, message = tab_sign_in(app, TOKEN, "198.51.100.1")
    assert not signed_in and "too many wrong admin tokens" in message
    assert tab_sign_in(app, TOKEN, "198.51.100.2")[0]
    # wrong sign-ins in the tab count as much as wrong API calls
    assert [tab_sign_in(app, "wrong", "198.51.100.3")[1] for _ in range(5)][-1].startswith("too many")
    assert admin_api(base, TOKEN, "198.51.100.3").status_code == 429


def test_each_block_lasts_twice_as_long_and_a_right_token_clears_the_count():
    now = [0.0]
    gate = AdminGate(TOKEN, clock=lambda: now[0])

    def guess(token: str = "wrong") -> int | None:
        try:
            gate.check(token, "203.0.113.5")
        except AdminRefused as refused:
            return refused.retry_after_s if refused.status == 429 else refused.status
        return 200

    assert [guess() for _ in range(5)] == [403] * 4 + [60]
    now[0] = 60.0
    assert [guess() for _ in range(5)] == [403] * 4 + [120]
    assert guess(TOKEN) == 120  # blocked: not even looked at
    now[0] = 180.0
    assert guess(TOKEN) == 200
    assert [guess() for _ in range(5)] == [403] * 4 + [60]  # cleared by the right token
    now[0] = 240.0
    assert [guess() for _ in range(4)] == [403] * 4
    now[0] = 301.0  # the earlier wrong ones are past the minute
    assert guess() == 403
    gate_off = AdminGate(None)
    with pytest.raises(AdminRefused) as disabled:
        gate_off.check(TOKEN, "203.0.113.5")
    assert disabled.value.status == 403
