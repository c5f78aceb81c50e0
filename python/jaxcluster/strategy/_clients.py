"""One ``PsClient`` per (ps address, token, CA, session) per process, shared by every
variable.

A worker may unpickle the same variables for many closures; all of them share one gRPC
connection per ps task and session (each strategy's calls carry its session id, so the ps
keeps each strategy's variables apart). The cache is keyed by process id too, so a forked
child (whose inherited connections are unusable) builds its own.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

__all__ = ["PS_CALL_TIMEOUT", "client_for", "default_tls_ca", "default_token"]

#: Seconds one variable operation may take before it fails with DeadlineExceededError.
PS_CALL_TIMEOUT = 60.0

_log = logging.getLogger("jaxcluster.strategy")
_lock = threading.Lock()
_clients: dict[tuple[int, str, str | None, bytes | None, str | None], Any] = {}


def default_token() -> str | None:
    """The token for variables unpickled in this process: the worker's own token when
    running on a worker, else ``JAXCLUSTER_AUTH_TOKEN``."""
    from jaxcluster.worker.context import get_worker_auth_token

    return get_worker_auth_token()


def default_tls_ca() -> bytes | None:
    """The CA for variables unpickled in this process: ``JAXCLUSTER_TLS_CA``, else ``None``
    (plaintext)."""
    from jaxcluster._tls import ca_from_env

    return ca_from_env()


def client_for(
    address: str, token: str | None, tls_ca: bytes | None = None, session: str | None = None
) -> Any:
    """The shared ``jaxcluster._core.PsClient`` for ``address`` with ``token`` (and over TLS
    verified against ``tls_ca`` when given), whose calls belong to ``session`` (a
    strategy's :attr:`~ParameterServerStrategy.session_id`; ``None``: the anonymous one)."""
    key = (os.getpid(), address, token, tls_ca, session)
    with _lock:
        client = _clients.get(key)
        if client is None:
            from jaxcluster._auth import warn_if_token_in_clear
            from jaxcluster._malloc import keep_freed_memory
            from jaxcluster._native import core

            keep_freed_memory()  # ps clients move large arrays too (see _malloc)
            warn_if_token_in_clear([address], token, tls_ca, _log, "ps task")
            client = core.PsClient(
                address, auth_token=token, timeout=PS_CALL_TIMEOUT, tls_ca=tls_ca, session=session
            )
            _clients[key] = client
        return client
