"""Failed key checks, made cheap to refuse: a short negative cache of bad key hashes, and a budget of
failures per client address (issue 18).

An API key is 256 random bits (service.db.projects.create_api_key): guessing one is hopeless, so what a
flood of bad keys costs is a database lookup each, taken from real users' turns (deps.in_db_thread).
The negative cache answers a key just refused again without the database; the address budget stops
a client that sends many different bad keys. Both are bounded (least recently failed dropped first)
and both live in one server process: under `api --workers N` each process counts on its own.

The negative cache cannot hide a valid key: a hash is cached only after the database refused it, for
bad_key_ttl_s. A refused key becomes valid later only if that exact secret is created afterwards, and
`trainjobs keys create` draws each secret fresh from the system's CSPRNG; a revoked key stays revoked.
"""

from __future__ import annotations

import ipaddress
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar


def env_number(name: str, default: float) -> float:
    """A non-negative number from the environment, or the default; a bad value stops the start, naming it."""
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r} must not be negative")
    return value


@dataclass(frozen=True)
class AuthThrottleConfig:
    max_failures: int = 20  # failed key checks per address per window before a 429; 0: no limit
    window_s: float = 60.0  # the window, and so the longest a blocked address waits
    bad_key_ttl_s: float = 30.0  # how long a refused key's hash is answered from memory; 0: not cached
    max_addresses: int = 10_000  # addresses tracked (a few hundred bytes each)
    max_bad_keys: int = 10_000  # hashes cached (32 bytes each, plus the dict's own)
    # A key this process accepted recently is let through a held address: on one host (local jobs, the
    # CLI and the dashboard all connect from 127.0.0.1) or behind an untrusted proxy, one tenant's flood
    # of bad keys must not lock every other tenant's working key out. It still goes through the full
    # key check (a revoked key is refused); it only skips the wait.
    good_key_ttl_s: float = 600.0
    max_good_keys: int = 10_000

    @classmethod
    def from_env(cls) -> AuthThrottleConfig:
        """TRAINJOBS_AUTH_MAX_FAILURES, TRAINJOBS_AUTH_WINDOW_S, TRAINJOBS_AUTH_BAD_KEY_TTL_S; a bad value
        stops the API's start, naming the variable."""
        return cls(max_failures=int(env_number("TRAINJOBS_AUTH_MAX_FAILURES", cls.max_failures)),
                   window_s=env_number("TRAINJOBS_AUTH_WINDOW_S", cls.window_s),
                   bad_key_ttl_s=env_number("TRAINJOBS_AUTH_BAD_KEY_TTL_S", cls.bad_key_ttl_s))


def trusted_proxies() -> str:
    """The addresses (or networks, a.b.c.d/n) whose X-Forwarded-For the server believes, as uvicorn's
    forwarded_allow_ips takes them: TRAINJOBS_TRUSTED_PROXIES, else none. uvicorn's own default trusts
    127.0.0.1, where every local job's code connects from: it could name any address it liked."""
    return os.environ.get("TRAINJOBS_TRUSTED_PROXIES", "").strip()


def address_key(host: str | None) -> str:
    """Whom a failure is counted against: the IPv4 address, or the IPv6 /64 (one host's usual share:
    counting single IPv6 addresses would let it rotate through 2**64 of them)."""
    if not host:
        return "unknown"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host  # a unix socket's peer, say
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


# Set by the middleware around each request that presents a key; the key check (service/deps.py) marks
# it accepted, from whichever thread it runs in (a copied context shares the dict). Only that check can
# say a key works: a 404 for an unknown path, say, is answered before any key is looked at.
_KEY_CHECK: ContextVar[dict[str, bool] | None] = ContextVar("trainjobs_key_check", default=None)


def watch_key_check() -> dict[str, bool]:
    """For the middleware: what the request's key check finds ({"accepted": ...})."""
    result = {"accepted": False}
    _KEY_CHECK.set(result)
    return result


def key_accepted() -> None:
    """For the key check: this request's key belongs to a project."""
    if (result := _KEY_CHECK.get()) is not None:
        result["accepted"] = True


class AuthThrottle:
    """The state of one server process. Used from its event loop only, so it takes no lock."""

    def __init__(self, config: AuthThrottleConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self._clock = config, clock
        self._bad_keys: OrderedDict[bytes, float] = OrderedDict()  # hash -> when it expires
        self._good_keys: OrderedDict[bytes, float] = OrderedDict()  # hash -> when it expires
        self._failures: OrderedDict[str, tuple[float, int]] = OrderedDict()  # address -> (window start, count)

    def retry_after(self, address: str) -> float | None:
        """Seconds until this address may try a key again, or None if it may now."""
        entry = self._failures.get(address)
        if entry is None or not self.config.max_failures:
            return None
        started, count = entry
        left = started + self.config.window_s - self._clock()
        return left if count >= self.config.max_failures and left > 0 else None

    def known_bad(self, key_hash: bytes) -> bool:
        return _fresh(self._bad_keys, key_hash, self._clock())

    def known_good(self, key_hash: bytes) -> bool:
        """Accepted by this process within good_key_ttl_s: not held by its address's failures."""
        return _fresh(self._good_keys, key_hash, self._clock())

    def accepted(self, key_hash: bytes) -> None:
        _remember(self._good_keys, key_hash, self._clock() + self.config.good_key_ttl_s, self.config.max_good_keys)

    def failed(self, address: str, key_hash: bytes) -> None:
        """A key from this address was refused."""
        now = self._clock()
        self._good_keys.pop(key_hash, None)  # revoked since
        if self.config.bad_key_ttl_s > 0:
            _remember(self._bad_keys, key_hash, now + self.config.bad_key_ttl_s, self.config.max_bad_keys)
        started, count = self._failures.get(address, (now, 0))
        if now - started >= self.config.window_s:
            started, count = now, 0
        _remember(self._failures, address, (started, count + 1), self.config.max_addresses)

    def sizes(self) -> tuple[int, int]:
        """(addresses tracked, hashes cached): what the caps bound."""
        return len(self._failures), len(self._bad_keys)  # the good keys' table has the same kind of cap


K = TypeVar("K")
V = TypeVar("V")


def _fresh(table: OrderedDict[K, float], key: K, now: float) -> bool:
    """Whether key is in table and not yet expired (an expired entry is dropped)."""
    expires = table.get(key)
    if expires is None:
        return False
    if expires <= now:
        del table[key]
        return False
    return True


def _remember(table: OrderedDict[K, V], key: K, value: V, cap: int) -> None:
    """Set key, most recent last, and drop the least recent past cap."""
    table[key] = value
    table.move_to_end(key)
    while len(table) > cap:
        table.popitem(last=False)
