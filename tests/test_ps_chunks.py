"""ps variables above the message limit (protocol revision 4): every call that carries a
value goes through CallChunked when it must, at the chunk boundaries (a 64 KiB limit) and
at real size (a 96 MiB variable, above the default 64 MiB limit)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from jaxcluster._native import core

LIMIT = 64 * 1024
TOKEN = "ps-chunk-token"


@pytest.fixture(scope="module")
def small_ps() -> Iterator[Any]:
    server = core.PsServer("127.0.0.1:0", auth_token=TOKEN, max_message_bytes=LIMIT)
    try:
        yield server
    finally:
        server.shutdown()


def client_of(server: Any, limit: int | None = None) -> Any:
    kwargs = {} if limit is None else {"max_message_bytes": limit}
    return core.PsClient(server.address, auth_token=TOKEN, **kwargs)


@pytest.mark.parametrize("elements", [LIMIT // 4 - 64, LIMIT // 4, LIMIT // 4 + 1, 9 * LIMIT])
def test_every_call_works_across_the_chunk_boundary(small_ps: Any, elements: int) -> None:
    client = client_of(small_ps, LIMIT)
    name = f"v{elements}"
    start = np.arange(elements, dtype=np.float32)
    before = client.get_status()
    client.create_variable(name, start, replace=True)
    np.testing.assert_array_equal(client.read(name), start)
    # Tensor bytes are counted once per call, whether it came whole or in chunks.
    after = client.get_status()
    assert after["bytes_written"] - before["bytes_written"] == start.nbytes
    assert after["bytes_read"] - before["bytes_read"] == start.nbytes
    client.assign(name, start * 2)
    client.assign_add(name, np.ones(elements, np.float32))
    after = client.assign_sub(name, np.full(elements, 0.5, np.float32), read_value=True)
    np.testing.assert_array_equal(after, start * 2 + 0.5)
    client.scatter_add(name, [0, elements - 1], np.full(2, 10.0, np.float32))
    value, version = client.read_versioned(name)
    assert version == 4
    assert value[0] == 10.5 and value[-1] == start[-1] * 2 + 10.5
    many = client.read_many([name])
    np.testing.assert_array_equal(many[name], value)
    client.assign_many([(name, start)])
    np.testing.assert_array_equal(client.read(name), start)
    assert client.delete_variables([name]) == 1


def test_a_client_with_a_larger_limit_still_reads_what_the_ps_cannot_send_whole(
    small_ps: Any,
) -> None:
    # The client's own limit allows the read, the ps's does not: the ps refuses the unary
    # answer and the client reads again in chunks.
    small = client_of(small_ps, LIMIT)
    value = np.arange(3 * LIMIT, dtype=np.int32)
    small.create_variable("wide", value, replace=True)
    np.testing.assert_array_equal(client_of(small_ps).read("wide"), value)
    assert small_ps.status()["rejected_requests"] >= 1


@pytest.mark.timeout(600)
def test_a_variable_above_the_default_limit_is_created_updated_and_read() -> None:
    server = core.PsServer("127.0.0.1:0", auth_token=TOKEN)
    try:
        client = client_of(server)
        elements = 96 * (1 << 20) // 4  # 96 MiB, above the 64 MiB default limit
        value = np.ones(elements, np.float32)
        client.create_variable("big", value)
        client.assign_add("big", value)
        read = client.read("big")
        assert read.shape == (elements,) and float(read[0]) == 2.0 and float(read[-1]) == 2.0
        del read
        added = client.assign_add("big", value, read_value=True)
        assert float(added[elements // 2]) == 3.0
        assert server.status()["variable_bytes"] == elements * 4
    finally:
        server.shutdown()


def test_apply_update_in_chunks_borrowed_or_copied_gives_the_same_update() -> None:
    """A gradient above the limit goes through CallChunked with its chunks framed from the
    array's own memory (chunks of 512 KiB: above the size sent by reference); lent (no
    copy) or copied, every element lands, in order."""
    import jax.numpy as jnp

    from jaxcluster.strategy import optimizers as opt

    server = core.PsServer("127.0.0.1:0", auth_token=TOKEN, max_message_bytes=1 << 20)
    try:
        client = client_of(server, 1 << 20)
        sgd = opt.SGD(0.5, name="chunked")
        elements = 2 * (1 << 20) + 3  # 8 MiB and a bit: 17 chunks, the last one short
        # float32 throughout (numpy 1.x would promote `/ elements` to float64)
        gradient = (np.arange(elements) / elements).astype(np.float32)
        original = gradient.copy()
        start = np.ones(elements, np.float32)
        expected = start - 0.5 * gradient
        sent = {
            "copied": (gradient, False),
            "borrowed": (gradient, True),
            "jax": (np.asarray(jnp.asarray(gradient)), True),
        }
        for name, (grad, borrow) in sent.items():
            client.create_variable(name, start)
            before = client.get_status()["bytes_written"]
            client.apply_update(name, sgd._name, sgd._spec, grad, borrow=borrow)
            assert client.get_status()["bytes_written"] - before == gradient.nbytes
            np.testing.assert_array_equal(client.read(name), expected, err_msg=name)
        np.testing.assert_array_equal(gradient, original)  # lent, never written
    finally:
        server.shutdown()


def test_a_lent_gradient_is_never_read_after_apply_update_returns() -> None:
    """Calls cut short by a deadline while their chunks are being sent: each returns only
    once HTTP/2 let go of the lent gradient, so overwriting it with NaN at once never
    reaches the ps. The variable holds either the whole update or none of it."""
    from jaxcluster import errors
    from jaxcluster.strategy import optimizers as opt

    server = core.PsServer("127.0.0.1:0", auth_token=TOKEN, max_message_bytes=1 << 20)
    try:
        client = client_of(server, 1 << 20)
        sgd = opt.SGD(1.0, name="lent")
        elements = 8 * (1 << 20)  # 32 MiB: 64 chunks
        client.create_variable("lent", np.zeros(elements, np.float32))
        cut_short = 0
        for attempt in range(12):
            gradient = np.full(elements, -1.0, np.float32)
            try:
                client.apply_update(
                    "lent",
                    sgd._name,
                    sgd._spec,
                    gradient,
                    borrow=True,
                    timeout=0.002 * (attempt + 1),
                )
            except (errors.DeadlineExceededError, errors.UnavailableError):
                cut_short += 1  # by our deadline, or by tonic's (its transport's error)
            gradient[:] = np.nan  # what a caller may do once the call returned
        value = client.read("lent")
        assert not np.isnan(value).any()
        assert value.min() == value.max()  # whole updates only: each step adds exactly 1
        assert 12 - cut_short <= value[0] <= 12
        assert cut_short > 0
    finally:
        server.shutdown()
