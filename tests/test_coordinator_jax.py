"""jax.jit functions scheduled on real workers: exported once, same numbers as locally."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from support.closures import worker_status

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pytest.importorskip("flatbuffers")  # jax.export's serializer needs it

NUM_WORKERS = 2


@jax.jit
def grad_step(params: dict[str, Any], x: Any, y: Any, lr: Any) -> tuple[Any, Any]:
    def loss_fn(p: dict[str, Any]) -> Any:
        return jnp.mean((jnp.tanh(x @ p["w"] + p["b"]) - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), loss


def _batch(seed: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    params = {
        "w": rng.normal(size=(6, 2)).astype(np.float32),
        "b": rng.normal(size=(2,)).astype(np.float32),
    }
    return (
        params,
        rng.normal(size=(16, 6)).astype(np.float32),
        rng.normal(size=(16, 2)).astype(np.float32),
    )


def _registered(cluster: Any) -> list[int]:
    return [worker_status(cluster, i)["functions_registered"] for i in range(NUM_WORKERS)]


def test_a_jitted_function_matches_local_results_and_is_sent_once_per_worker(
    cluster: Any,
) -> None:
    held_before = _registered(cluster)
    with cluster.coordinator() as coordinator:
        batches = [_batch(seed) for seed in range(24)]
        rvs = [coordinator.schedule(grad_step, args=(*b, 0.1)) for b in batches]
        assert coordinator.join() is True
        for batch, rv in zip(batches, rvs, strict=True):
            remote_params, remote_loss = rv.fetch()
            local_params, local_loss = grad_step(*batch, 0.1)
            assert isinstance(remote_params["w"], np.ndarray)
            np.testing.assert_allclose(remote_params["w"], local_params["w"], rtol=1e-5)
            np.testing.assert_allclose(remote_params["b"], local_params["b"], rtol=1e-5)
            np.testing.assert_allclose(remote_loss, local_loss, rtol=1e-5)
        sent = coordinator.metrics()["functions_registered"]
    gained = [
        after - before for before, after in zip(held_before, _registered(cluster), strict=True)
    ]
    # 24 closures, one export: each worker received it at most once.
    assert 1 <= sent <= NUM_WORKERS
    assert all(g in (0, 1) for g in gained) and sum(gained) == sent


def test_jax_arrays_as_arguments_and_a_new_shape_makes_a_new_export(cluster: Any) -> None:
    double = jax.jit(lambda v: v * 2)
    with cluster.coordinator() as coordinator:
        small = coordinator.schedule(double, args=(jnp.arange(3.0),)).fetch()
        large = coordinator.schedule(double, args=(jnp.arange(5.0),)).fetch()
        again = coordinator.schedule(double, args=(jnp.ones(3),)).fetch()
        np.testing.assert_allclose(small, [0.0, 2.0, 4.0])
        np.testing.assert_allclose(large, np.arange(5.0) * 2)
        np.testing.assert_allclose(again, [2.0, 2.0, 2.0])
        # Two signatures, so two payloads, each sent to at most every worker.
        assert 2 <= coordinator.metrics()["functions_registered"] <= 2 * NUM_WORKERS


def test_a_jitted_function_with_static_arguments_falls_back_and_still_runs(
    cluster: Any,
) -> None:
    repeat = jax.jit(lambda v, n: jnp.tile(v, n), static_argnums=1)
    with cluster.coordinator() as coordinator:
        value = coordinator.schedule(repeat, args=(np.arange(2), 3)).fetch()
        np.testing.assert_array_equal(value, [0, 1, 0, 1, 0, 1])
        text = coordinator.schedule(
            jax.jit(lambda v, tag: v + len(tag), static_argnums=1), args=(np.ones(2), "abc")
        ).fetch()
        np.testing.assert_allclose(text, [4.0, 4.0])
