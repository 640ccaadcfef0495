"""The admin token check, shared by the admin API and the Admin tab, with wrong guesses slowed down.

After FAILURES wrong tokens within WINDOW_S from one address, that address is refused (429, with
Retry-After) for BLOCK_S, twice as long after each next block, up to MAX_BLOCK_S; while refused, even
the right token is not looked at, so guessing goes no faster. A right token clears the address.
All of it is in memory under a lock held for microseconds: it never waits on anything.
"""

from __future__ import annotations

import hmac
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

FAILURES = 5
WINDOW_S = 60.0
BLOCK_S = 60.0
MAX_BLOCK_S = 3600.0
MAX_ADDRESSES = 10_000  # addresses remembered; the least recently seen are forgotten first


class AdminRefused(Exception):
    """Why an admin request is refused: status 401 (no token), 403 (wrong token, or admin is
    disabled) or 429 (too many wrong tokens; retry_after_s says when to try again)."""

    def __init__(self, status: int, message: str, retry_after_s: int | None = None):
        super().__init__(message)
        self.status, self.message, self.retry_after_s = status, message, retry_after_s


@dataclass
class _Record:
    failures: list[float] = field(default_factory=list)  # times of recent wrong tokens
    blocks: int = 0  # blocks so far: each next one lasts twice as long
    blocked_until: float = 0.0


class AdminGate:
    def __init__(self, token: str | None, clock: Callable[[], float] = time.monotonic):
        self.token = token
        self._clock = clock
        self._lock = threading.Lock()
        self._records: OrderedDict[str, _Record] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return bool(self.token)

    def check(self, given: str | None, address: str) -> None:
        """Return if given is the admin token; otherwise AdminRefused."""
        if not self.token:
            raise AdminRefused(403, "admin is disabled: set TTS_ADMIN_TOKEN to enable it")
        if not given:
            raise AdminRefused(401, "admin token required: send Authorization: Bearer <token>")
        with self._lock:
            record = self._record(address)
            now = self._clock()
            if now < record.blocked_until:
                raise _too_many(record.blocked_until - now)
            if hmac.compare_digest(given.encode(), self.token.encode()):
                del self._records[address]
                return
            record.failures = [moment for moment in record.failures if now - moment < WINDOW_S] + [now]
            if len(record.failures) < FAILURES:
                raise AdminRefused(403, "wrong admin token")
            block_s = min(MAX_BLOCK_S, BLOCK_S * 2**record.blocks)
            record.failures, record.blocks, record.blocked_until = [], record.blocks + 1, now + block_s
        raise _too_many(block_s)

    def _record(self, address: str) -> _Record:
        record = self._records.pop(address, None) or _Record()
        self._records[address] = record  # most recently seen last
        while len(self._records) > MAX_ADDRESSES:
            self._records.popitem(last=False)
        return record


def _too_many(wait_s: float) -> AdminRefused:
    retry = max(1, math.ceil(wait_s))
    return AdminRefused(429, f"too many wrong admin tokens from this address; try again in {retry} s", retry)
