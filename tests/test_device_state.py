"""Per-worker state on the workers' devices: training that never ships its parameters,
fetching one or all, sharded state, and what a worker's SIGKILL does to each mode."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import cloudpickle
import numpy as np
import pytest

from jaxcluster import errors
from jaxcluster.coordinator import DeviceState, RemoteValueStatus
from support.closures import local_cluster, until_ran_on, worker_status

jax = pytest.importorskip("jax")
jnp = jax.numpy

cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: 60 MB of float32 per worker: as large as one message may carry back whole to fetch().
PARAMS = 15_000_000
DEVICES = 2
FORCE = f"--xla_force_host_platform_device_count={DEVICES}"


def init_sharded_params() -> dict[str, Any]:
    """Runs on a worker: parameters sharded over a mesh of that worker's devices."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("d",))
    w = jax.device_put(jnp.zeros((PARAMS,), jnp.float32), NamedSharding(mesh, P("d")))
    return {"w": w, "steps": jnp.zeros((), jnp.int32)}


@jax.jit
def _apply(params: dict[str, Any], delta: Any) -> dict[str, Any]:
    return {"w": params["w"] + delta, "steps": params["steps"] + 1}


apply_update = jax.jit(_apply.__wrapped__, donate_argnums=0)


def train_step(state: DeviceState, delta: Any) -> tuple[int, int, int]:
    """Runs on a worker: one update of that worker's parameters, in place."""
    from jaxcluster.coordinator import get_current_worker_index

    state.assign(apply_update(state.value, delta))
    shards = len(state.value["w"].addressable_shards)
    return get_current_worker_index(), int(state.value["steps"]), shards


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster(2, XLA_FLAGS=FORCE) as c:
        yield c


def test_200_closures_train_without_the_parameters_crossing_the_wire(cluster: Any) -> None:
    with cluster.coordinator() as coordinator:
        state = coordinator.create_per_worker_state(init_sharded_params)
        before = [worker_status(cluster, i) for i in range(2)]
        values = [
            coordinator.schedule(train_step, args=(state, np.float32(0.5))) for _ in range(200)
        ]
        coordinator.join()
        ran = coordinator.fetch(values)
        after = [worker_status(cluster, i) for i in range(2)]
        per_worker = [sum(1 for index, _, _ in ran if index == i) for i in range(2)]
        assert sum(per_worker) == 200
        assert {shards for _, _, shards in ran} == {DEVICES}  # sharded over both devices
        moved = sum(
            a["closure_bytes_received"]
            + a["closure_bytes_sent"]
            - b["closure_bytes_received"]
            - b["closure_bytes_sent"]
            for a, b in zip(after, before, strict=True)
        )
        # 200 steps of 60 MB parameters would be 12 GB each way; a scalar in, three
        # ints out per closure is a few hundred bytes.
        assert moved < 200 * 1024, moved
        assert all(s["resources_created"] >= 1 for s in after)

        one = state.fetch(0)
        assert one["w"].shape == (PARAMS,) and type(one["w"]) is np.ndarray
        assert int(one["steps"]) == per_worker[0]
        everyone = coordinator.fetch(state)
        for i, value in enumerate(everyone):
            assert int(value["steps"]) == per_worker[i]
            np.testing.assert_array_equal(value["w"][:3], [0.5 * per_worker[i]] * 3)
            assert float(value["w"][-1]) == 0.5 * per_worker[i]
        assert [e.status for e in state.values] == [RemoteValueStatus.READY] * 2


