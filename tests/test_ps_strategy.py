"""ParameterServerStrategy on a real LocalCluster (2 workers, 2 ps tasks): placement,
sharding, the variable API, pickling into closures that real workers run."""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxcluster
from jaxcluster import wire
from jaxcluster._native import core
from jaxcluster.cluster_resolver import SimpleClusterResolver
from jaxcluster.coordinator import functions
from jaxcluster.coordinator._errors import rebuild_exception
from jaxcluster.errors import UnauthenticatedError
from jaxcluster.local_cluster import LocalCluster
from jaxcluster.strategy import (
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
    ParameterServerStrategy,
    ParameterServerVariable,
    _clients,
    parameter_server_strategy,
)
from jaxcluster.worker import context

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(num_workers=2, num_ps=2) as c:
        yield c


def strategy_for(cluster: LocalCluster, partitioner: Any = None) -> ParameterServerStrategy:
    return ParameterServerStrategy(cluster.resolver, partitioner, auth_token=cluster.auth_token)


def run_on_worker(cluster: LocalCluster, index: int, fn: Callable[..., Any], *args: Any) -> Any:
    """Runs ``fn(*args)`` on worker ``index`` the way a coordinator would; raises what it
    raised there."""
    client = core.WorkerClient(cluster.addresses[index], auth_token=cluster.auth_token)
    payload = functions.pickle_function(fn)
    client.register_function(payload.function_hash, payload.kind, payload.payload)
    encoded = wire.encode((args, {}))
    reply = client.run_closure(payload.function_hash, encoded.pickle, encoded.buffers, timeout=120)
    if reply["error"] is not None:
        raise rebuild_exception(reply["error"])
    return wire.decode(reply["value"], reply["buffers"])


def ps_names(cluster: LocalCluster, task: int, strategy: ParameterServerStrategy) -> set[str]:
    """The variables ps task ``task`` holds for ``strategy`` (its session's; a ps lists
    only the caller's session)."""
    client = core.PsClient(
        cluster.ps_addresses[task], auth_token=cluster.auth_token, session=strategy.session_id
    )
    return {v["name"] for v in client.list_variables()}


def test_the_tf_documentation_example_fetches_0_125_from_a_worker(cluster: LocalCluster) -> None:
    strategy = strategy_for(cluster)
    with strategy.scope():
        v1 = strategy.Variable(initial_value=0.0)
        v2 = strategy.Variable(initial_value=1.0)

    def worker_fn() -> Any:
        v1.assign_add(0.1)
        v2.assign_sub(0.2)
        return v1.read_value() / v2.read_value()

    result = run_on_worker(cluster, 0, worker_fn)
    assert result.dtype == np.float32
    assert float(result) == pytest.approx(0.125)
    assert v1.read_value() == np.float32(0.1)


def test_variables_go_to_ps_tasks_round_robin(cluster: LocalCluster) -> None:
    strategy = strategy_for(cluster)
    with strategy.scope():
        made = [strategy.Variable(np.zeros(2, np.float32), name="rr") for _ in range(3)]
    assert [v.name for v in made] == ["rr", "rr_1", "rr_2"]
    assert [v.shards[0].task for v in made] == [0, 1, 0]
    assert {"rr", "rr_2"} <= ps_names(cluster, 0, strategy)
    assert "rr_1" in ps_names(cluster, 1, strategy) and "rr_1" not in ps_names(cluster, 0, strategy)
    assert strategy.variables == made and strategy.num_ps == 2


def test_sharded_variables_reassemble_and_update_across_shards(cluster: LocalCluster) -> None:
    strategy = strategy_for(cluster, FixedShardsPartitioner(3))
    initial = np.arange(20, dtype=np.float32).reshape(10, 2)
    with strategy.scope():
        table = strategy.Variable(initial, name="table")
        scalar = strategy.Variable(5, name="scalar")  # scalars are never sharded
    assert [(s.start, s.stop) for s in table.shards] == [(0, 4), (4, 7), (7, 10)]
    assert [s.task for s in table.shards] == [0, 1, 0]
    assert {"table/part_0", "table/part_2"} <= ps_names(cluster, 0, strategy)
    assert len(scalar.shards) == 1 and scalar.dtype == np.int32
    np.testing.assert_array_equal(table.read_value(), initial)
    table.assign_add(np.ones((10, 2), np.float32))
    table.scatter_add(indices=np.array([[0, 9], [5, 9]]), updates=np.full((2, 2, 2), 10.0))
    expected = initial + 1
    expected[[0, 5]] += 10
    expected[9] += 20
    np.testing.assert_array_equal(table.read_value(), expected)
    np.testing.assert_array_equal(np.asarray(table), expected)
    with pytest.raises(ValueError, match=r"index 10 is out of range"):
        table.scatter_add(indices=[10], updates=np.ones((1, 2)))


def test_partitioners_follow_tf_arithmetic() -> None:
    assert FixedShardsPartitioner(4)((3, 5), np.float32) == [3, 1]
    assert MinSizePartitioner(min_shard_bytes=16, max_shards=10)((10, 2), np.float32) == [5, 1]
    assert MinSizePartitioner(min_shard_bytes=1 << 20, max_shards=10)((10, 2), "f4") == [1, 1]
    assert MaxSizePartitioner(max_shard_bytes=24)((10, 2), np.float32) == [4, 1]
    assert MaxSizePartitioner(max_shard_bytes=24, max_shards=2)((10, 2), np.float32) == [2, 1]
    with pytest.raises(ValueError, match="num_shards=0"):
        FixedShardsPartitioner(0)


