"""The SSRF guard of webhook URLs, one place for the API (at create) and the worker (at each
delivery, against the addresses the name resolves to *then*: DNS rebinding gains nothing,
the worker connects to the address it checked).

A URL is refused unless it is https (http only where WEBHOOKS_ALLOW_HTTP, by default with the
embedded worker only) and every address its host resolves to is public, or inside
WEBHOOKS_ALLOWED_CIDRS, or WEBHOOKS_ALLOW_PRIVATE is set.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
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


_V6 = ipaddress.IPv6Network
# IPv6 forms that carry an IPv4 address a translator or tunnel delivers to: the IPv4 inside
# is what gets checked (DNS64 synthesises 64:ff9b::a.b.c.d for every IPv4-only receiver).
_NAT64_WKP = _V6("64:ff9b::/96")  # RFC 6052 well-known prefix, the IPv4 in the last 32 bits
_SIXTOFOUR = _V6("2002::/16")  # RFC 3056, the 6to4 router's IPv4 in bits 16-48
# Refused outright, whatever they embed: ::/8 holds IPv4-compatible ::a.b.c.d, SIIT
# ::ffff:0:a.b.c.d, the local-use NAT64 prefix 64:ff9b:1::/48 (RFC 8215: the IPv4's place
# depends on the operator's prefix length) and nothing global; Teredo; site-local fec0::/10.
_REFUSED_V6 = (_V6("::/8"), _V6("2001::/32"), _V6("fec0::/10"))


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a translator or tunnel would reach for `ip` (mapped, NAT64, 6to4)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64_WKP:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour  # None outside 2002::/16


def _public(ip: IPAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address):
        inner = embedded_ipv4(ip)
        if inner is not None:
            return _public(inner)
        if any(ip in net for net in _REFUSED_V6):
            return False
    return ip.is_global and not ip.is_multicast


def allowed_address(ip: IPAddress, settings: Settings) -> bool:
    if settings.WEBHOOKS_ALLOW_PRIVATE or _public(ip):
        return True
    # ::ffff:a.b.c.d is a.b.c.d on a dual-stack socket; a translator's or tunnel's address is
    # allowed only as itself (an IPv6 CIDR), never through the IPv4 it embeds.
    inner = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return any(
        addr in net
        for addr in (ip, inner)
        if addr is not None
        for net in settings.webhooks_allowed_cidrs
        if addr.version == net.version
    )


def split_url(url: str, settings: Settings) -> tuple[str, str, int, list[str] | None]:
    """(scheme, host, port, [the host] when it is an IP literal, else None), or UrlRefused:
    every check that needs no lookup."""
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
        return parts.scheme, host, port, [str(ipaddress.ip_address(host))]
    except ValueError:
        return parts.scheme, host, port, None


def vet(scheme: str, host: str, port: int, names: list[str], settings: Settings) -> Target:
    """The Target of `host` resolved to `names`, or UrlRefused if any is not allowed."""
    try:
        addresses = tuple(ipaddress.ip_address(name.split("%")[0]) for name in names)
    except ValueError:
        raise UrlRefused(f"host {host!r} does not resolve") from None
    if not addresses:
        raise UrlRefused(f"host {host!r} does not resolve")
    for ip in addresses:
        if not allowed_address(ip, settings):
            raise UrlRefused(
                f"host {host!r} resolves to {ip}, a loopback, link-local, private or otherwise "
                "non-public address; the operator may allow it (WEBHOOKS_ALLOWED_CIDRS, "
                "WEBHOOKS_ALLOW_PRIVATE)"
            )
    return Target(scheme, host, port, addresses)


def check_url(url: str, settings: Settings, *, resolver: Resolver = resolve) -> Target:
    """The vetted target of `url`, or UrlRefused (the lookup by `resolver`, in this thread)."""
    scheme, host, port, names = split_url(url, settings)
    if names is None:
        try:
            names = resolver(host, port)
        except (OSError, UnicodeError, ValueError):
            raise UrlRefused(f"host {host!r} does not resolve") from None
    return vet(scheme, host, port, names, settings)


# --- lookups with a deadline ---------------------------------------------------------------------
#
# getaddrinfo cannot be interrupted: a slow name server holds the thread that asked. The lookups
# of webhook hosts run in a pool of their own, and the asker waits at most `timeout` seconds
# for the answer; a lookup past it leaves its thread to finish alone, never the API's request
# threads or the event loop. An owner (a team) may have MAX_LOOKUPS_PER_OWNER lookups running,
# abandoned ones included, so no team's slow name server can take the pool from the others.

LOOKUP_THREADS = 32
MAX_LOOKUPS_PER_OWNER = 4
_LOOKUPS = ThreadPoolExecutor(max_workers=LOOKUP_THREADS, thread_name_prefix="webhook-dns")
_running: dict[str, int] = {}
_running_lock = threading.Lock()


class LookupsBusy(UrlRefused):
    """The owner's earlier lookups (a slow name server) are still running: retry later."""


def _too_slow(host: str, timeout: float) -> UrlRefused:
    return UrlRefused(f"host {host!r} did not resolve within {timeout:g}s")


def _finished(owner: str) -> None:
    with _running_lock:
        left = _running.get(owner, 1) - 1
        if left > 0:
            _running[owner] = left
        else:
            _running.pop(owner, None)


def _submit(resolver: Resolver, host: str, port: int, owner: str | None) -> Future[list[str]]:
    if owner is not None:
        with _running_lock:
            if _running.get(owner, 0) >= MAX_LOOKUPS_PER_OWNER:
                raise LookupsBusy(
                    f"host {host!r} not looked up: {MAX_LOOKUPS_PER_OWNER} earlier lookups of "
                    "this team's webhook hosts are still waiting for their name servers; "
                    "retry later"
                )
            _running[owner] = _running.get(owner, 0) + 1
    future = _LOOKUPS.submit(resolver, host, port)
    if owner is not None:
        future.add_done_callback(lambda _: _finished(owner))
    return future


def bounded(resolver: Resolver, timeout: float, owner: str | None = None) -> Resolver:
    """`resolver`, answering within `timeout` seconds or raising UrlRefused (LookupsBusy when
    `owner` has MAX_LOOKUPS_PER_OWNER lookups running)."""

    def lookup(host: str, port: int) -> list[str]:
        future = _submit(resolver, host, port, owner)
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise _too_slow(host, timeout) from None

    return lookup


async def check_url_async(
    url: str, settings: Settings, *, owner: str | None = None, resolver: Resolver | None = None
) -> Target:
    """check_url for the event loop: the lookup in the pool above, awaited at most
    WEBHOOK_DNS_TIMEOUT_SECONDS (`resolver`: this module's `resolve`, read at each call)."""
    scheme, host, port, names = split_url(url, settings)
    if names is None:
        timeout = settings.WEBHOOK_DNS_TIMEOUT_SECONDS
        future = _submit(resolver or resolve, host, port, owner)
        try:
            names = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except TimeoutError:
            raise _too_slow(host, timeout) from None
        except (OSError, UnicodeError, ValueError):
            raise UrlRefused(f"host {host!r} does not resolve") from None
    return vet(scheme, host, port, names, settings)
