"""Identity, API keys and tiered rate limits: slowapi's `Limiter` counts every request, the HTTP routes',
the WebSocket's, Wyoming's and the UI's alike, against the caller's one budget (its key "key:<id>" or
"ip:<address>", its limit the caller's tier's), on one counter store: in memory, or in Redis so that
replicas share it. The UI is handed `admit` too, so it is no way around them.

The counter store is never waited on from the event loop: a Redis round trip runs in a worker thread,
each call is bounded by TTS_REDIS_TIMEOUT_S, and a circuit breaker stops asking a store that keeps
failing. Whenever the store cannot answer, requests are served without limits (failing open), and
the dashboard says so.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import math
import re
import secrets
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar

from limits.errors import ConfigurationError
from limits.storage import MemoryStorage
from slowapi import Limiter
from slowapi.errors import RateLimitExceeded
from slowapi.wrappers import Limit
from starlette.requests import Request

from storage import Storage
from tts_core.config import Settings
from tts_core.errors import RateLimited, Unauthorized
from tts_core.request.access import Caller, RateLimitState, client_address
from tts_core.request.operating import OperatorSettings

log = logging.getLogger(__name__)

KEY_PREFIX = "ck-"  # Chorus keys; other bearer strings (the openai client's placeholder) are anonymous
NAMESPACE = "tts"  # the counters' key prefix in the store
# The caller the limiter is counting. slowapi calls a key function and an application limit's function
# without the caller (an application limit's without any argument), so count() hands it over here; the
# check runs in the context that set it (asyncio.to_thread copies the context into its worker thread).
_COUNTED: ContextVar[Caller] = ContextVar("rate-limited caller")
BREAKER_FAILURES = 3  # failures in a row that open the breaker (one slow answer alone does not)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def redacted(uri: str) -> str:
    return re.sub(r"//[^/@]*@", "//***@", uri)


class CircuitBreaker:
    """Closed: every check asks the counter store. After BREAKER_FAILURES failures in a row it opens:
    checks skip the store (served unlimited) until cool_down_s has passed; then one check asks it
    (half-open): success closes the breaker, failure opens it for another cool-down. One log line when
    an outage starts and one when it ends, however many requests come in between."""

    def __init__(self, cool_down_s: float, clock: Callable[[], float] = time.monotonic):
        self.cool_down_s = cool_down_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._retry_at = 0.0
        self._probing = False
        self.opened_at: float | None = None  # epoch seconds the outage started; None while closed
        self.error: str | None = None  # the store's last failure

    def allow(self) -> bool:
        """Whether this check may ask the store (while open: only the one probe after the cool-down)."""
        with self._lock:
            if self.opened_at is None:
                return True
            if self._probing or self._clock() < self._retry_at:
                return False
            self._probing = True
            return True

    def succeeded(self) -> None:
        with self._lock:
            outage, self.opened_at = self.opened_at, None
            self._failures, self._probing, self.error = 0, False, None
        if outage is not None:
            log.warning("rate-limit store answers again after %.0f s: rate limits apply again", time.time() - outage)

    def failed(self, error: str, force_open: bool = False) -> None:
        with self._lock:
            self._failures, self._probing, self.error = self._failures + 1, False, error
            if self.opened_at is None and self._failures < BREAKER_FAILURES and not force_open:
                return
            self._retry_at = self._clock() + self.cool_down_s
            if self.opened_at is not None:
                return  # still the same outage
            self.opened_at = time.time()
        log.error("rate-limit store failing (%s): serving without rate limits; asking it again every %.0f s",
                  error, self.cool_down_s)

    def state(self) -> dict:
        with self._lock:
            state = "closed" if self.opened_at is None else "half_open" if self._probing else "open"
            return {"state": state, "since": self.opened_at, "error": self.error}


class LimitExceeded(RateLimitExceeded):
    """slowapi's refusal, with the window the caller ran out of (its Retry-After and X-RateLimit headers).
    The HTTP routes answer it with the handler build_api installs; every other surface gets `refusal()`."""

    def __init__(self, limit: Limit, state: RateLimitState):
        super().__init__(limit)
        self.state = state

    def refusal(self) -> RateLimited:
        """The error table's 429 rate_limit_exceeded."""
        retry = max(1, math.ceil(self.state.reset_at - time.time()))
        return RateLimited(f"rate limit of {self.limit.limit} exceeded; retry after {retry} s", retry,
                           self.state.headers())


