"""A coordinator's session: its id, and ending it on the workers when it shuts down.

Every ``ClusterCoordinator`` is a session (SPEC §12): a random id sent with every call it
makes (the ``jaxcluster-session`` metadata), under which workers keep what it creates.
A coordinator made from a strategy shares the strategy's ``session_id``, so one program is
one session. ``shutdown()`` ends the session on every worker, which releases what it held
at once; a coordinator that vanished (killed, its host gone) is released by each worker
``--state-ttl`` seconds after its last connection closed.

Example::

    session = new_session_id(None)        # 32 random hex digits
    end_session(["127.0.0.1:8470"], session, auth_token=None, tls_ca=None)
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Iterable
from typing import Any

__all__ = ["END_SESSION_TIMEOUT_SECONDS", "end_session", "new_session_id", "shut_down"]

_log = logging.getLogger("jaxcluster.coordinator")

#: How long shutdown waits for each worker to acknowledge the end of the session.
END_SESSION_TIMEOUT_SECONDS = 2.0


def new_session_id(strategy: Any) -> str:
    """The strategy's ``session_id`` when it has one (one program, one session), else 32
    random hex digits."""
    shared = getattr(strategy, "session_id", None)
    if isinstance(shared, str) and shared:
        return shared
    return secrets.token_hex(16)


def end_session(
    addresses: Iterable[str],
    session: str,
    *,
    auth_token: str | None,
    tls_ca: bytes | None,
    timeout: float = END_SESSION_TIMEOUT_SECONDS,
) -> None:
    """Ends ``session`` on every worker at ``addresses``, all at once, each bounded by
    ``timeout``; failures are logged (a worker that is gone releases the session after its
    ``--state-ttl``; one that predates sessions has nothing to release), never raised."""
    from jaxcluster._native import core

    def end(address: str) -> None:
        try:
            client = core.WorkerClient(
                address,
                auth_token,
                timeout,
                connect_timeout=timeout,
                tls_ca=tls_ca,
                session=session,
            )
            client.end_session(timeout=timeout)
        except Exception as exc:  # logged; shutdown goes on
            _log.debug("could not end session %s on %s: %s", session, address, exc)

    threads = [
        threading.Thread(target=end, args=(a,), name="jaxcluster-end-session", daemon=True)
        for a in dict.fromkeys(addresses)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 1.0)


def shut_down(dispatcher: Any, session: str, auth_token: str | None, tls_ca: bytes | None) -> None:
    """Stops ``dispatcher`` (its queued closures are cancelled), then ends ``session`` on
    each worker that was up (:func:`end_session`), so what the session holds there is
    released now rather than after ``--state-ttl``; a worker that is down releases it after
    its ``--state-ttl`` instead."""
    from jaxcluster._native import core

    up = [w.address for w in dispatcher.worker_statuses() if w.state == core.WorkerState.UP]
    dispatcher.shutdown()
    end_session(up, session, auth_token=auth_token, tls_ca=tls_ca)
