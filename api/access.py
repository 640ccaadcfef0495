"""Identity, API keys and tiered rate limits (slowapi's Limiter over `limits` storage: memory, or
Redis so that replicas share counters). The UI is handed `admit` too, so it is no way around them."""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import time
from collections.abc import Callable

import limits
from slowapi import Limiter

from storage import Storage
from tts_core.access import Caller, RateLimitState, client_address
from tts_core.config import Settings
from tts_core.degrade import OperatorSettings
from tts_core.errors import RateLimited, Unauthorized

log = logging.getLogger(__name__)

KEY_PREFIX = "ck-"  # Chorus keys; other bearer strings (the openai client's placeholder) are anonymous
NAMESPACE = "tts"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class AccessControl:
    def __init__(self, storage: Storage, settings: Settings, operator: Callable[[], OperatorSettings]):
        self.storage = storage
        self.operator = operator
        self.require_api_key = settings.require_api_key
        self.trusted_proxies = settings.trusted_proxies
        self.limiter = Limiter(key_func=lambda request: "", storage_uri=settings.ratelimit_storage,
                               strategy="fixed-window")
        self.storage_error: str | None = None  # the counter store's last failure, shown on the dashboard
        self._keys: dict[str, dict] = {}
        self.refresh_keys()

    # --- keys ----------------------------------------------------------------------------------

    def refresh_keys(self) -> None:
        self._keys = {row["key_hash"]: row for row in self.storage.api_keys() if row["revoked_at"] is None}

    def create_key(self, name: str, tier: str, actor: str) -> tuple[str, dict]:
        """A new key: the only time its plain text exists is in this return value."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        record = self.storage.add_api_key(key[:10], hash_key(key), name, tier, actor)
        self.refresh_keys()
        return key, record

    def revoke_key(self, key_id: int, actor: str) -> dict | None:
        record = self.storage.revoke_api_key(key_id, actor)
        self.refresh_keys()
        return record

    # --- callers -------------------------------------------------------------------------------

    def identify(self, authorization: str | None, peer: str | None, forwarded_for: str | None) -> Caller:
        operator = self.operator()
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token.startswith(KEY_PREFIX):
            record = self._keys.get(hash_key(token))
            if record is None:
                raise Unauthorized("invalid or revoked API key")
            tier_name = record["tier"] if record["tier"] in operator.tiers else operator.anonymous_tier
            return Caller(f"key:{record['id']}", tier_name, operator.tiers[tier_name], record["id"])
        if self.require_api_key:
            raise Unauthorized("an API key is required: send Authorization: Bearer <key>")
        address = client_address(peer, forwarded_for, self.trusted_proxies)
        return Caller(f"ip:{address}", operator.anonymous_tier, operator.tiers[operator.anonymous_tier])

    def hit(self, caller: Caller) -> RateLimitState | None:
        """Count one request against the caller's tier limits; RateLimited when over one of them."""
        if caller.tier.rate_limit is None:
            return None
        strategy = self.limiter.limiter
        tightest = None
        for item in limits.parse_many(caller.tier.rate_limit):
            try:
                allowed = strategy.hit(item, NAMESPACE, caller.identity)
                reset_at, remaining = strategy.get_window_stats(item, NAMESPACE, caller.identity)
            except Exception as error:  # the counter store is down: serve, and say so loudly
                self.storage_error = f"{type(error).__name__}: {error}"
                log.error("rate limit storage failed, not limiting: %s", self.storage_error)
                return None
            state = RateLimitState(item.amount, remaining, reset_at)
            if not allowed:
                retry = max(1, math.ceil(reset_at - time.time()))
                raise RateLimited(f"rate limit of {item} exceeded; retry after {retry} s", retry, state.headers())
            if tightest is None or state.remaining < tightest.remaining:
                tightest = state
        self.storage_error = None
        return tightest

    def admit(self, authorization: str | None, peer: str | None, forwarded_for: str | None
              ) -> tuple[Caller, RateLimitState | None]:
        caller = self.identify(authorization, peer, forwarded_for)
        return caller, self.hit(caller)