class AccessControl:
    def __init__(self, storage: Storage, settings: Settings, operator: Callable[[], OperatorSettings]):
        """ValueError names the setting at fault when TTS_RATELIMIT_STORAGE or TTS_TRUSTED_PROXIES is unusable."""
        self.storage = storage
        self.operator = operator
        self.require_api_key = settings.require_api_key
        self.trusted_proxies = _checked_networks(settings.trusted_proxies)
        self.store_uri = redacted(settings.ratelimit_storage)
        self.limiter = _tier_limiter(settings.ratelimit_storage, settings.redis_timeout_s)
        self.strategy = self.limiter.limiter  # the fixed-window counting that every surface shares
        self.counters = self.strategy.storage
        self.remote = not isinstance(self.counters, MemoryStorage)  # its calls wait on the network
        self.breaker = CircuitBreaker(settings.redis_cooldown_s)
        self._keys: dict[str, dict] = {}
        self.refresh_keys()
        if self.remote and not self.counters.check():  # said at start-up, not at the first request
            self.breaker.failed(f"{self.store_uri} does not answer at start-up", force_open=True)

    @property
    def storage_error(self) -> str | None:
        """The counter store's last failure, shown on the dashboard."""
        return self.breaker.error

    # --- keys (blocking: the admin routes call these from worker threads) -----------------------

    def refresh_keys(self) -> None:
        self._keys = {row["key_hash"]: row for row in self.storage.keys.all() if row["revoked_at"] is None}

    def create_key(self, name: str, tier: str, actor: str) -> tuple[str, dict]:
        """A new key: the only time its plain text exists is in this return value."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        record = self.storage.keys.add(key[:10], hash_key(key), name, tier, actor)
        self.refresh_keys()
        return key, record

    def revoke_key(self, key_id: int, actor: str) -> dict | None:
        record = self.storage.keys.revoke(key_id, actor)
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

    async def admit(self, authorization: str | None, peer: str | None, forwarded_for: str | None
                    ) -> tuple[Caller, RateLimitState | None]:
        caller = self.identify(authorization, peer, forwarded_for)
        return caller, await self.hit(caller)

    async def hit(self, caller: Caller) -> RateLimitState | None:
        """Count one request, refused as the error table's RateLimited when over a limit: for the surfaces
        that are not HTTP routes (the WebSocket, Wyoming, the UI, a batch's items)."""
        try:
            return await self.counted(caller)
        except LimitExceeded as exceeded:
            raise exceeded.refusal() from None

    async def counted(self, caller: Caller) -> RateLimitState | None:
        """Count one request against the caller's tier limits (LimitExceeded when over one), without
        blocking the event loop: a remote store is asked from a worker thread."""
        if self.remote and caller.tier.rate_limit is not None:
            return await asyncio.to_thread(self.count, caller)
        return self.count(caller)

    def count(self, caller: Caller) -> RateLimitState | None:
        """The one rate-limit check (blocking): slowapi's, then the window of the limit it reports (the
        one exceeded, else the shortest). A store that fails, or is skipped while the breaker is open,
        limits nothing."""
        if caller.tier.rate_limit is None or not self.breaker.allow():
            return None
        # slowapi checks a request and leaves its verdict on the request's state: one of its own for each
        # check (a WebSocket message, a Wyoming event or a UI click is no HTTP request to hand it)
        checked = Request({"type": "http", "path": "/", "headers": [], "state": {}})
        counting = _COUNTED.set(caller)
        try:
            exceeded = self._exceeded(checked)
            item, keys = checked.state.view_rate_limit
            reset_at, remaining = self.strategy.get_window_stats(item, *keys)
        except Exception as error:  # the store is down, slow or refusing: serve, and say so (once)
            self.breaker.failed(f"{type(error).__name__}: {error}")
            return None
        finally:
            _COUNTED.reset(counting)
        self.breaker.succeeded()
        state = RateLimitState(item.amount, remaining, reset_at)
        if exceeded is not None:
            raise LimitExceeded(exceeded.limit, state)
        return state

    def _exceeded(self, checked: Request) -> RateLimitExceeded | None:
        """slowapi counts the request against its application limits (as its own middleware asks it to);
        a store's failure is raised, not swallowed."""
        try:
            self.limiter._check_request_limit(checked, None, True)
        except RateLimitExceeded as exceeded:
            return exceeded
        return None


def _counted_identity() -> str:
    return _COUNTED.get().identity


def _counted_tier_limit() -> str:
    return _COUNTED.get().tier.rate_limit


def _tier_limiter(uri: str, timeout_s: float) -> Limiter:
    """slowapi's Limiter over the counter store at uri: one budget per caller shared by every surface (an
    application limit, scope "global"), of its tier's limit. Every Redis call is bounded by timeout_s
    (connecting included); failures reach count(), which fails open (no in-memory fallback, no swallowing)."""
    remote = uri.split(":", 1)[0].startswith(("redis", "valkey"))
    options = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s} if remote else {}
    try:
        return Limiter(key_func=_counted_identity, application_limits=[_counted_tier_limit], storage_uri=uri,
                       storage_options=options, strategy="fixed-window", key_prefix=NAMESPACE)
    except (ConfigurationError, ValueError) as error:
        raise ValueError(f"TTS_RATELIMIT_STORAGE {redacted(uri)!r} cannot be used: {error}") from None


def _checked_networks(proxies: list[str]) -> list[str]:
    for proxy in proxies:
        try:
            ipaddress.ip_network(proxy, strict=False)
        except ValueError:
            raise ValueError(f"TTS_TRUSTED_PROXIES: {proxy!r} is not an address or network") from None
    return proxies
