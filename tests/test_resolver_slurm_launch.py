"""What the Slurm resolver takes from the launcher: the step's distribution, Slurm's GPU
binding, the jax.distributed port of the job, and Open MPI ranks inside an allocation.

The environments below are the ones a real Slurm 22.05 gave (tests/real runs the same
layouts on a real cluster); here they pin the rules without one.
"""

from __future__ import annotations

import inspect
import os

import pytest

from jaxcluster.cluster_resolver import SlurmClusterResolver, explain, resolve
from jaxcluster.cluster_resolver._slurm_layout import Distribution, place
from jaxcluster.cluster_resolver.slurm import jax_coordinator_port

_CLEARED = (
    "SLURM_DISTRIBUTION",
    "SLURM_DIST_PLANESIZE",
    "SLURMD_NODENAME",
    "SLURM_LOCALID",
    "SLURM_GTIDS",
    "SLURM_JOB_ID",
    "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS",
    "SLURM_GPUS_PER_TASK",
    "SLURM_GPUS_ON_NODE",
    "CUDA_VISIBLE_DEVICES",
    "JAX_COORDINATOR_PORT",
    "TF_CONFIG",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_MCA_orte_hnp_uri",
    "JAXCLUSTER_ENVIRONMENT",
    "JAXCLUSTER_WORKERS",
)


def _step(monkeypatch: pytest.MonkeyPatch, rank: int, nodes: str, per_node: str, **extra: str):
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    num_tasks = sum(
        int(c.split("(x")[0]) * (int(c.split("(x")[1][:-1]) if "(x" in c else 1)
        for c in per_node.split(",")
    )
    monkeypatch.setenv("SLURM_PROCID", str(rank))
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", str(num_tasks))
    monkeypatch.setenv("SLURM_STEP_NODELIST", nodes)
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", per_node)
    for name, value in extra.items():
        monkeypatch.setenv(name, value)


# (srun -m, tasks per node, where Slurm 22.05 put ranks 0..n-1): srun -N3 -n8 -O -m ...
_REAL_LAYOUTS = [
    ("block", "3(x2),2", ["n1", "n1", "n1", "n2", "n2", "n2", "n3", "n3"]),
    ("cyclic", "3(x2),2", ["n1", "n2", "n3", "n1", "n2", "n3", "n1", "n2"]),
    ("cyclic:cyclic", "2(x2),1", ["n1", "n2", "n3", "n1", "n2"]),
    ("plane", "3(x2),2", ["n1", "n1", "n2", "n2", "n3", "n3", "n1", "n2"]),  # plane=2
    ("plane", "4,3,1", ["n1", "n1", "n1", "n2", "n2", "n2", "n3", "n1"]),  # plane=3
]


@pytest.mark.parametrize(("method", "per_node", "nodes_by_rank"), _REAL_LAYOUTS)
def test_distributions_place_ranks_where_slurm_did(
    monkeypatch: pytest.MonkeyPatch, method: str, per_node: str, nodes_by_rank: list[str]
) -> None:
    plane = "3" if per_node == "4,3,1" else "2"
    for rank, node in enumerate(nodes_by_rank):
        on_node = [r for r, n in enumerate(nodes_by_rank) if n == node]
        _step(
            monkeypatch,
            rank,
            "n[1-3]",
            per_node,
            SLURM_DISTRIBUTION=method,
            SLURM_DIST_PLANESIZE=plane,
            SLURMD_NODENAME=node,
            SLURM_LOCALID=str(on_node.index(rank)),
            SLURM_GTIDS=",".join(map(str, on_node)),
        )
        resolver = SlurmClusterResolver(port_base=9000)
        workers = resolver.cluster_spec().as_dict()["worker"]
        assert workers[rank] == f"{node}:{9000 + on_node.index(rank)}"
        assert [w.split(":")[0] for w in workers] == nodes_by_rank
        assert len(set(workers)) == len(workers)  # no two tasks share an address


