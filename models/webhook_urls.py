"""The SSRF guard of webhook URLs, one place for the API (at create) and the worker (at each
delivery, against the addresses the name resolves to *then*: DNS rebinding gains nothing,
the worker connects to the address it checked).

A URL is refused unless it is https (http only where WEBHOOKS_ALLOW_HTTP, by default with the
embedded worker only) and every address its host resolves to is public, or inside
WEBHOOKS_ALLOWED_CIDRS, or WEBHOOKS_ALLOW_PRIVATE is set.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from models.settings import Settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]


class UrlRefused(ValueError):
    """The URL may not receive webhooks; the message says why (shown to the user)."""


@dataclass(frozen=True)
class Target:
    """A vetted URL: its parts, and the checked addresses to connect to."""

    scheme: str
    host: str
    port: int
    addresses: tuple[IPAddress, ...]


def resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _public(ip: IPAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def allowed_address(ip: IPAddress, settings: Settings) -> bool:
    if settings.WEBHOOKS_ALLOW_PRIVATE or _public(ip):
        return True
    return any(ip in net for net in settings.webhooks_allowed_cidrs if ip.version == net.version)


def check_url(url: str, settings: Settings, *, resolver: Resolver = resolve) -> Target:
    """The vetted target of `url`, or UrlRefused."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise UrlRefused(f"not a valid URL: {exc}") from None
    if parts.scheme not in ("https", "http"):
        raise UrlRefused("must be an https:// URL")
    if parts.scheme == "http" and not settings.webhooks_allow_http:
        raise UrlRefused("must be https:// (this server does not deliver webhooks over http)")
    if not parts.hostname:
        raise UrlRefused("has no host")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("must not carry credentials (user:password@)")
    host = parts.hostname
    try:
        literal = ipaddress.ip_address(host)
        names = [str(literal)]
    except ValueError:
        try:
            names = resolver(host, port)
        except (OSError, UnicodeError, ValueError):
            raise UrlRefused(f"host {host!r} does not resolve") from None
    addresses = tuple(ipaddress.ip_address(name.split("%")[0]) for name in names)
    if not addresses:
        raise UrlRefused(f"host {host!r} does not resolve")
    for ip in addresses:
        if not allowed_address(ip, settings):
            raise UrlRefused(
                f"host {host!r} resolves to {ip}, a loopback, link-local, private or otherwise "
                "non-public address; the operator may allow it (WEBHOOKS_ALLOWED_CIDRS, "
                "WEBHOOKS_ALLOW_PRIVATE)"
            )
    return Target(parts.scheme, host, port, addresses)
