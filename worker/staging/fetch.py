"""Downloading an https:// dataset without letting a job reach what only the worker can reach.

A URL names a host; what matters is the address the worker connects to. So every connection goes
through `_PublicOnly`, which resolves the host itself, refuses private, loopback, link-local,
multicast and reserved addresses (trainjobs/source_rules.is_public) and connects to the address it
checked: a DNS answer that changes between a check and the connect (rebinding) cannot slip through.
TLS still verifies the certificate for the URL's host name. Redirects are followed here, a bounded
number, each hop held to the same rules. The body streams to disk under a byte cap and a deadline,
and environment proxies are never used (a proxy would connect on our behalf, unchecked).

Hosts on the operator's allow-list (TRAINJOBS_FETCH_ALLOW_HOSTS) skip the address rule and may use
plain http; tests serve data from 127.0.0.1 that way.
"""

from __future__ import annotations

import ipaddress
import socket
import time
import typing
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpcore

from trainjobs.source_rules import DataAccessRules, SourceRefused, is_public
from worker.staging.budget import StagingBudget
from worker.staging.errors import DatasetError

_CHUNK = 1 << 20
_REDIRECTS = (301, 302, 303, 307, 308)


class _PublicOnly(httpcore.NetworkBackend):
    """Connects only to public addresses, unless the host is allow-listed."""

    def __init__(self, rules: DataAccessRules):
        self.rules, self.inner = rules, httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: typing.Iterable[typing.Any] | None = None) -> httpcore.NetworkStream:
        if self.rules.allows_host(host):
            return self.inner.connect_tcp(host, port, timeout, local_address, socket_options)
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise _Refused(host) from None
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
        if not addresses or not all(is_public(a) for a in addresses):
            raise _Refused(host)
        return self.inner.connect_tcp(str(addresses[0]), port, timeout, local_address, socket_options)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: typing.Iterable[typing.Any] | None = None) -> httpcore.NetworkStream:
        raise _Refused("a unix socket")


class _Refused(Exception):
    def __init__(self, host: str):
        super().__init__(host)
        self.host = host


def fetch(url: str, target: Path, *, rules: DataAccessRules, budget: StagingBudget) -> Path:
    """Download url to target, following redirects; DatasetError (naming no response bytes) if it fails."""
    limits = budget.limits
    deadline = time.monotonic() + limits.fetch_timeout_s
    with httpcore.ConnectionPool(network_backend=_PublicOnly(rules), max_connections=2, retries=0) as pool:
        current = url
        for _ in range(limits.max_redirects + 1):
            try:
                rules.check_url(current)
            except SourceRefused as exc:
                raise DatasetError(f"downloading {url} failed: {exc}") from None
            location = _get(pool, current, url, target, budget, deadline)
            if location is None:
                return target
            current = urljoin(current, location)
        raise DatasetError(f"downloading {url} failed: more than {limits.max_redirects} redirects")


def _get(pool: httpcore.ConnectionPool, current: str, url: str, target: Path, budget: StagingBudget,
         deadline: float) -> str | None:
    """One request: the redirect's Location, or None once the body is on disk."""
    left = max(0.1, deadline - time.monotonic())
    timeouts = {"connect": min(30.0, left), "read": min(60.0, left), "write": min(30.0, left), "pool": min(30.0, left)}
    host = urlsplit(current).hostname or ""
    try:
        with pool.stream("GET", current, headers={"Host": _host_header(current), "User-Agent": "trainjobs-staging"},
                         extensions={"timeout": timeouts}) as response:
            if response.status in _REDIRECTS:
                location = _header(response, b"location")
                if not location:
                    raise DatasetError(f"downloading {url} failed: HTTP {response.status} without a Location")
                return location
            if response.status >= 400:
                raise DatasetError(f"downloading {url} failed: HTTP {response.status}")
            declared = _header(response, b"content-length")
            if declared and declared.isdigit():
                budget.check_bytes(int(declared), url)
            _save(response, target, url, budget, deadline)
            return None
    except _Refused as exc:
        raise DatasetError(f"downloading {url} failed: {exc.host} is not a public address; only public hosts are fetched") from None
    except httpcore.TimeoutException:
        raise DatasetError(f"downloading {url} failed: {host} did not answer in time") from None
    except (httpcore.ConnectError, httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
        raise DatasetError(f"downloading {url} failed: {type(exc).__name__} talking to {host}") from None


def _save(response: httpcore.Response, target: Path, url: str, budget: StagingBudget, deadline: float) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with target.open("wb") as out:
        for chunk in response.iter_stream():
            budget.check_stop()
            written += len(chunk)
            budget.check_bytes(written, url)
            if time.monotonic() > deadline:
                raise DatasetError(f"downloading {url} failed: it took longer than {budget.limits.fetch_timeout_s:.0f} s")
            out.write(chunk)


def _host_header(url: str) -> str:
    return urlsplit(url).netloc.rpartition("@")[2]  # never forward credentials written into the URL


def _header(response: httpcore.Response, name: bytes) -> str:
    for key, value in response.headers:
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return ""
