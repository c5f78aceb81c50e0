"""A strategy's session on its ps tasks: its id, its end, and re-attaching live variables.

Every ``ParameterServerStrategy`` is a session with a random id that each of its ps calls
carries (from the coordinator and, through pickled variables, from workers), so the ps
keeps each strategy's variables apart. The session ends, releasing its variables on every
ps task at once, when the strategy shuts down (``strategy.shutdown()``) or when the process
that made it exits normally; a process killed outright leaves its variables to the ps's
``--state-ttl``.

Example::

    session = new_session_id()                      # 32 hex digits
    register(session, ["127.0.0.1:2222"], token, None)
    end(session, ["127.0.0.1:2222"], token, None)   # releases its variables there
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from jaxcluster.strategy import _clients

if TYPE_CHECKING:
    from jaxcluster.strategy.variables import ParameterServerVariable

__all__ = ["END_TIMEOUT", "end", "new_session_id", "reattach", "register", "unregister"]

#: Seconds each ps task is given to end a session; a ps that does not answer keeps the
#: variables until its ``--state-ttl``.
END_TIMEOUT = 5.0

_log = logging.getLogger("jaxcluster.strategy")
_lock = threading.Lock()
# session id -> (pid that made it, ps addresses, token, CA), ended at interpreter exit.
_open: dict[str, tuple[int, tuple[str, ...], str | None, bytes | None]] = {}


def new_session_id() -> str:
    """A new session id: 32 random hex digits."""
    return secrets.token_hex(16)


def register(
    session: str, addresses: Sequence[str], token: str | None, tls_ca: bytes | None
) -> None:
    """Ends ``session`` on ``addresses`` when this process exits normally (a forked child
    that exits leaves it alone)."""
    with _lock:
        _open[session] = (os.getpid(), tuple(addresses), token, tls_ca)


def unregister(session: str) -> bool:
    """Forgets ``session``; whether it was registered (not yet ended)."""
    with _lock:
        return _open.pop(session, None) is not None


def end(
    session: str,
    addresses: Sequence[str],
    token: str | None,
    tls_ca: bytes | None,
    timeout: float = END_TIMEOUT,
) -> int:
    """Ends ``session`` on every ps task in ``addresses``; returns the variables released.
    A ps that cannot be reached is logged, not raised: its ``--state-ttl`` releases them."""
    released = 0
    for address in addresses:
        try:
            client = _clients.client_for(address, token, tls_ca, session)
            released += int(client.end_session(timeout=timeout))
        except Exception as exc:
            _log.warning(
                "could not end session %s on ps %s (%s); its variables stay there until the "
                "ps's --state-ttl passes",
                session,
                address,
                exc,
            )
    return released


def reattach(variable: ParameterServerVariable) -> frozenset[str]:
    """Adopts, shard by shard, live ps variables with ``variable``'s keys, dtype and shard
    shapes into its session (see ``ReattachRequest`` in ps.proto). Returns the shard keys
    found, marks them (and the optimizer slots and step counts that came along) on
    ``variable``, and logs (INFO) what was re-attached. Shards not found are left for the
    caller to create; a shard of another dtype or shape raises ``FailedPreconditionError``
    naming both."""
    found: set[str] = set()
    slots: set[str] = set()
    dtype = variable.storage_dtype.name
    for shard in variable.shards:
        shape = list(variable.shape)
        if len(variable.shards) > 1:
            shape[0] = shard.stop - shard.start
        adopted = variable._call(shard, "reattach", shard.key, dtype, shape)
        if adopted is not None:
            found.add(shard.key)
            slots.update(adopted)
    variable._mark_reattached(frozenset(found), frozenset(slots))
    if found:
        missing = [s.key for s in variable.shards if s.key not in found]
        _log.info(
            "re-attached ps variable %r (%d of %d shards, %d optimizer slots and step counts)%s",
            variable.name,
            len(found),
            len(variable.shards),
            len(slots),
            f"; shards {missing} were not alive and start from initial_value" if missing else "",
        )
    return frozenset(found)


def _end_all_at_exit() -> None:
    with _lock:
        mine = [(s, v) for s, v in _open.items() if v[0] == os.getpid()]
        _open.clear()
    for session, (_, addresses, token, tls_ca) in mine:
        end(session, addresses, token, tls_ca)


atexit.register(_end_all_at_exit)
