"""Which addresses are the public internet's: the one rule for every place trainjobs decides whether to
let a fetch go somewhere (dataset URLs at submit and at each hop of staging's fetch, trainjobs/source_rules.py
and worker/staging/fetch.py; a program's requirement URLs, trainjobs/requirement_urls.py)."""

from __future__ import annotations

import ipaddress
import socket

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def is_public(address: IpAddress) -> bool:
    """An address on the public internet: not private, loopback, link-local, multicast, reserved or
    unspecified, also when an IPv6 address only wraps an IPv4 one (mapped, 6to4, NAT64)."""
    if isinstance(address, ipaddress.IPv6Address):
        wrapped = address.ipv4_mapped or address.sixtofour
        if address in ipaddress.IPv6Network("64:ff9b::/96"):
            wrapped = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if wrapped is not None:
            return is_public(wrapped)
    return address.is_global and not (address.is_private or address.is_loopback or address.is_link_local
                                       or address.is_multicast or address.is_reserved or address.is_unspecified)


def literal_address(host: str) -> IpAddress | None:
    """The address a host name spells literally, legacy IPv4 forms (2130706433, 0x7f.1) included."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def shown(url: str, limit: int = 120) -> str:
    """A source or URL as a refusal shows it: cut to `limit` characters (a request may send kilobytes)."""
    return url if len(url) <= limit else url[: limit - 3] + "..."
