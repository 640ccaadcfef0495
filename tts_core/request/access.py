"""Who is calling and what their tier allows: tiers, callers, client addresses, access errors."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

import limits
from pydantic import BaseModel, ConfigDict, Field, field_validator


class Tier(BaseModel):
    """What a tier of callers may do. Bounded like every operator value (see OperatorSettings)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    rate_limit: str | None = Field(None, max_length=200,
                                   description='e.g. "10/minute" or "100/hour;1000/day"; null: unlimited')
    priority: int = Field(0, ge=-100, le=100, description="higher runs earlier in the queue")
    max_chars: int = Field(5000, ge=1, le=1_000_000, description="longest text this tier may send")
    sheddable: bool = Field(True, description="refused first while degrade mode sheds load")
    max_queue_share: float = Field(1.0, gt=0, le=1, description="most of the queue this tier may hold")
    request_timeout_s: float = Field(120.0, gt=0, le=86_400, description="deadline for its queued work")

    @field_validator("rate_limit")
    @classmethod
    def _parseable(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                limits.parse_many(value)
            except ValueError:
                raise ValueError(f"{value!r} is not a rate limit like '10/minute'") from None
        return value


DEFAULT_TIERS = {
    # what a fresh server gives callers without a key: one person's use (a script of requests, Open WebUI reading
    # a long answer a sentence per request); a public server sets its anonymous tier to "free"
    "personal": Tier(rate_limit="300/minute", priority=0, max_chars=5000, sheddable=True, max_queue_share=0.8,
                     request_timeout_s=120.0),
    "free": Tier(rate_limit="10/minute", priority=0, max_chars=1000, sheddable=True, max_queue_share=0.5,
                 request_timeout_s=60.0),
    "pro": Tier(rate_limit="120/minute", priority=1, max_chars=5000, sheddable=False, max_queue_share=0.8,
                request_timeout_s=120.0),
    "enterprise": Tier(rate_limit=None, priority=2, max_chars=5000, sheddable=False, max_queue_share=1.0,
                       request_timeout_s=300.0),
}


@dataclass(frozen=True)
class Caller:
    identity: str  # "key:<id>" or "ip:<address>": what rate limits and job ownership count by
    tier_name: str
    tier: Tier
    key_id: int | None = None


@dataclass(frozen=True)
class RateLimitState:
    limit: int
    remaining: int
    reset_at: float  # epoch seconds

    def headers(self) -> dict[str, str]:
        return {"X-RateLimit-Limit": str(self.limit), "X-RateLimit-Remaining": str(self.remaining),
                "X-RateLimit-Reset": str(int(self.reset_at))}


def trusted_proxy(trusted_proxies: list[str]) -> Callable[[str], bool]:
    """Whether an address is one of the trusted proxies (addresses or networks)."""
    networks = [ipaddress.ip_network(proxy, strict=False) for proxy in trusted_proxies]

    def trusted(address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in networks)
    return trusted


def client_address(peer: str | None, forwarded_for: str | None, trusted_proxies: list[str]) -> str:
    """The caller's address: the socket peer, unless the peer is a trusted proxy; then the
    right-most X-Forwarded-For entry that is not itself a trusted proxy. X-Forwarded-For from
    anyone else is ignored, so it cannot be spoofed to dodge a limit."""
    trusted = trusted_proxy(trusted_proxies)
    address = peer or "unknown"
    if not forwarded_for or not trusted(address):
        return address
    for hop in reversed([part.strip() for part in forwarded_for.split(",") if part.strip()]):
        address = hop
        if not trusted(hop):
            break
    return address
