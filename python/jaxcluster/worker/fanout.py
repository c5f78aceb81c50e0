"""Rank 0 of a slice forwards every job it receives to the slice's other hosts.

The coordinator sends a closure to a slice's rank-0 host only; :class:`Fanout` sends the
same function (registered once per peer) and the same argument bytes to every peer, one
thread per peer, while rank 0 runs the closure itself, so all hosts enter the SPMD program
together. Peers answer when their part is done; rank 0 answers the coordinator once all
have, with its own value or the first error any host raised.

A peer that cannot be reached, or that fails without a closure error (its process died,
its connection broke), breaks the slice: the forwarding thread ends this process at once
(:func:`jaxcluster.worker.slice.broken`) rather than wait for rank 0's own part, which may
be blocked forever in a collective with the lost peer.

Example::

    fanout = Fanout(peers, auth_token="s3cret", slice_index=0, heartbeat_timeout=10.0)
    pending = fanout.send(job)       # before running the job locally
    error = fanout.wait(pending)     # after: the first peer's ClosureError, or None
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from functools import partial
from typing import Any

from jaxcluster import errors
from jaxcluster._native import core
from jaxcluster.worker.slice import SliceHost, broken

__all__ = ["Fanout", "PeerError"]

_log = logging.getLogger("jaxcluster.worker.slice")


class PeerError:
    """A closure error a peer reported, with the host it came from."""

    def __init__(self, host: SliceHost, error: Any) -> None:
        self.host = host
        self.error = error

    def reply_kwargs(self) -> dict[str, Any]:
        """Arguments for ``WorkerJob.reply_error`` passing the peer's error on."""
        e = self.error
        passed_on = (core.ErrorKind.USER, core.ErrorKind.INPUT, core.ErrorKind.FUNCTION_LOAD)
        kind = e.kind if e.kind in passed_on else core.ErrorKind.INFRASTRUCTURE
        return {
            "kind": kind,
            "type_name": e["type_name"],
            "module": e["module"],
            "message": f"{e['message']} (on slice host rank {self.host.rank}, {self.host.address})",
            # The coordinator names rank 0 as the worker; the traceback says which host.
            "traceback": f"on slice host rank {self.host.rank} at {self.host.address}:\n"
            f"{e['traceback']}",
            "exception": e["exception"],
            "exception_buffers": list(e["exception_buffers"]),
            "resource_id": e["resource_id"],
        }


@dataclass(frozen=True)
class _Call:
    """What rank 0 forwards of one job."""

    session: str
    function: tuple[Any, Any, Any]
    args: bytes | None
    buffers: list[bytes]
    closure_id: int
    resource_id: int | None
    name: str
    #: The coordinator's index for the slice (it changes as slices leave and join): every
    #: host's get_current_worker_index() says the same.
    index: int | None
    #: Rank 0 is being preempted: the job is a preemption save (or the closure running
    #: when the notice came), which a peer that is draining for its own notice still runs.
    save: bool = False


class _Peer:
    """One peer host, with a client per session: a forwarded job runs in the session of
    the call that brought it (its values are that session's on the peer too)."""

    def __init__(self, host: SliceHost, connect: Callable[[str], Any]) -> None:
        self.host = host
        self._connect = connect
        self._clients: dict[str, Any] = {}
        self.registered: set[bytes] = set()
        self.lock = threading.Lock()
        # Its own lock: registering (under ``lock``) asks for a client.
        self._clients_lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The anonymous session's client (functions are shared by every session)."""
        return self.client_for("")

    def client_for(self, session: str) -> Any:
        with self._clients_lock:
            client = self._clients.get(session)
            if client is None:
                client = self._clients[session] = self._connect(session)
            return client

    def end(self, session: str) -> None:
        """Ends ``session`` on the peer and forgets its client."""
        client = self.client_for(session)
        try:
            client.end_session()
        finally:
            with self._clients_lock:
                self._clients.pop(session, None)