def test_values_convert_within_their_kind_and_keep_the_variable_dtype(
    cluster: LocalCluster,
) -> None:
    strategy = strategy_for(cluster)
    with strategy.scope():
        f = strategy.Variable(jnp.zeros((2,), jnp.float32), name="f")
        i = strategy.Variable(np.int8(3), name="i")
        b = strategy.Variable(np.ones(2), dtype=ml_dtypes.bfloat16, name="b")
    f.assign_add(jnp.ones((2,)))
    f.assign_add(np.array([0.5, 0.5]))  # float64 -> float32
    f.assign_sub([1, 1])  # python ints -> float32: numbers convert to floats
    with pytest.raises(TypeError, match=r"'i' \(int8\[\]\) got a float64 value"):
        i.assign_add(0.5)
    with pytest.raises(ValueError, match=r"shape \(3,\); expected shape \(2,\)"):
        f.assign(np.zeros(3, np.float32))
    assert i.assign_add(np.int8(4)) is i
    assert i.assign(np.int8(1), read_value=False) is None
    b.assign_add(np.array([0.5, 0.5], np.float32))
    assert f.read_value().dtype == np.float32 and list(f.read_value()) == [0.5, 0.5]
    assert i.read_value().dtype == np.int8 and i.read_value() == 1
    assert b.read_value().dtype == ml_dtypes.bfloat16 and list(b.numpy()) == [1.5, 1.5]


def test_concurrent_updates_from_workers_and_the_coordinator_all_land(
    cluster: LocalCluster,
) -> None:
    strategy = strategy_for(cluster, FixedShardsPartitioner(2))
    with strategy.scope():
        count = strategy.Variable(np.zeros((4, 3), np.int64), name="count")
    per_call, calls_per_worker, coordinator_threads = 50, 3, 4

    def add_many(n: int) -> int:
        for _ in range(n):
            count.assign_add(np.ones((4, 3), np.int64))
        return n

    def worker_loop(index: int) -> None:
        for _ in range(calls_per_worker):
            assert run_on_worker(cluster, index, add_many, per_call) == per_call

    threads = [threading.Thread(target=worker_loop, args=(w,)) for w in range(2)]
    threads += [
        threading.Thread(target=add_many, args=(per_call,)) for _ in range(coordinator_threads)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = per_call * (2 * calls_per_worker + coordinator_threads)
    np.testing.assert_array_equal(count.read_value(), np.full((4, 3), expected))


def test_pickles_carry_the_layout_but_never_the_token(cluster: LocalCluster) -> None:
    strategy = strategy_for(cluster, FixedShardsPartitioner(2))
    with strategy.scope():
        v = strategy.Variable(np.arange(4, dtype=np.float32), name="pickled")
    data = pickle.dumps(v)
    assert cluster.auth_token.encode() not in data
    context.set_worker_auth_token("not-the-token")
    try:
        stranger = pickle.loads(data)
        with pytest.raises(UnauthenticatedError):
            stranger.read_value()
    finally:
        context.set_worker_auth_token(None)
    context.set_worker_auth_token(cluster.auth_token)
    try:
        copy = pickle.loads(data)
        np.testing.assert_array_equal(copy.read_value(), np.arange(4))
        assert isinstance(copy, ParameterServerVariable) and copy.shards == v.shards
        twin = pickle.loads(data)
        address = v.shards[0].address
        assert _clients.client_for(address, cluster.auth_token) is _clients.client_for(
            address, cluster.auth_token
        )
        np.testing.assert_array_equal(twin.read_value(), copy.read_value())
    finally:
        context.set_worker_auth_token(None)


def test_misuse_is_refused_clearly(cluster: LocalCluster) -> None:
    strategy = strategy_for(cluster)
    with pytest.raises(RuntimeError, match=r"outside `with strategy.scope\(\):`"):
        strategy.Variable(1.0)
    with strategy.scope():
        with pytest.raises(TypeError, match="complex128"):
            strategy.Variable(np.zeros(2, np.complex128))
        with pytest.raises(ValueError, match="empty"):
            strategy.Variable(1.0, name="")
    only_workers = SimpleClusterResolver(jaxcluster.ClusterSpec({"worker": cluster.addresses}))
    with pytest.raises(ValueError, match=r"non-empty 'ps' job.*jobs \['worker'\]"):
        ParameterServerStrategy(only_workers)
    bad = ParameterServerStrategy(cluster.resolver, lambda shape, dtype: [2, 2])
    with bad.scope(), pytest.raises(ValueError, match="variable_partitioner returned"):
        bad.Variable(np.zeros((4, 4), np.float32))
    assert bad.variables == []


def test_exported_lazily_and_token_from_argument_or_environment(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert jaxcluster.ParameterServerStrategy is ParameterServerStrategy
    assert "ParameterServerStrategy" in jaxcluster.__all__
    resolver = cluster.resolver
    monkeypatch.setenv("JAXCLUSTER_AUTH_TOKEN", " env-token\n")
    strategy = jaxcluster.ParameterServerStrategy(resolver)
    assert strategy.cluster_resolver is resolver
    assert strategy.auth_token == "env-token"
    assert ParameterServerStrategy(resolver, auth_token="given").auth_token == "given"


def test_the_module_docstring_example_runs_as_written(tmp_path: Path) -> None:
    doc = inspect.getdoc(parameter_server_strategy)
    assert doc is not None
    example = textwrap.dedent(doc.split("::\n", 1)[1])
    fetch = "coordinator.schedule(step).fetch()     # 0.125"
    assert fetch in example
    script = tmp_path / "example.py"
    script.write_text(example.replace(fetch, f"print({fetch.split('  ')[0]})"))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.split()[-1]) == pytest.approx(0.125)
