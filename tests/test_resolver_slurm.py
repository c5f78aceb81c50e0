"""SlurmClusterResolver and the Slurm list parsers."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxcluster.cluster_resolver import (
    SlurmClusterResolver,
    expand_hostlist,
    expand_tasks_per_node,
)
from jaxcluster.cluster_resolver.slurm import get_num_gpus


@pytest.mark.parametrize(
    ("hostlist", "expected"),
    [
        ("n[01-03,7],m5", ["n01", "n02", "n03", "n7", "m5"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[008-010]", ["n008", "n009", "n010"]),
        (
            "n[1-2].cluster.local,login.cluster.local",
            ["n1.cluster.local", "n2.cluster.local", "login.cluster.local"],
        ),
        ("r[1-2]n[3-4]", ["r1n3", "r1n4", "r2n3", "r2n4"]),
        ("n9,n10,n1", ["n9", "n10", "n1"]),
        ("[3,1]", ["3", "1"]),
        ("single", ["single"]),
        ("", []),
    ],
)
def test_expand_hostlist(hostlist, expected):
    assert expand_hostlist(hostlist) == expected


@pytest.mark.parametrize(
    ("hostlist", "fragment"),
    [
        ("n[1-", "never closed"),
        ("n1]", "no matching"),
        ("n[[1]]", "nested"),
        ("n[]", "empty brackets"),
        ("n[a-b]", "'a-b'"),
        ("n[3-1]", "backwards"),
        ("n[1-2-3]", "'1-2-3'"),
        ("a,,b", "empty host name"),
        ("a,", "trailing comma"),
        (",a", "empty host name"),
        ("a b", "' '"),
        ("n[1-99999999999999999999999]", "too large"),
        ("n[0-1000000]", "more than 1,000,000"),
        ("a[0-999]b[0-1000]", "more than 1,000,000"),
        ("x" * 100 + "[0-999999]", "more than 67,108,864 characters"),
    ],
)
def test_expand_hostlist_rejects_bad_input(hostlist, fragment):
    with pytest.raises(ValueError, match="invalid Slurm hostlist") as info:
        expand_hostlist(hostlist)
    assert fragment in str(info.value)


def test_expand_hostlist_builds_exactly_the_limit():
    hosts = expand_hostlist("a[0-999]b[000-999]")
    assert len(hosts) == 1_000_000
    assert (hosts[0], hosts[-1]) == ("a0b000", "a999b999")


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet="n0123456789[]-,.x()", max_size=40)))
def test_any_string_gives_a_list_or_value_error(text):
    for parse in (expand_hostlist, expand_tasks_per_node):
        try:
            result = parse(text)
        except ValueError:
            continue
        assert isinstance(result, list)
        assert len(result) <= 1_000_000


@given(st.integers(0, 10**17), st.integers(1_000_000, 10**17))
def test_huge_ranges_are_rejected_without_expanding(start, width):
    with pytest.raises(ValueError, match="more than 1,000,000"):
        expand_hostlist(f"n[{start}-{start + width}]")
    with pytest.raises(ValueError, match="more than 1,000,000"):
        expand_tasks_per_node(f"1(x{width + 1})")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("3(x2),2,1", [3, 3, 2, 1]), ("4", [4]), ("1(x3)", [1, 1, 1]), ("0,2", [0, 2])],
)
def test_expand_tasks_per_node(text, expected):
    assert expand_tasks_per_node(text) == expected


@pytest.mark.parametrize("text", ["", "a", "2(x)", "2(x0)", "2x3", "1,,2", "-1", "2(x2", " 1"])
def test_expand_tasks_per_node_rejects_bad_input(text):
    with pytest.raises(ValueError, match="invalid Slurm tasks-per-node list"):
        expand_tasks_per_node(text)


_PLACEMENT_AND_GPU_VARIABLES = (
    "SLURM_DISTRIBUTION",
    "SLURM_DIST_PLANESIZE",
    "SLURMD_NODENAME",
    "SLURM_LOCALID",
    "SLURM_GTIDS",
    "SLURM_JOB_ID",
    "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS",
    "JAX_COORDINATOR_PORT",
)


def _slurm(monkeypatch, *, rank, nodes, per_node, num_tasks, gpus=None):
    for name in _PLACEMENT_AND_GPU_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_PROCID", str(rank))
    monkeypatch.setenv("SLURM_STEP_NODELIST", nodes)
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", per_node)
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", str(num_tasks))
    if gpus is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus)


def test_ranks_follow_nodelist_order_not_name_order(monkeypatch):
    _slurm(monkeypatch, rank=2, nodes="n9,n10", per_node="2(x2)", num_tasks=4)
    resolver = SlurmClusterResolver(port_base=9000)
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["n9:9000", "n9:9001", "n10:9000", "n10:9001"]
    }
    assert (resolver.task_type, resolver.task_id) == ("worker", 2)
    assert resolver.master() == "grpc://n10:9000"
    assert resolver.get_task_info() == ("worker", 2)


def test_gpus_split_per_task_and_written_to_environment(monkeypatch):
    # No binding from Slurm: TF's formula splits the node's GPUs by the task's slot.
    _slurm(monkeypatch, rank=3, nodes="n[1-2]", per_node="2(x2)", num_tasks=4)
    resolver = SlurmClusterResolver(gpus_per_node=4)
    assert resolver.gpu_binding is None
    assert resolver.num_accelerators() == {"GPU": 2}
    resolver.cluster_spec()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    SlurmClusterResolver(gpus_per_node=4, auto_set_gpu=False).cluster_spec()
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_jobs_take_ranks_in_sorted_name_order(monkeypatch):
    _slurm(monkeypatch, rank=1, nodes="b,a", per_node="2,1", num_tasks=3, gpus="")
    resolver = SlurmClusterResolver(jobs={"worker": 2, "ps": 1}, port_base=7000)
    assert resolver.cluster_spec().as_dict() == {"ps": ["b:7000"], "worker": ["b:7001", "a:7000"]}
    assert (resolver.task_type, resolver.task_id) == ("worker", 0)
    assert resolver.jax_distributed_args() == {
        "coordinator_address": "b:7000",
        "num_processes": 3,
        "process_id": 1,
    }
    resolver.task_type, resolver.task_id = "ps", 0
    assert resolver.master() == "grpc://b:7000"


def test_tasks_per_node_dict_order_and_int(monkeypatch):
    _slurm(monkeypatch, rank=0, nodes="x", per_node="9", num_tasks=3, gpus="")
    resolver = SlurmClusterResolver(tasks_per_node={"z": 1, "a": 2}, rpc_layer=None)
    assert resolver.cluster_spec().as_dict() == {"worker": ["z:8888", "a:8888", "a:8889"]}
    assert resolver.master() == "z:8888"
    _slurm(monkeypatch, rank=3, nodes="n[1-2]", per_node="9", num_tasks=4, gpus="")
    resolver = SlurmClusterResolver(tasks_per_node=2)
    assert resolver.cluster_spec().task_address("worker", 3) == "n2:8889"


def test_zero_gpus(monkeypatch):
    _slurm(monkeypatch, rank=1, nodes="n1", per_node="2", num_tasks=2, gpus="")
    resolver = SlurmClusterResolver()
    assert resolver.num_accelerators() == {"GPU": 0}
    resolver.cluster_spec()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    _slurm(monkeypatch, rank=1, nodes="n1", per_node="2", num_tasks=2)
    resolver = SlurmClusterResolver(gpus_per_node=0)
    assert resolver.num_accelerators() == {"GPU": 0}
    resolver.cluster_spec()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize(
    ("value", "count"),
    [("", 0), ("0", 1), ("0,1,2", 3), ("GPU-a1,GPU-b2", 2), ("0,-1,2", 1), ("NoDevFiles", 0)],
)
def test_cuda_visible_devices_count(monkeypatch, value, count):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert get_num_gpus() == count


def _fake_nvidia_smi(directory, body):
    script = directory / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_nvidia_smi_fallback(monkeypatch, tmp_path):
    listing = "".join(f"echo 'GPU {i}: Fake GPU (UUID: GPU-{i})'\n" for i in range(3))
    _fake_nvidia_smi(tmp_path, listing)
    monkeypatch.setenv("PATH", str(tmp_path))
    _slurm(monkeypatch, rank=0, nodes="n1", per_node="3", num_tasks=3, gpus=None)
    assert get_num_gpus() == 3
    assert SlurmClusterResolver().num_accelerators() == {"GPU": 1}


def test_nvidia_smi_absent_or_failing_means_zero(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert get_num_gpus() == 0
    _fake_nvidia_smi(tmp_path, "echo 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert get_num_gpus() == 0


_BAD_ENVIRONMENTS = [
    ({"SLURM_PROCID": None}, RuntimeError, "SLURM_PROCID is not set"),
    ({"SLURM_PROCID": "one"}, ValueError, "SLURM_PROCID is 'one'"),
    ({"SLURM_PROCID": "5"}, ValueError, "SLURM_PROCID is 5"),
    ({"SLURM_STEP_NUM_TASKS": None}, RuntimeError, "SLURM_STEP_NUM_TASKS is not set"),
    ({"SLURM_STEP_NUM_TASKS": "4x"}, ValueError, "SLURM_STEP_NUM_TASKS is '4x'"),
    ({"SLURM_STEP_NUM_TASKS": "3"}, RuntimeError, "need 3 tasks but the step has 4"),
    ({"SLURM_STEP_NODELIST": None}, RuntimeError, "SLURM_STEP_NODELIST is not set"),
    ({"SLURM_STEP_NODELIST": "n[1-"}, ValueError, "invalid Slurm hostlist 'n\\[1-'"),
    ({"SLURM_STEP_NODELIST": "n1,n1"}, ValueError, "SLURM_STEP_NODELIST is 'n1,n1'"),
    ({"SLURM_STEP_NODELIST": "n[1-3]"}, ValueError, "SLURM_STEP_TASKS_PER_NODE is '2\\(x2\\)'"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x"}, ValueError, "tasks-per-node list '2\\(x'"),
    ({"SLURM_STEP_TASKS_PER_NODE": None}, RuntimeError, "SLURM_STEP_TASKS_PER_NODE is not set"),
]


@pytest.mark.parametrize(("changes", "error", "fragment"), _BAD_ENVIRONMENTS)
def test_bad_slurm_environment_names_the_variable(monkeypatch, changes, error, fragment):
    _slurm(monkeypatch, rank=0, nodes="n[1-2]", per_node="2(x2)", num_tasks=4)
    for name, value in changes.items():
        if value is None:
            monkeypatch.delenv(name)
        else:
            monkeypatch.setenv(name, value)
    with pytest.raises(error, match=fragment):
        SlurmClusterResolver()


def test_more_gpus_than_a_node_has_is_a_runtime_error_as_in_tf(monkeypatch):
    _slurm(monkeypatch, rank=0, nodes="n[1-2]", per_node="2(x2)", num_tasks=4)
    with pytest.raises(RuntimeError, match="requested 3 GPUs per task"):
        SlurmClusterResolver(gpus_per_node=4, gpus_per_task=3)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"gpus_per_node": -1}, "gpus_per_node is -1"),
        ({"port_base": 65535}, "passes port 65535"),
        ({"port_base": "http"}, "port_base is 'http'"),
        ({"tasks_per_node": {"a": 0}}, "no tasks"),
        ({"jobs": {"worker": "many"}}, "jobs\\['worker'\\] is 'many'"),
    ],
)
def test_bad_arguments(monkeypatch, kwargs, fragment):
    _slurm(monkeypatch, rank=0, nodes="n[1-2]", per_node="2(x2)", num_tasks=4)
    with pytest.raises(ValueError, match=fragment):
        SlurmClusterResolver(**kwargs)