def test_place_cyclic_skips_full_nodes_and_plane_takes_chunks() -> None:
    assert place({"a": 1, "b": 3}, Distribution("cyclic")) == [
        ("a", 0),
        ("b", 0),
        ("b", 1),
        ("b", 2),
    ]
    assert place({"a": 3, "b": 2}, Distribution("plane", 2)) == [
        ("a", 0),
        ("a", 1),
        ("b", 0),
        ("b", 1),
        ("a", 2),
    ]


def test_arbitrary_distribution_is_refused_naming_the_option(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _step(monkeypatch, 0, "n[1-2]", "1,2", SLURM_DISTRIBUTION="arbitrary")
    with pytest.raises(ValueError, match="--distribution=arbitrary") as info:
        SlurmClusterResolver()
    assert "SLURM_DISTRIBUTION is 'arbitrary'" in str(info.value)
    report = explain(environment="slurm")
    assert report.error is not None and "--distribution=arbitrary" in report.error


@pytest.mark.parametrize(
    ("value", "planesize", "fragment"),
    [
        ("spiral", None, "node-level method 'spiral'"),
        ("plane", None, "SLURM_DIST_PLANESIZE is not set"),
        ("plane", "0", "SLURM_DIST_PLANESIZE is '0'"),
        ("cyclic=2", None, "node-level method 'cyclic=2'"),
    ],
)
def test_unknown_distributions_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str, planesize: str | None, fragment: str
) -> None:
    _step(monkeypatch, 0, "n[1-2]", "2(x2)", SLURM_DISTRIBUTION=value)
    if planesize is not None:
        monkeypatch.setenv("SLURM_DIST_PLANESIZE", planesize)
    with pytest.raises(ValueError, match=fragment):
        SlurmClusterResolver()


