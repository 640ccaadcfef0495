import asyncio

import pytest
from pydantic import ValidationError

from tests.unit.conftest import make_item
from tts_core.request.access import Tier, client_address
from tts_core.scheduler.queue import QueueFull, RequestQueue


@pytest.mark.parametrize("peer, forwarded, trusted, expected", [
    ("203.0.113.9", "1.2.3.4", [], "203.0.113.9"),  # nobody trusted: XFF ignored
    ("203.0.113.9", "1.2.3.4", ["10.0.0.0/8"], "203.0.113.9"),  # peer is not a trusted proxy
    ("10.0.0.5", "1.2.3.4", ["10.0.0.0/8"], "1.2.3.4"),
    ("10.0.0.5", "6.6.6.6, 1.2.3.4", ["10.0.0.0/8"], "1.2.3.4"),  # the client's own prefix is not believed
    ("10.0.0.5", "1.2.3.4, 10.0.0.7", ["10.0.0.0/8"], "1.2.3.4"),  # a chain of trusted proxies
    ("10.0.0.5", None, ["10.0.0.0/8"], "10.0.0.5"),
    ("::1", "2001:db8::1", ["::1"], "2001:db8::1"),
])
def test_client_address(peer, forwarded, trusted, expected):
    assert client_address(peer, forwarded, trusted) == expected


def test_tier_rate_limits_must_parse():
    assert Tier(rate_limit="5/second;100/hour").rate_limit == "5/second;100/hour"
    with pytest.raises(ValidationError):
        Tier(rate_limit="lots")


def test_a_tier_holds_at_most_its_share_of_the_queue():
    queue = RequestQueue(10)
    free = [make_item(10) for _ in range(3)]
    for item in free:
        item.tier = "free"
    queue.put_many(free[:2], tier_limit=3)
    extra = make_item(10)
    extra.tier = "free"
    with pytest.raises(QueueFull, match="share"):
        queue.put_many([free[2], extra], tier_limit=3)  # 2 + 2 > 3
    queue.put_many(free[2:], tier_limit=3)
    other = make_item(10)
    other.tier = "pro"
    queue.put_many([other], tier_limit=3)  # another tier is not counted
    assert len(queue) == 4


def test_a_dead_rate_limit_store_fails_open_and_says_so(tmp_path):
    from access.control import AccessControl
    from admin.control import OperatorControl
    from admin.stats import collect_stats
    from storage import Storage, sqlite_url
    from storage.request_log import RequestLogWriter
    from tests.fakes import FakeEngine
    from tts_core.config import Settings
    from tts_core.controls import ServiceControls
    from tts_core.monitor import Monitor
    from tts_core.ops.metrics import Metrics
    from tts_core.request.operating import OperatorSettings
    from tts_core.service import SpeechService

    storage = Storage(sqlite_url(tmp_path / "c.db"))
    storage.migrate()
    access = AccessControl(storage, Settings(ratelimit_storage="redis://127.0.0.1:1/0"), OperatorSettings)
    caller, limit = asyncio.run(access.admit(None, "192.0.2.1", None))  # the tier has a limit, no store answers
    assert caller.tier_name == "personal" and limit is None
    assert "does not answer" in access.storage_error
    service = SpeechService(Settings(), [FakeEngine()], Metrics())
    controls = ServiceControls(service)
    control = OperatorControl(storage, controls, RequestLogWriter(storage))
    stats = collect_stats(controls, Monitor(service), control, access)
    assert stats["storage"]["rate_limit_error"] == access.storage_error
