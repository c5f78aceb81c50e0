"""Worker and ps servers under an unauthenticated flood, malformed input, and cancelled calls.

The flood is reduced to what CI can hold: the worker process runs under a lowered file
limit (256 descriptors, soft and hard), so ~4x that many idle connections are a flood for
it. ``benches/flood.py`` measures the full-size one (20,000 connections).
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jaxcluster import wire
from jaxcluster._native import core
from jaxcluster.coordinator import functions
from jaxcluster.errors import (
    DeadlineExceededError,
    NotFoundError,
    ResourceExhaustedError,
)
from support.closures import TESTS_DIR, wait_for_file
from support.workers import running_worker, wait_until

TOKEN = "hardening-token"
FILE_LIMIT = 256


def _file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def _idle_connections(address: str, count: int) -> Iterator[list[socket.socket]]:
    """``count`` TCP connections to ``address`` that send nothing."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, max(soft, count + 512))
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    host, port = address.rsplit(":", 1)
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.setblocking(False)
            sockets.append(s)
        yield sockets
    finally:
        for s in sockets:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _closed_by_peer(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (reading past what it sent first, e.g. its HTTP/2
    SETTINGS frame)."""
    try:
        while s.recv(4096):
            pass
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True
    return True


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_flood_of_idle_connections_does_not_lock_out_a_client_with_the_token() -> None:
    args = ["--handshake-timeout", "60"]  # only the connection bound closes them here
    with running_worker(args, token=TOKEN, preexec_fn=_file_limit) as worker:
        client = worker.client()
        assert client.get_status()["connections_dropped"] == 0
        flood = 4 * FILE_LIMIT
        with _idle_connections(worker.address, flood) as sockets:
            before = _cpu_seconds(worker.popen.pid)
            # A new client with the token is answered although the flood fills the server.
            status = worker.client().get_status(timeout=10.0)
            assert status["state"] == "serving"
            assert status["connections_open"] < FILE_LIMIT, status
            # The oldest idle connections were closed to make room for newer ones.
            assert status["connections_dropped"] >= flood - FILE_LIMIT, status
            wait_until(lambda: _closed_by_peer(sockets[0]), what="the oldest to be closed")
            # Held open for a second: the server does not spin (a failing accept loop
            # costs a whole core).
            threading.Event().wait(1.0)
            used = _cpu_seconds(worker.popen.pid) - before
            assert used < 0.9, f"the worker used {used:.2f} s of CPU in ~1 s of flood"
            assert worker.client().get_status(timeout=10.0)["state"] == "serving"
        assert client.get_status()["state"] == "serving"


def test_a_connection_that_never_authenticates_is_closed_after_the_handshake_timeout() -> None:
    with running_worker(["--handshake-timeout", "1"], token=TOKEN) as worker:
        client = worker.client()
        client.get_status()
        start = time.monotonic()
        with _idle_connections(worker.address, 20) as sockets:
            wait_until(
                lambda: all(_closed_by_peer(s) for s in sockets),
                timeout=30.0,
                what="idle connections to be closed",
            )
            elapsed = time.monotonic() - start
        assert elapsed >= 0.9, f"closed after {elapsed:.2f} s, before the handshake timeout"
        # A slow client that sends half of the HTTP/2 preface is closed the same way.
        host, port = worker.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as slow:
            slow.sendall(b"PRI * HTTP/2.0\r\n")
            slow.setblocking(False)
            wait_until(lambda: _closed_by_peer(slow), timeout=30.0, what="the slow client closed")
        # The client with the token is still served on its connection, well past 1 s.
        status = client.get_status()
        assert status["connections_dropped"] >= 21, status


def test_limits_are_checked_at_start() -> None:
    with pytest.raises(ValueError, match="max_connections=0"):
        core.WorkerServer("127.0.0.1:0", auth_token=TOKEN, max_connections=0)
    with pytest.raises(ValueError, match="handshake_timeout"):
        core.PsServer("127.0.0.1:0", auth_token=TOKEN, handshake_timeout=0.0)


# --- malformed protobuf, size errors, cancelled calls ---------------------------------------

grpc = pytest.importorskip("grpc")


def _raw_call(address: str, method: str, body: bytes) -> Any:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as info:
            call(body, metadata=[("authorization", f"Bearer {TOKEN}")], timeout=30)
    return info.value


# A field 1 of wire type 7, which does not exist: no protobuf message parses it.
GARBAGE = b"\x0f\xff\xff\xff"


def test_a_malformed_request_is_invalid_argument_on_the_worker() -> None:
    with running_worker([], token=TOKEN) as worker:
        error = _raw_call(worker.address, "/jaxcluster.v1.Worker/RunClosure", GARBAGE)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert "not a valid protobuf message" in error.details()
        assert worker.client().get_status()["state"] == "serving"


def test_the_ps_says_ps_in_its_errors() -> None:
    server = core.PsServer("127.0.0.1:0", auth_token=TOKEN, max_message_bytes=64 * 1024)
    try:
        error = _raw_call(server.address, "/jaxcluster.v1.ParameterServer/Read", GARBAGE)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        client = core.PsClient(server.address, auth_token=TOKEN)
        with pytest.raises(ResourceExhaustedError) as info:
            client.create_variable("big", np.zeros(64 * 1024, np.float32))
        message = str(info.value)
        assert "ps" in message and "worker" not in message, message
    finally:
        server.shutdown()


def wait_for_gate(gate: str) -> int:
    """Runs on the worker: holds the executor until ``gate`` exists."""
    if not wait_for_file(gate):
        raise TimeoutError(gate)
    return 1


def mark(path: str) -> int:
    """Runs on the worker: leaves ``path``."""
    Path(path).touch()
    return 2


def _register(client: Any, fn: Any) -> bytes:
    payload = functions.pickle_function(fn)
    client.register_function(payload.function_hash, payload.kind, payload.payload)
    return payload.function_hash


def test_a_cancelled_unary_closure_is_not_run(tmp_path: Path) -> None:
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
    with running_worker([], token=TOKEN, env=env) as worker:
        client = worker.client()
        gate, marker = tmp_path / "gate", tmp_path / "ran"
        blocked = wire.encode(((str(gate),), {}))
        hold = threading.Thread(
            target=client.run_closure,
            args=(_register(client, wait_for_gate), blocked.pickle, blocked.buffers),
            daemon=True,
        )
        hold.start()
        wait_until(lambda: client.get_status()["inflight"] == 1, what="the gated closure")
        queued = wire.encode(((str(marker),), {}))
        # The worker gives up at the deadline it was sent, withdrawing the queued closure
        # before it answers (CANCELLED, which the client reads as the deadline it set); the
        # client waits a little past it for that answer, so the closure never starts.
        with pytest.raises(DeadlineExceededError):
            client.run_closure(_register(client, mark), queued.pickle, queued.buffers, timeout=0.5)
        # Had the client's clock run out first, the worker learns of it a moment later; the
        # closure leaves the queue then (a queued job nobody waits for is not counted).
        wait_until(lambda: client.get_status()["queued"] == 0, what="the closure withdrawn")
        gate.touch()
        hold.join(timeout=60)
        wait_until(
            lambda: client.get_status()["inflight"] + client.get_status()["queued"] == 0,
            what="the worker to be idle",
        )
        status = client.get_status()
        assert not marker.exists(), "the cancelled closure ran"
        assert status["closures_run"] == 1, status


def test_the_function_store_is_capped_and_an_evicted_function_can_be_registered_again() -> None:
    budget = 300_000
    with running_worker(["--max-function-bytes", str(budget)], token=TOKEN) as worker:
        client = worker.client()
        hashes = []
        for i in range(10):
            blob = bytes([i]) * 100_000

            def size(blob: bytes = blob) -> int:
                return len(blob)

            hashes.append(_register(client, size))
        status = client.get_status()
        assert status["functions_registered"] <= budget // 100_000, status
        args = wire.encode(((), {}))
        with pytest.raises(NotFoundError):
            client.run_closure(hashes[0], args.pickle, args.buffers)
        # Registered again (what a coordinator does on NOT_FOUND), it runs.
        payload = functions.pickle_function(lambda blob=bytes([0]) * 100_000: len(blob))
        client.register_function(payload.function_hash, payload.kind, payload.payload)
        reply = client.run_closure(payload.function_hash, args.pickle, args.buffers)
        assert wire.decode(reply["value"], reply["buffers"]) == 100_000