def test_distribution_suffixes_and_default_mean_block(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("block:cyclic,Pack", "*:cyclic", "plane=2"):
        _step(monkeypatch, 2, "n[1-2]", "2(x2)", SLURM_DISTRIBUTION=value)
        assert SlurmClusterResolver().cluster_spec().task_address("worker", 2) == "n2:8888"


def test_a_layout_slurm_contradicts_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Cyclic placement, but SLURM_DISTRIBUTION is missing (e.g. set through a partition
    # default): the task's own view of its node exposes the mismatch.
    _step(
        monkeypatch,
        1,
        "n[1-2]",
        "2(x2)",
        SLURMD_NODENAME="n2",
        SLURM_LOCALID="0",
        SLURM_GTIDS="1,3",
    )
    with pytest.raises(ValueError, match="Slurm placed task 1 differently") as info:
        SlurmClusterResolver()
    message = str(info.value)
    assert "SLURMD_NODENAME=n2" in message and "node n1" in message
    assert "SLURM_GTIDS=1,3" in message and "ranks 0,1 on that node" in message
    # An explicit tasks_per_node is the caller's layout, not a claim about Slurm's.
    assert SlurmClusterResolver(tasks_per_node=2).task_id == 1


def test_slurm_gpu_binding_wins_over_the_tf_split(monkeypatch: pytest.MonkeyPatch) -> None:
    # srun -N2 -n4 --gpus-per-task=1: Slurm gives rank 1 GPU 1 on n1.
    _step(
        monkeypatch,
        1,
        "n[1-2]",
        "2(x2)",
        CUDA_VISIBLE_DEVICES="1",
        SLURM_STEP_GPUS="1",
    )
    resolver = SlurmClusterResolver()
    resolver.cluster_spec()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert resolver.num_accelerators() == {"GPU": 1}
    assert resolver.gpu_binding == "CUDA_VISIBLE_DEVICES"
    # Only Slurm's list: still Slurm's decision, never overwritten with the TF split.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    resolver = SlurmClusterResolver(gpus_per_node=4)
    resolver.cluster_spec()
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert resolver.gpu_binding == "SLURM_STEP_GPUS"
    assert resolver.num_accelerators() == {"GPU": 1}


@pytest.mark.parametrize(
    ("rank", "node", "bound", "per_task", "own"),
    [
        # srun -N1 -n4 --gres=gpu:4: every task sees all 4; gpus_per_task=1 gives one each.
        (2, "n1", "0,1,2,3", 1, "2"),
        # The bound ids are split, not 0..n: GPUs 4-7 of a node, 2 per task.
        (3, "n2", "4,5,6,7", 2, "6,7"),
        (0, "n1", "GPU-a,GPU-b,GPU-c,GPU-d", 2, "GPU-a,GPU-b"),
    ],
)
def test_a_node_wide_binding_is_split_by_the_tasks_slot(
    monkeypatch: pytest.MonkeyPatch, rank: int, node: str, bound: str, per_task: int, own: str
) -> None:
    nodes, per_node = ("n1", "4") if per_task == 1 else ("n[1-2]", "2(x2)")
    slot = rank % int(per_node[0])
    _step(
        monkeypatch,
        rank,
        nodes,
        per_node,
        CUDA_VISIBLE_DEVICES=bound,
        SLURMD_NODENAME=node,
        SLURM_LOCALID=str(slot),
    )
    resolver = SlurmClusterResolver(gpus_per_task=per_task)
    assert resolver.num_accelerators() == {"GPU": per_task}
    resolver.cluster_spec()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == own
    # Slurm's own list only (CUDA_VISIBLE_DEVICES unset): the same share of its ids.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("SLURM_STEP_GPUS", bound)
    SlurmClusterResolver(gpus_per_task=per_task).cluster_spec()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == own
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    SlurmClusterResolver(gpus_per_task=per_task, auto_set_gpu=False).cluster_spec()
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_a_binding_of_gpus_per_task_gpus_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    # srun -n4 --gpus-per-task=2: Slurm gave rank 1 GPUs 2 and 3; nothing to split.
    _step(monkeypatch, 1, "n1", "4", CUDA_VISIBLE_DEVICES="2,3", SLURM_LOCALID="1")
    resolver = SlurmClusterResolver(gpus_per_task=2)
    resolver.cluster_spec()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert resolver.num_accelerators() == {"GPU": 2}


@pytest.mark.parametrize(("bound", "per_task"), [("0,1,2", 1), ("0,1,2,3", 2), ("", 1)])
def test_a_binding_too_small_for_the_nodes_tasks_names_the_values(
    monkeypatch: pytest.MonkeyPatch, bound: str, per_task: int
) -> None:
    _step(monkeypatch, 0, "n1", "4", CUDA_VISIBLE_DEVICES=bound)
    with pytest.raises(RuntimeError) as raised:
        SlurmClusterResolver(gpus_per_task=per_task)
    message = str(raised.value)
    assert f"CUDA_VISIBLE_DEVICES={bound!r}" in message
    assert "4 tasks on node 'n1'" in message
    assert f"gpus_per_task={per_task}" in message


@pytest.mark.parametrize(
    ("job_id", "nodes"),
    [("1", "n[1-2]"), ("4095", "gpu[009-012],login1"), ("4096", "a,b"), ("987654", "solo")],
)
def test_coordinator_port_is_the_one_jax_derives(
    monkeypatch: pytest.MonkeyPatch, job_id: str, nodes: str
) -> None:
    from jax._src.clusters import SlurmCluster

    per_node = {"n[1-2]": "1(x2)", "gpu[009-012],login1": "1(x5)", "a,b": "1(x2)"}
    _step(monkeypatch, 0, nodes, per_node.get(nodes, "1"), SLURM_JOB_ID=job_id)
    monkeypatch.setenv("SLURM_NTASKS", os.environ["SLURM_STEP_NUM_TASKS"])
    monkeypatch.setenv("SLURM_LOCALID", "0")
    args = SlurmClusterResolver().jax_distributed_args()
    # JAX 0.6 takes (timeout_secs); newer versions add override_coordinator_port.
    arity = len(inspect.signature(SlurmCluster.get_coordinator_address).parameters)
    assert args["coordinator_address"] == SlurmCluster.get_coordinator_address(*[None] * arity)
    assert args["coordinator_address"].endswith(f":{jax_coordinator_port(job_id)}")


def test_coordinator_port_overrides_win(monkeypatch: pytest.MonkeyPatch) -> None:
    _step(monkeypatch, 1, "n[1-2]", "1(x2)", SLURM_JOB_ID="77")
    resolver = SlurmClusterResolver()
    assert resolver.jax_distributed_args(coordinator_port=7000)["coordinator_address"] == (
        "n1:7000"
    )
    monkeypatch.setenv("JAX_COORDINATOR_PORT", "7001")
    assert resolver.jax_distributed_args()["coordinator_address"] == "n1:7001"
    monkeypatch.delenv("JAX_COORDINATOR_PORT")
    monkeypatch.delenv("SLURM_JOB_ID")  # no job id: the first task's own address
    assert resolver.jax_distributed_args()["coordinator_address"] == "n1:8888"
    assert jax_coordinator_port(4096 * 3 + 5) == 61445
    with pytest.raises(ValueError, match="SLURM_JOB_ID is 'x1'"):
        jax_coordinator_port("x1")


def test_mpirun_inside_sbatch_is_open_mpi_not_the_launcher_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What a rank of `mpirun -n 4` in `sbatch -N2 --ntasks-per-node=2` sees (Slurm 22.05,
    # Open MPI 4.1.4): its orted's step (2 tasks) and Open MPI's world (4 ranks).
    _step(monkeypatch, 1, "n[1-2]", "1(x2)", SLURM_JOB_ID="5", SLURMD_NODENAME="n2")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "2076508160.0;tcp://127.0.0.1:50973")
    args = resolve().jax_distributed_args()
    assert (args["num_processes"], args["process_id"]) == (4, 3)
    report = explain()
    assert report.environment == "ompi"
    slurm = next(c for c in report.checks if c.name == "slurm")
    assert not slurm.detected and "Open MPI rank inside a Slurm allocation" in slurm.reason


def test_explain_names_public_classes_and_real_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "4096.0;tcp://127.0.0.1:50973")
    text = str(explain())
    assert "resolver SimpleClusterResolver" in text
    assert explain().as_dict()["resolver"] == "SimpleClusterResolver"
    assert "_ProcessGroupResolver" not in text and "default of rpc_layer" not in text
    assert "rpc_layer='grpc' from default 'grpc'" in text
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE")
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK")
    monkeypatch.delenv("OMPI_MCA_orte_hnp_uri")
    _step(monkeypatch, 0, "n1", "1")
    text = str(explain(environment="slurm"))
    assert "rpc_layer='grpc' from the SlurmClusterResolver default" in text


@pytest.mark.parametrize(
    ("env", "rank", "own"),
    [
        # srun -n4 --gres=gpu:4: every task sees all 4 and Slurm says nothing per task.
        ({}, 2, "2"),
        ({"SLURM_GPUS_ON_NODE": "4"}, 3, "3"),
        # 8 GPUs for 4 tasks on the node: two each, of the bound ids.
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, 1, "2,3"),
    ],
)
def test_a_node_wide_binding_is_shared_out_by_default(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], rank: int, own: str
) -> None:
    _step(monkeypatch, rank, "n1", "4", SLURM_LOCALID=str(rank), CUDA_VISIBLE_DEVICES="0,1,2,3")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    resolver = SlurmClusterResolver()
    resolver.cluster_spec()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == own
    assert resolver.num_accelerators() == {"GPU": len(own.split(","))}


@pytest.mark.parametrize(
    "env",
    [
        # --gpus-per-task=4: Slurm says the binding is this task's own.
        {"SLURM_GPUS_PER_TASK": "4"},
        # The node has 16 GPUs; the 4 this task sees are its share already.
        {"SLURM_GPUS_ON_NODE": "16"},
    ],
)
def test_a_binding_slurm_made_per_task_stands_by_default(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    _step(monkeypatch, 1, "n1", "4", SLURM_LOCALID="1", CUDA_VISIBLE_DEVICES="4,5,6,7", **env)
    resolver = SlurmClusterResolver()
    resolver.cluster_spec()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert resolver.num_accelerators() == {"GPU": 4}
