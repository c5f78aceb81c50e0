"""Dataflow on real workers (issue 26 part 2): RemoteValues as arguments, producer errors
and cancellation reaching their consumers, join waiting for closures not queued yet.

What needs the worker side of kept results (``keep_result=True``: holders, peer pulls,
lineage, release) is in ``test_dataflow_kept.py``.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from jaxcluster import errors
from jaxcluster.coordinator import ClusterCoordinator, RemoteValueStatus
from support.closures import local_cluster, wait_for_file


def _gated(path: str, value: Any) -> Any:
    """Runs on a worker: marks its start (``path.started``), returns ``value`` once
    ``path`` exists."""
    Path(path + ".started").touch()
    assert wait_for_file(path), f"{path} never appeared"
    return value


@dataclasses.dataclass
class _Params:
    """A container JAX knows as a pytree node (workers import it with this module)."""

    weights: Any
    bias: Any
    name: str = "p"


jax.tree_util.register_dataclass(_Params, data_fields=["weights", "bias"], meta_fields=["name"])


def _params_sum(params: _Params) -> Any:
    assert isinstance(params, _Params) and params.name == "layer"
    return float(params.weights.sum()) + params.bias


def _fail(message: str) -> Any:
    raise KeyError(message)


def _add(a: Any, b: Any) -> Any:
    return a + b


@pytest.fixture(scope="module")
def per_closure(cluster: Any) -> Iterator[ClusterCoordinator]:
    with cluster.coordinator(error_policy="per_closure") as c:
        yield c


def test_a_chain_runs_in_order_with_the_values_in_between(
    per_closure: ClusterCoordinator,
) -> None:
    rv = per_closure.schedule(np.arange, args=(5,))
    for _ in range(4):
        rv = per_closure.schedule(_add, args=(rv, 1))
    np.testing.assert_array_equal(rv.fetch(), np.arange(5) + 4)


def test_fan_in_from_every_container_kind(per_closure: ClusterCoordinator) -> None:
    a = per_closure.schedule(lambda: 1)
    b = per_closure.schedule(lambda: 10)
    c = per_closure.schedule(lambda: 100)
    total = per_closure.schedule(
        lambda xs, d, *, k: xs[0] + xs[1][0] + d["c"] + k,
        args=((a, [b]), {"c": c}),
        kwargs={"k": a},
    )
    assert total.fetch() == 112


def test_schedule_returns_before_the_producer_ends(
    per_closure: ClusterCoordinator, tmp_path: Path
) -> None:
    gate = str(tmp_path / "open")
    producer = per_closure.schedule(_gated, args=(gate, 41))
    consumer = per_closure.schedule(lambda x: x + 1, args=(producer,))
    # schedule() did not wait: neither has ended while the gate is shut.
    assert consumer.status is RemoteValueStatus.NOT_READY
    assert not producer.done()
    assert per_closure.join(timeout=0.2) is False
    Path(gate).touch()
    assert per_closure.join(timeout=60) is True
    assert consumer.done() and consumer.fetch() == 42


def test_a_producer_error_fails_its_consumers_naming_it(
    per_closure: ClusterCoordinator,
) -> None:
    producer = per_closure.schedule(_fail, args=("boom",))
    consumer = per_closure.schedule(lambda x: x, args=([producer],))
    second = per_closure.schedule(lambda x: x, args=(consumer,))
    with pytest.raises(errors.ClosureInputError) as raised:
        consumer.fetch(timeout=60)
    message = str(raised.value)
    assert f"closure {producer._cell.closure_id} (_fail)" in message
    assert "KeyError" in message and "boom" in message
    assert isinstance(raised.value.__cause__, KeyError)
    # Transitively: the consumer's consumer names the consumer.
    with pytest.raises(errors.ClosureInputError, match="<lambda>"):
        second.fetch(timeout=60)


def test_cancel_all_cancels_waiting_dependents(cluster: Any, tmp_path: Path) -> None:
    gate = str(tmp_path / "open")
    with cluster.coordinator() as coordinator:
        slow = coordinator.schedule(_gated, args=(gate, 1))
        waiting = coordinator.schedule(lambda x: x, args=(slow,))
        assert wait_for_file(gate + ".started")  # running, so the failure cannot cancel it
        failing = coordinator.schedule(_fail, args=("first",))
        assert failing._wait(60)
        Path(gate).touch()
        with pytest.raises(KeyError, match="first"):
            coordinator.join()
        assert slow.fetch() == 1  # it was running: it finished
        assert waiting.status is RemoteValueStatus.ABORTED
        with pytest.raises(errors.CancelledError, match="cancel_all"):
            waiting.fetch()
        # The coordinator serves on.
        assert coordinator.schedule(lambda x: x * 2, args=(slow,)).fetch(timeout=60) == 2


def test_shutdown_cancels_waiting_dependents(cluster: Any, tmp_path: Path) -> None:
    gate = str(tmp_path / "never")
    coordinator = cluster.coordinator()
    producer = coordinator.schedule(_gated, args=(gate, 1))
    waiting = coordinator.schedule(lambda x: x, args=(producer,))
    coordinator.shutdown()
    Path(gate).touch()  # lets the producer's worker go on
    with pytest.raises(errors.CancelledError, match="shut down"):
        waiting.fetch(timeout=60)


def test_producer_values_are_inlined_once_per_consumer(
    per_closure: ClusterCoordinator,
) -> None:
    producer = per_closure.schedule(lambda: np.full(1000, os.getpid()))
    consumers = [per_closure.schedule(lambda x: int(x.sum()), args=(producer,)) for _ in range(4)]
    pid = int(producer.fetch()[0])
    assert per_closure.fetch(consumers) == [pid * 1000] * 4


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster(2) as c:
        yield c


def test_remote_values_inside_a_registered_jax_pytree(per_closure: ClusterCoordinator) -> None:
    # "Anywhere in the argument pytree": a jax.tree_util node is looked into as tuples,
    # lists and dicts are, kept and returned producers alike, and fetch() rebuilds it.
    weights = per_closure.schedule(np.ones, args=(1000,), keep_result=True)
    bias = per_closure.schedule(lambda: 5.0)
    params = _Params(weights, bias, name="layer")
    total = per_closure.schedule(_params_sum, args=(params,))
    assert total.fetch() == 1005.0
    fetched = per_closure.fetch(params)
    assert isinstance(fetched, _Params) and fetched.name == "layer"
    np.testing.assert_array_equal(fetched.weights, np.ones(1000))
    assert fetched.bias == 5.0


def test_plain_arguments_skip_the_walk_and_a_producer_among_them_is_still_found() -> None:
    from jaxcluster.coordinator.dataflow_nodes import producers_of

    class Producer:
        _coordinator = None

    plain_args = (1, 2.5, True, "s", b"b", None, 1j)
    assert producers_of(plain_args, {"k": 3}, Producer, None) == []
    first, nested = Producer(), Producer()
    assert producers_of((1, first), {}, Producer, None) == [first]
    assert producers_of((1,), {"k": [2, {"deep": nested}]}, Producer, None) == [nested]
    # A container among plain values is walked: a producer inside a namedtuple is found.
    pair = collections.namedtuple("pair", "a b")
    inside = Producer()
    assert producers_of((1, pair(2, inside)), {}, Producer, None) == [inside]