def test_a_killed_worker_rebuilds_its_state_by_default(cluster: Any) -> None:
    with cluster.coordinator() as coordinator:
        state = coordinator.create_per_worker_state(lambda: {"n": jnp.zeros((), jnp.int32)})

        def bump(state: DeviceState) -> tuple[int, int]:
            from jaxcluster.coordinator import get_current_worker_index

            state.assign({"n": state.value["n"] + 1})
            return get_current_worker_index(), int(state.value["n"])

        coordinator.fetch([coordinator.schedule(bump, args=(state,)) for _ in range(4)])
        assert sum(int(v["n"]) for v in state.fetch()) == 4
        cluster.kill_worker(0)
        cluster.restart_worker(0)
        # Never the stale value: until the coordinator has rebuilt it (it notices the broken
        # connection of its idle link, or the restart when it next sends work), the loss is
        # reported; once rebuilt, the value is init_fn's.
        try:
            rebuilt = state.fetch(0, timeout=60)
        except errors.AbortedError as exc:
            assert "restarted since it was built; it is built" in str(exc)
        else:
            assert int(rebuilt["n"]) == 0
        # Work for worker 0 lets the coordinator notice the restart and rebuild the state.
        after = until_ran_on(coordinator, bump, (state,), 0)
        assert after == list(range(1, len(after) + 1))  # counted from init_fn
        assert int(state.fetch(0)["n"]) == len(after)
        assert [e.status for e in state.values] == [RemoteValueStatus.READY] * 2


def test_a_state_created_to_be_lost_is_reported_lost() -> None:
    with local_cluster(1) as cluster, cluster.coordinator(error_policy="per_closure") as c:
        state = c.create_per_worker_state(
            lambda: {"n": jnp.ones((), jnp.int32)}, on_worker_restart="lose"
        )
        assert int(c.schedule(lambda s: s.value["n"], args=(state,)).fetch()) == 1
        cluster.kill_worker(0)
        cluster.restart_worker(0)
        with pytest.raises(errors.ClosureInputError) as info:
            c.schedule(lambda s: s.value["n"], args=(state,)).fetch()
        assert isinstance(info.value.original_exception, errors.AbortedError)
        assert "was lost on worker" in str(info.value.original_exception)
        assert state.values[0].status is RemoteValueStatus.ABORTED
        with pytest.raises(errors.AbortedError, match="lost when that worker failed"):
            state.fetch(0)
        # The worker itself serves other closures.
        assert c.schedule(lambda: 7).fetch() == 7


def test_bad_arguments_are_refused(cluster: Any) -> None:
    with cluster.coordinator() as coordinator:
        with pytest.raises(ValueError, match="on_worker_restart='keep'; expected 'rebuild'"):
            coordinator.create_per_worker_state(lambda: 0, on_worker_restart="keep")
        with pytest.raises(TypeError, match="needs a callable init_fn"):
            coordinator.create_per_worker_state(3)  # type: ignore[arg-type]
        state = coordinator.create_per_worker_state(lambda: jnp.zeros(2))
        with pytest.raises(IndexError, match="expected an index from 0 to 1"):
            state.fetch(5)


def test_a_state_above_the_message_limit_is_fetched_whole(cluster: Any) -> None:
    # 80 MiB: above the 64 MiB a single message carries, so the read comes back in chunks
    # (it went through a private unary call before, which refused anything above the limit:
    # a 256 MiB state on a GPU worker could not be fetched).
    elements = 20 * 1024 * 1024

    def init() -> dict[str, Any]:
        # int32: every element exact (float32 stops counting by ones at 2**24).
        return {"w": jnp.arange(elements, dtype=jnp.int32)}

    with cluster.coordinator() as coordinator:
        state = coordinator.create_per_worker_state(init)
        value = state.fetch(1, timeout=120)
        w = value["w"]
        assert w.shape == (elements,) and w.dtype == np.int32
        np.testing.assert_array_equal(w, np.arange(elements, dtype=np.int32))


def test_device_state_assign_frees_replaced_buffers() -> None:
    state = DeviceState({"a": jnp.ones(4), "b": jnp.zeros(2)})
    old_a, old_b = state.value["a"], state.value["b"]
    state.assign({"a": old_a * 2, "b": old_b})  # b kept, a replaced
    assert old_a.is_deleted() and not old_b.is_deleted()
    np.testing.assert_array_equal(state.value["a"], [2, 2, 2, 2])
    state.assign({"a": np.arange(3.0), "b": old_b})
    assert isinstance(state.value["a"], jax.Array) and state.nbytes == 3 * 4 + 2 * 4
