"""The shared bearer token: one environment variable for workers, ps tasks and coordinators.

Example::

    token = auth_token_from_env()   # JAXCLUSTER_AUTH_TOKEN, stripped, or None when unset
    warn_if_token_in_clear(["n3:8888"], token, None, logging.getLogger("jaxcluster"), "workers")
    # logs a WARNING and warns ClearTextTokenWarning (n3 is not this machine)
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import warnings
from collections.abc import Iterable

__all__ = [
    "AUTH_TOKEN_ENV",
    "ClearTextTokenWarning",
    "auth_token_from_env",
    "warn_if_token_in_clear",
]


class ClearTextTokenWarning(RuntimeWarning):
    """The auth token is about to travel without TLS to an address off this machine.

    Raised as a warning (``warnings.warn``) as well as logged, so it shows even where
    logging is not configured. Silence it deliberately with
    ``warnings.filterwarnings("ignore", category=jaxcluster.ClearTextTokenWarning)``.
    """


#: Every RPC must carry ``authorization: Bearer <token>``; this variable holds the token.
AUTH_TOKEN_ENV = "JAXCLUSTER_AUTH_TOKEN"


def auth_token_from_env() -> str | None:
    """``JAXCLUSTER_AUTH_TOKEN`` without surrounding whitespace, or ``None`` when unset/empty."""
    return os.environ.get(AUTH_TOKEN_ENV, "").strip() or None


def _is_loopback(address: str) -> bool:
    """Whether every address ``host:port`` names is on this machine (a name is looked up;
    one that does not resolve counts as remote)."""
    host = address.split("://", 1)[-1]
    if host.startswith("["):
        host = host[1 : host.find("]")]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    ips = {str(info[4][0]) for info in infos}
    return bool(ips) and all(ipaddress.ip_address(ip.split("%", 1)[0]).is_loopback for ip in ips)


def warn_if_token_in_clear(
    addresses: Iterable[str],
    token: str | None,
    tls_ca: bytes | None,
    logger: logging.Logger,
    role: str,
    stacklevel: int = 1,
) -> list[str]:
    """Logs a WARNING on ``logger`` and warns :class:`ClearTextTokenWarning` when
    ``token`` will travel without TLS to any of ``addresses`` that is not loopback;
    returns those addresses. ``stacklevel`` says which caller the warning names, as for
    ``warnings.warn``: 1 is the line calling this function, 2 its caller (e.g. the user's
    line that made a coordinator)."""
    if token is None or tls_ca is not None:
        return []
    exposed = [address for address in addresses if not _is_loopback(address)]
    if exposed:
        shown = ", ".join(exposed[:8]) + (
            f" and {len(exposed) - 8} more" if len(exposed) > 8 else ""
        )
        message = (
            f"sending the auth token in clear text to {role} {shown} (not loopback): anyone "
            "who can read that traffic, or who holds one of those ports, gets the token and "
            "can run code on the cluster. Serve TLS (--tls-cert/--tls-key; `jaxcluster tls "
            "make-ca` and `jaxcluster tls issue` make the files) and pass tls_ca= or set "
            "JAXCLUSTER_TLS_CA"
        )
        logger.warning("%s", message)
        # Logging may not be configured (the package only adds a NullHandler): a warning
        # is shown once per calling line by Python's default filters.
        warnings.warn(message, ClearTextTokenWarning, stacklevel=stacklevel + 1)
    return exposed
