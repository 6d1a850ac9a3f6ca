"""The one loopback rule: mmchaos sends traffic only to this machine unless the user allows more.

Every place that opens a connection on the user's behalf (the load driver, the serving budget,
the ``openai:`` target, the fault proxy's listen/upstream/control addresses) asks these functions,
so there is one definition of "loopback" (IPv4-mapped IPv6 unwrapped, scope ids dropped) and one
error code, :data:`REMOTE_REFUSED`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable, Iterable
from typing import Any

from mmchaos.errors import ConfigError

__all__ = [
    "CLIENT_KEEPALIVE_EXPIRY",
    "REMOTE_REFUSED",
    "is_loopback_address",
    "is_loopback_host",
    "literal_ip",
    "non_loopback",
    "require_loopback",
    "require_loopback_async",
    "resolve",
    "resolve_async",
]

REMOTE_REFUSED = "remote_not_allowed"

#: Seconds mmchaos's HTTP clients keep an idle connection in their pools: below the keep-alive
#: timeout of the servers they meet (uvicorn's default, so vLLM, SGLang and transformers serve, and
#: Node's: 5 s). With httpx's own 5 s, a connection taken from the pool as the server closes it
#: fails the request (``ReadError``, "Server disconnected") though the server never saw it
#: (benchmarks/keepalive_race.py).
CLIENT_KEEPALIVE_EXPIRY = 3.0
"""The error code of every refusal to reach a host that is not loopback."""

Resolver = Callable[..., list[tuple[Any, ...]]]


def _ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    ip = ipaddress.ip_address(address.strip("[]").split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def literal_ip(host: str) -> bool:
    """Whether ``host`` is an IP address literal (brackets and a scope id allowed)."""
    try:
        _ip(host)
    except ValueError:
        return False
    return True


def is_loopback_address(address: str) -> bool:
    """Whether an IP address literal is loopback (``::ffff:127.0.0.1`` included)."""
    try:
        return _ip(address).is_loopback
    except ValueError:
        return False


def non_loopback(addresses: Iterable[str]) -> list[str]:
    """The addresses of ``addresses`` that are not loopback, sorted."""
    return sorted({a for a in addresses if not is_loopback_address(a)})


def resolve(host: str, port: int = 0, resolver: Resolver = socket.getaddrinfo) -> list[str]:
    """Every address ``host`` names (itself when it is a literal); raises OSError when unresolvable."""
    if literal_ip(host):
        return [host.strip("[]").split("%", 1)[0]]
    infos = resolver(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]).split("%", 1)[0] for info in infos})


async def resolve_async(host: str, port: int = 0) -> list[str]:
    """:func:`resolve` without blocking the event loop."""
    if literal_ip(host):
        return [host.strip("[]").split("%", 1)[0]]
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]).split("%", 1)[0] for info in infos})


def is_loopback_host(host: str, resolver: Resolver = socket.getaddrinfo) -> bool:
    """Whether ``host`` is, or resolves only to, loopback addresses (unresolvable: False)."""
    try:
        addresses = resolve(host, 0, resolver)
    except OSError:
        return False
    return bool(addresses) and not non_loopback(addresses)


def _refusal(what: str, host: str, why: str) -> ConfigError:
    return ConfigError(
        f"{what} {host!r} {why}; mmchaos stays on this machine unless you pass --allow-remote (allow_remote=True)",
        code=REMOTE_REFUSED,
    )


def _why(exc: Exception) -> str:
    return str(getattr(exc, "strerror", None) or exc).splitlines()[0][:200]


def _check(what: str, host: str, addresses: list[str]) -> None:
    remote = non_loopback(addresses)
    if remote or not addresses:
        raise _refusal(what, host, f"is not a loopback address ({', '.join(remote) or 'no address'})")


def require_loopback(host: str, *, what: str = "address", resolver: Resolver = socket.getaddrinfo) -> None:
    """Raise a ConfigError (code :data:`REMOTE_REFUSED`) unless ``host`` is, or resolves only to, loopback.

    ``what`` names the address in the message (``upstream``, ``--listen``). The wildcard
    addresses (``0.0.0.0``, ``::``) are not loopback: listening on them opens the port to the network.
    """
    try:
        addresses = resolve(host, 0, resolver)
    except (OSError, ValueError) as exc:  # ValueError: a NUL, a label over 63 characters (IDNA)
        raise _refusal(what, host, f"cannot be resolved ({_why(exc)})") from None
    _check(what, host, addresses)


async def require_loopback_async(host: str, *, what: str = "address") -> None:
    """:func:`require_loopback` without blocking the event loop."""
    try:
        addresses = await resolve_async(host, 0)
    except (OSError, ValueError) as exc:  # ValueError: a NUL, a label over 63 characters (IDNA)
        raise _refusal(what, host, f"cannot be resolved ({_why(exc)})") from None
    _check(what, host, addresses)
