"""Host names as an HTTP server of the project's checks them: the name a
``Host`` header gives, whether an address is loopback, and the loopback
names.  A server on loopback that answers any ``Host`` answers a web page
that rebinds its own name to 127.0.0.1 (DNS rebinding): the web UI and the
metrics endpoints answer only the names they are reached by."""

from __future__ import annotations

import ipaddress

__all__ = ["LOOPBACK_HOSTS", "host_name", "is_loopback"]

# the names a Host header may give a server on loopback, with any port
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def host_name(host: str) -> str:
    """The host name of a ``Host`` header, lower-cased, without its port or an
    IPv6 address's brackets: ``[::1]:8050`` is ``::1``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves loopback only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: whatever it resolves to, not known to be loopback
        return False
