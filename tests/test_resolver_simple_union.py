"""SimpleClusterResolver and UnionClusterResolver (merge rules, overrides, TF's task_id=0 bug)."""

from __future__ import annotations

import pytest

from jaxcluster.cluster_resolver import (
    SimpleClusterResolver,
    UnionClusterResolver,
    UnionResolver,
)
from jaxcluster.cluster_spec import ClusterSpec


def _simple(cluster, **kwargs):
    return SimpleClusterResolver(ClusterSpec(cluster), **kwargs)


def test_simple_returns_what_it_was_given():
    spec = ClusterSpec({"worker": ["w0:1", "w1:1"]})
    resolver = SimpleClusterResolver(
        spec,
        master="m:1",
        task_type="worker",
        task_id=1,
        environment="google",
        num_accelerators={"GPU": 2},
        rpc_layer="grpc",
    )
    assert resolver.cluster_spec() == spec
    assert resolver.master() == "grpc://m:1"
    assert resolver.master("worker", 0) == "grpc://w0:1"
    assert resolver.master("worker", 0, rpc_layer="http") == "http://w0:1"
    assert (resolver.task_type, resolver.task_id, resolver.environment) == ("worker", 1, "google")
    assert resolver.num_accelerators() == {"GPU": 2}
    assert SimpleClusterResolver(spec).num_accelerators() == {}
    assert SimpleClusterResolver(spec).master() == ""


def test_simple_setters_and_dict_spec():
    resolver = SimpleClusterResolver({"worker": ["a:1", "b:1"]})
    resolver.task_type, resolver.task_id, resolver.rpc_layer = "worker", 1, "grpc"
    assert resolver.master("worker", 1) == "grpc://b:1"
    assert resolver.jax_distributed_args()["process_id"] == 1


@pytest.mark.parametrize(
    ("args", "fragment"),
    [(("not a spec",), "cluster_spec must be"), ((ClusterSpec({}), 3), "master must be a string")],
)
def test_simple_type_errors(args, fragment):
    with pytest.raises(TypeError, match=fragment):
        SimpleClusterResolver(*args)


def test_union_extends_lists_in_argument_order():
    first = _simple({"worker": ["w0", "w1"], "chief": ["c0"]})
    second = _simple({"worker": ["w2"], "ps": ["p0"]})
    union = UnionClusterResolver(first, second)
    assert union.cluster_spec().as_dict() == {
        "worker": ["w0", "w1", "w2"],
        "chief": ["c0"],
        "ps": ["p0"],
    }
    assert UnionResolver is UnionClusterResolver


def test_union_merges_sparse_dicts_and_mixed_becomes_dict():
    first = _simple({"worker": {1: "w1"}})
    second = _simple({"worker": {3: "w3"}})
    assert UnionClusterResolver(first, second).cluster_spec().as_dict() == {
        "worker": {1: "w1", 3: "w3"}
    }
    mixed = UnionClusterResolver(_simple({"worker": ["w0"]}), _simple({"worker": {2: "w2"}}))
    assert mixed.cluster_spec().as_dict() == {"worker": {0: "w0", 2: "w2"}}


def test_union_overlapping_indices_raise_key_error_naming_them():
    union = UnionClusterResolver(_simple({"worker": ["w0", "w1"]}), _simple({"worker": {1: "x"}}))
    with pytest.raises(KeyError, match=r"\[1\].*'x'.*'w1'"):
        union.cluster_spec()


def test_union_re_resolves_every_call():
    inner = _simple({"worker": ["a"]})
    union = UnionClusterResolver(inner)
    assert union.cluster_spec().num_tasks("worker") == 1
    inner._cluster_spec = ClusterSpec({"worker": ["a", "b"]})
    assert union.cluster_spec().num_tasks("worker") == 2


def test_union_takes_task_from_first_resolver_unless_overridden():
    first = _simple(
        {"worker": ["w0", "w1"]},
        master="m",
        task_type="worker",
        task_id=1,
        environment="env",
        rpc_layer="grpc",
        num_accelerators={"TPU": 8},
    )
    second = _simple({"ps": ["p0"]}, task_type="ps", task_id=0)
    union = UnionClusterResolver(first, second)
    assert (union.task_type, union.task_id, union.rpc_layer) == ("worker", 1, "grpc")
    assert union.environment == "env"
    union.environment = "google"  # settable, as on every resolver; the first keeps its own
    assert (union.environment, first.environment) == ("google", "env")
    assert union.num_accelerators() == {"TPU": 8}
    assert union.master() == "grpc://m"
    assert union.master("ps", 0) == "grpc://p0"


def test_union_honours_explicit_task_id_zero():
    first = _simple({"worker": ["w0:1", "w1:1"]}, task_type="worker", task_id=1)
    union = UnionClusterResolver(first, task_id=0, task_type="worker", rpc_layer="http")
    assert union.task_id == 0
    assert union.rpc_layer == "http"
    assert union.jax_distributed_args()["process_id"] == 0
    union.task_id = 1
    assert union.task_id == 1


def test_union_argument_errors():
    with pytest.raises(ValueError, match="at least one"):
        UnionClusterResolver()
    with pytest.raises(TypeError, match=r"argument 1 .* got str"):
        UnionClusterResolver(_simple({}), "nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unexpected keyword arguments \\['colour'\\]"):
        UnionClusterResolver(_simple({}), colour="red")