class Fanout:
    """Forwards jobs from a slice's rank 0 to its ``peers`` (every other host)."""

    def __init__(
        self,
        peers: Sequence[SliceHost],
        auth_token: str | None,
        *,
        slice_index: int,
        heartbeat_timeout: float,
        on_broken: Callable[[str], None] | None = None,
        tls_ca: bytes | None = None,
    ) -> None:
        from jaxcluster._native import core

        def connector(address: str) -> Callable[[str], Any]:
            return lambda session: core.WorkerClient(
                address, auth_token, heartbeat_timeout, tls_ca=tls_ca, session=session or None
            )

        self._peers = [_Peer(h, connector(h.address)) for h in peers]
        self._index = slice_index
        self._timeout = heartbeat_timeout
        self._on_broken = on_broken or broken
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, len(self._peers)), thread_name_prefix="jaxcluster-fanout"
        )

    def send(self, job: Any, *, preemption_save: bool = False) -> list[Future[Any]]:
        """Starts ``job`` (a ``WorkerJob``) on every peer; returns what :meth:`wait` takes.
        ``preemption_save``: rank 0 has a notice, so a closure is a preemption save."""
        kind = job.kind
        session = job.session
        if kind == "release_resource":
            ids = list(job.resource_ids)
            return [
                self._pool.submit(self._guard, p, partial(self._release, p, session, ids))
                for p in self._peers
            ]
        if kind == "release_session":
            return [self._pool.submit(self._guard, p, partial(p.end, session)) for p in self._peers]
        # The job's bytes are read here, on the executor's thread, once for all peers.
        function = (job.function_hash, job.function_kind, job.function_payload)
        args = None if job.args is None else bytes(job.args)
        buffers = [bytes(b) for b in job.buffers]
        resource_id = job.resource_id if kind == "create_resource" else None
        name = job.name if kind == "create_resource" else ""
        closure_id = job.closure_id or 0
        call = _Call(
            session,
            function,
            args,
            buffers,
            closure_id,
            resource_id,
            name,
            job.worker_index,
            preemption_save,
        )
        return [
            self._pool.submit(self._guard, p, partial(self._call, p, call)) for p in self._peers
        ]

    def wait(
        self, pending: Sequence[Future[Any]], *, local_failed: bool = False
    ) -> PeerError | None:
        """Waits for every peer's part; returns the first peer's closure error, if any.

        When rank 0's own part failed, the peers may be blocked in a collective rank 0 never
        reached: they get ``heartbeat_timeout`` seconds to finish, then the slice is broken.
        """
        first: PeerError | None = None
        for future in pending:
            try:
                outcome = future.result(timeout=self._timeout if local_failed else None)
            except FutureTimeout:
                self._on_broken(
                    f"slice {self._index}: rank 0's part of a closure failed and a peer was "
                    f"still running it {self._timeout:g} s later (its collectives cannot "
                    "complete)"
                )
                return first
            if first is None and isinstance(outcome, PeerError):
                first = outcome
        return first

    def _guard(self, peer: _Peer, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except errors.JaxClusterError as exc:
            self._on_broken(
                f"slice {self._index}: forwarding to rank {peer.host.rank} at "
                f"{peer.host.address} failed ({type(exc).__name__}: {exc})"
            )
            raise

    def _register(self, peer: _Peer, function: tuple[Any, Any, Any], force: bool) -> None:
        function_hash, kind, payload = function
        with peer.lock:
            if function_hash in peer.registered and not force:
                return
            if payload is None:
                raise errors.InternalError("the job carries no function payload to forward")
            peer.client.register_function(function_hash, kind, payload)
            peer.registered.add(function_hash)

    def _call(self, peer: _Peer, call: _Call) -> PeerError | None:
        function = call.function
        client = peer.client_for(call.session)
        for attempt in range(2):
            self._register(peer, function, force=attempt > 0)
            try:
                if call.resource_id is None:
                    answer = client.run_closure(
                        function[0],
                        call.args,
                        call.buffers,
                        closure_id=call.closure_id,
                        worker_index=call.index,
                        preemption_save=call.save,
                    )
                else:
                    answer = client.create_resource(
                        call.resource_id,
                        function[0],
                        call.args,
                        call.buffers,
                        name=call.name,
                        worker_index=call.index,
                    )
            except errors.NotFoundError:
                if attempt:  # registered again just now and still unknown
                    raise
                continue  # the peer evicted the function: register it again
            error = answer["error"]
            return None if error is None else PeerError(peer.host, error)
        return None  # pragma: no cover - the loop returns or raises

    def _release(self, peer: _Peer, session: str, ids: list[int]) -> None:
        peer.client_for(session).release_resource(ids)
