"""Kept results on workers, the worker side (dataflow, SPEC §12): ``keep_result_id`` keeps a
closure's result in the worker's registry and answers its ``KeptInfo``; a ``KeptRef``
argument resolves to the worker's own copy (no bytes move) or is pulled from its holder
with ``ReadValue`` (bytes counted on both workers); reads are per session, released like
any resource, served while the holder runs a closure or drains, and a pull from a dead
holder is an input error naming it.

Real ``jaxcluster worker`` processes on loopback, driven with the raw ``WorkerClient``.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

from jaxcluster import errors, wire
from jaxcluster._native import core
from jaxcluster.coordinator import functions
from jaxcluster.worker.kept import SMALL_LEAF_BYTES, kept_info
from support.workers import WorkerProc, launch, running_worker, wait_until

pytestmark = pytest.mark.timeout(300)

SESSION = "kept-values-test"

# The workers cannot import this module: its functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[WorkerProc, WorkerProc]]:
    with running_worker(["--index", "0"]) as a, running_worker(["--index", "1"]) as b:
        yield a, b


def _client(worker: WorkerProc, session: str = SESSION) -> Any:
    return worker.client(session=session, timeout=60.0)


def _register(client: Any, fn: Any) -> bytes:
    payload = functions.pickle_function(fn)
    client.register_function(payload.function_hash, payload.kind, payload.payload)
    return payload.function_hash


def _run(client: Any, fn: Any, *args: Any, keep: int | None = None) -> dict[str, Any]:
    encoded = wire.encode((args, {}))
    return client.run_closure(
        _register(client, fn), encoded.pickle, encoded.buffers, keep_result_id=keep
    )


def _value(reply: dict[str, Any]) -> Any:
    assert reply["error"] is None, reply["error"]
    return wire.decode(reply["value"], reply["buffers"])


def _make(n: int) -> dict[str, Any]:
    import numpy as np

    return {"x": np.arange(n, dtype=np.float32), "tag": "made"}


def _total(value: dict[str, Any]) -> float:
    return float(value["x"].sum(dtype="float64"))


def _peer(worker: WorkerProc) -> tuple[int, int, int, int]:
    s = _client(worker).get_status()
    return s.peer_bytes_sent, s.peer_bytes_received, s.peer_reads_served, s.peer_pulls


def _held_bytes(worker: WorkerProc, session: str = SESSION) -> int:
    held = [s for s in _client(worker).get_status().sessions if s.id == session]
    return held[0].bytes if held else 0


def test_a_kept_result_answers_its_spec_and_is_used_in_place_or_pulled_by_a_peer(
    pair: tuple[WorkerProc, WorkerProc],
) -> None:
    a, b = pair
    n = 250_000  # 1 MB of float32
    info = _value(_run(_client(a), _make, n, keep=101))
    assert isinstance(info, wire.KeptInfo)
    assert info.nbytes == 4 * n
    assert info.spec["tag"] == "made"
    assert tuple(info.spec["x"].shape) == (n,) and str(info.spec["x"].dtype) == "float32"
    assert _held_bytes(a) >= 4 * n

    expected = float(np.arange(n, dtype=np.float32).sum(dtype=np.float64))
    ref = wire.KeptRef(101, a.address)
    before_a, before_b = _peer(a), _peer(b)
    # On the holder: its own object, no bytes move.
    assert _value(_run(_client(a), _total, ref)) == expected
    assert _peer(a) == before_a
    # On another worker: pulled worker to worker; both count the same bytes.
    assert _value(_run(_client(b), _total, ref)) == expected
    sent = _peer(a)[0] - before_a[0]
    received = _peer(b)[1] - before_b[1]
    assert sent == received
    assert 4 * n <= sent < 4 * n + 4096  # the payload and a small pickle
    assert _peer(a)[2] == before_a[2] + 1 and _peer(b)[3] == before_b[3] + 1

    # The raw read gives the value itself.
    read = _client(a).read_value(101)
    value = wire.decode(read.pickle, read.buffers)
    np.testing.assert_array_equal(value["x"], np.arange(n, dtype=np.float32))


def test_a_ref_named_twice_is_resolved_once(pair: tuple[WorkerProc, WorkerProc]) -> None:
    a, b = pair
    _value(_run(_client(a), _make, 1000, keep=102))
    ref = wire.KeptRef(102, a.address)
    before = _peer(b)
    total = _value(_run(_client(b), lambda p, q: _total(p) + _total(q), ref, ref))
    assert total == 2 * float(np.arange(1000).sum())
    assert _peer(b)[3] == before[3] + 1


def test_another_sessions_value_is_not_found(pair: tuple[WorkerProc, WorkerProc]) -> None:
    a, b = pair
    _value(_run(_client(a), _make, 10, keep=103))
    with pytest.raises(errors.NotFoundError, match="holds no kept value 103 for session other"):
        _client(a, "other").read_value(103)
    # A closure of another session sees none of it either, here or on a peer.
    for worker in (a, b):
        reply = _run(_client(worker, "other"), _total, wire.KeptRef(103, a.address))
        error = reply["error"]
        assert error is not None and error.kind == "input" and error.resource_id == 103
        assert a.address in error.message


def test_release_resource_and_end_session_release_kept_values(
    pair: tuple[WorkerProc, WorkerProc],
) -> None:
    a, _ = pair
    session = "kept-release"
    client = _client(a, session)
    _value(_run(client, _make, 1000, keep=1))
    _value(_run(client, _make, 1000, keep=2))
    assert _held_bytes(a, session) == 8000
    assert client.release_resource([1]) == 1
    with pytest.raises(errors.NotFoundError):
        client.read_value(1)
    assert _held_bytes(a, session) == 4000
    client.read_value(2)
    assert client.end_session() is True

    def gone() -> bool:  # the release is a job queued behind the session's closures
        try:
            client.read_value(2)
        except errors.NotFoundError:
            return True
        return False

    wait_until(gone, what="the session's kept value released")
    assert _held_bytes(a, session) == 0


def _wait_for(path: str, spin: bool) -> str:
    """Runs until ``path`` exists; ``spin`` holds the GIL all along (pure Python)."""
    import os
    import time

    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return "gave up"
        if not spin:
            time.sleep(0.005)
    return "released"


@pytest.mark.parametrize("spin", [False, True], ids=["sleeping", "holding-the-gil"])
def test_a_read_is_served_while_the_holder_runs_a_long_closure(
    pair: tuple[WorkerProc, WorkerProc], tmp_path: Path, spin: bool
) -> None:
    import concurrent.futures

    a, _ = pair
    _value(_run(_client(a), _make, 1_000_000, keep=104))  # 4 MB
    gate = str(tmp_path / "gate")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        busy = pool.submit(_run, _client(a), _wait_for, gate, spin)
        wait_until(lambda: _client(a).get_status().inflight == 1, what="the closure started")
        started = time.perf_counter()
        read = _client(a).read_value(104, timeout=30.0)
        took = time.perf_counter() - started
        # The closure cannot end before the gate opens, so the read did not wait for it.
        assert not busy.done()
        Path(gate).touch()
        assert _value(busy.result(timeout=60)) == "released"
    assert len(wire.decode(read.pickle, read.buffers)["x"]) == 1_000_000
    print(f"read of 4 MB while the holder {'spins' if spin else 'sleeps'}: {took * 1e3:.1f} ms")


def test_a_draining_holder_still_serves_reads(tmp_path: Path) -> None:
    import concurrent.futures

    with running_worker([]) as holder:
        _value(_run(_client(holder), _make, 1000, keep=7))
        gate = str(tmp_path / "gate")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            busy = pool.submit(_run, _client(holder), _wait_for, gate, False)
            wait_until(lambda: _client(holder).get_status().inflight == 1, what="started")
            holder.popen.send_signal(signal.SIGTERM)
            wait_until(
                lambda: _client(holder).get_status().state in ("draining", "preempting"),
                what="draining",
            )
            read = _client(holder).read_value(7)
            assert wire.decode(read.pickle, read.buffers)["tag"] == "made"
            Path(gate).touch()
            assert _value(busy.result(timeout=60)) == "released"
        assert holder.finish() == 0


def test_a_pull_from_a_dead_holder_is_an_input_error_naming_it(
    pair: tuple[WorkerProc, WorkerProc],
) -> None:
    _, b = pair
    holder = launch([])
    try:
        address = holder.wait_listening()
        _value(_run(_client(holder), _make, 1000, keep=9))
    finally:
        holder.finish(kill=True)
    reply = _run(_client(b), _total, wire.KeptRef(9, address))
    error = reply["error"]
    assert error is not None, reply
    assert error.kind == "input"
    assert error.resource_id == 9
    assert f"holder {address}" in error.message
    assert error.type_name in ("UnavailableError", "DeadlineExceededError")


def test_kept_info_specs_arrays_keeps_small_leaves_and_omits_large_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import jax

    from jaxcluster.worker import kept

    value = {
        "w": np.zeros((2, 3), np.float32),
        "step": 3,
        "blob": "x" * (2 * SMALL_LEAF_BYTES),
        "pair": (np.ones(4, np.int8), None),
    }
    info = kept_info(value)
    assert info.nbytes == 24 + 4
    assert info.spec["w"] == jax.ShapeDtypeStruct((2, 3), np.float32)
    assert info.spec["step"] == 3
    assert isinstance(info.spec["blob"], wire.OmittedLeaf)
    assert info.spec["blob"].type_name == "str" and info.spec["blob"].pickled_bytes > 2048
    assert info.spec["pair"][0] == jax.ShapeDtypeStruct((4,), np.int8)
    assert wire.decode(*_roundtrip(info)) == info

    monkeypatch.setattr(kept, "_jax", lambda: None)  # a worker without JAX
    plain = kept_info(value)
    assert plain.nbytes == 28
    assert plain.spec["w"] == wire.ArraySpec((2, 3), "<f4")
    assert plain.spec["pair"] == (wire.ArraySpec((4,), "|i1"), None)


def _roundtrip(value: Any) -> tuple[bytes, list[bytes]]:
    encoded = wire.encode(value)
    return encoded.pickle, encoded.buffers


def test_a_kept_ref_pickles_as_a_persistent_id() -> None:
    ref = wire.KeptRef(5, "10.0.0.1:8470")
    with pytest.raises(Exception):  # noqa: B017 - the fast path gives up, whatever it raises
        wire.fast_encode((ref,))
    data, buffers = _roundtrip({"a": ref, "b": [ref]})
    assert b"10.0.0.1:8470" in data
    assert wire.decode(data, buffers) == {"a": ref, "b": [ref]}
    resolved = wire.decode(data, buffers, resolve_kept=lambda i, h: (i, h))
    assert resolved == {"a": (5, "10.0.0.1:8470"), "b": [(5, "10.0.0.1:8470")]}


def test_a_tls_worker_without_a_ca_for_its_peers_says_why_it_cannot_pull(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jaxcluster.worker.main import _dataflow_tls

    monkeypatch.delenv("JAXCLUSTER_TLS_CA", raising=False)
    assert _dataflow_tls(None, None) == (None, None)
    ca, why = _dataflow_tls(b"cert", None)
    assert ca is None and why is not None and "JAXCLUSTER_TLS_CA" in why
    assert _dataflow_tls(b"cert", b"slice ca") == (b"slice ca", None)


def test_an_in_process_server_answers_reads_from_its_reader() -> None:
    """The reader thread's protocol against the server directly (no executor)."""
    from jaxcluster.worker.kept import ValueReader
    from jaxcluster.worker.resources import ResourceRegistry

    server = core.WorkerServer("127.0.0.1:0")
    registry = ResourceRegistry()
    registry.put("s", 3, np.arange(5), kept=True)
    registry.put("s", 4, np.arange(5))  # a resource, not a kept value
    reader = ValueReader(server, registry, 0)
    reader.start()
    try:
        client = core.WorkerClient(server.address, session="s")
        read = client.read_value(3)
        np.testing.assert_array_equal(wire.decode(read.pickle, read.buffers), np.arange(5))
        with pytest.raises(errors.NotFoundError):
            client.read_value(4)
        assert server.status().peer_reads_served == 1
    finally:
        server.shutdown(timeout=5.0)
        reader.stop()
    assert server.reads_closed


def test_a_kept_numpy_array_is_lent_read_only_not_copied() -> None:
    from jaxcluster.worker.kept import lend

    made = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "odd": np.arange(4)[::2]}
    kept = lend(made)
    np.testing.assert_array_equal(kept["x"], made["x"])
    assert not kept["x"].flags.writeable
    assert np.shares_memory(kept["x"], made["x"])  # the same memory, lent
    assert kept["odd"] is made["odd"]  # not contiguous: kept as it is
    encoded = wire.encode(kept, zero_copy=True)
    assert type(encoded.buffers[0]) is core.Buffer  # lent to the server, not copied
