"""A jax.jit function exported with jax.export runs on a worker with the same numbers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from jaxcluster import wire
from jaxcluster.coordinator import functions
from support.workers import WorkerProc, running_worker

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
# jax.export's serializer needs the `flatbuffers` package.
pytest.importorskip("flatbuffers")


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProc]:
    with running_worker(["--index", "2"]) as w:
        yield w


@jax.jit
def mlp_step(params: dict[str, Any], x: Any) -> tuple[Any, Any]:
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    out = hidden @ params["w2"]
    return out, jnp.mean(out**2)


def test_an_exported_jit_function_matches_local_results(worker: WorkerProc) -> None:
    rng = np.random.default_rng(0)
    params = {
        "w1": rng.normal(size=(8, 16)).astype(np.float32),
        "b1": rng.normal(size=(16,)).astype(np.float32),
        "w2": rng.normal(size=(16, 4)).astype(np.float32),
    }
    x = rng.normal(size=(32, 8)).astype(np.float32)
    exported = functions.export_function(mlp_step, (params, x))
    assert exported.kind == "jax_export"

    client = worker.client()
    client.register_function(exported.function_hash, exported.kind, exported.payload)
    args = wire.encode(((params, x), {}))
    reply = client.run_closure(exported.function_hash, args.pickle, args.buffers)
    assert reply["error"] is None, reply["error"]
    remote_out, remote_loss = wire.decode(reply["value"], reply["buffers"])

    local_out, local_loss = mlp_step(params, x)
    assert type(remote_out) is np.ndarray  # JAX arrays come back as numpy
    np.testing.assert_allclose(remote_out, np.asarray(local_out), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(remote_loss, np.asarray(local_loss), rtol=1e-6)


def test_an_export_for_another_platform_is_a_function_load_error(worker: WorkerProc) -> None:
    x = np.ones((2, 2), np.float32)
    exported = functions.export_function(lambda a: a * 2, (x,), platforms=["cuda"])
    client = worker.client()
    client.register_function(exported.function_hash, exported.kind, exported.payload)
    args = wire.encode(((x,), {}))
    error = client.run_closure(exported.function_hash, args.pickle, args.buffers)["error"]
    assert error["kind"] == "function_load"
    assert "['cuda']" in error["message"] and "'cpu'" in error["message"]
