import pytest
from pydantic import ValidationError

from tests.unit.conftest import make_item
from tts_core.access import Tier, client_address
from tts_core.queue import QueueFull, RequestQueue


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
