"""``SlurmClusterResolver``: the tasks of a Slurm job step (``srun``).

Slurm hands every task its rank (``SLURM_PROCID``), the step's nodes (``SLURM_STEP_NODELIST``)
and how many tasks run on each (``SLURM_STEP_TASKS_PER_NODE``). Ranks go to nodes the way
the step's ``--distribution`` (``SLURM_DISTRIBUTION``: block by default, cyclic or plane)
placed them; each node's tasks take consecutive ports from ``port_base`` in rank order, and
the layout is checked against where Slurm says this task runs (``SLURMD_NODENAME``,
``SLURM_LOCALID``, ``SLURM_GTIDS``). Ranks then go to jobs in sorted job-name order.

GPUs: when Slurm has bound GPUs to the task (``CUDA_VISIBLE_DEVICES``, ``SLURM_STEP_GPUS``
or ``SLURM_JOB_GPUS`` is set) a binding of ``gpus_per_task`` GPUs stands (as under
``srun --gpus-per-task``), and a node-wide one (``--gres=gpu:4`` with 4 tasks on the node:
each sees all 4) is split by the task's slot on the node, taking the bound ids (by default
into equal shares, as TF splits a node's GPUs); without a binding, as TF does, each task on
a node gets its own slice of the node's GPUs.

``jax_distributed_args`` puts the ``jax.distributed`` coordinator on the first task's node
at the port JAX itself derives from ``SLURM_JOB_ID``, so two jobs sharing a first node do
not collide.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from typing import Any

from jaxcluster.cluster_resolver._bridge import JAX_COORDINATOR_PORT_ENV
from jaxcluster.cluster_resolver._hostlist import expand_hostlist, expand_tasks_per_node
from jaxcluster.cluster_resolver._slurm_layout import (
    Distribution,
    check_placement,
    distribution_from_env,
    place,
)
from jaxcluster.cluster_resolver.base import ClusterResolver, format_master_url
from jaxcluster.cluster_spec import ClusterSpec

__all__ = [
    "CUDA_VISIBLE_DEVICES_ENV",
    "SLURM_JOB_GPUS_ENV",
    "SLURM_JOB_ID_ENV",
    "SLURM_PROCID_ENV",
    "SLURM_STEP_GPUS_ENV",
    "SLURM_STEP_NODELIST_ENV",
    "SLURM_STEP_NUM_TASKS_ENV",
    "SLURM_STEP_TASKS_PER_NODE_ENV",
    "SlurmClusterResolver",
    "expand_hostlist",
    "expand_tasks_per_node",
    "get_num_gpus",
    "jax_coordinator_port",
]

SLURM_PROCID_ENV = "SLURM_PROCID"
SLURM_STEP_NUM_TASKS_ENV = "SLURM_STEP_NUM_TASKS"
SLURM_STEP_NODELIST_ENV = "SLURM_STEP_NODELIST"
SLURM_STEP_TASKS_PER_NODE_ENV = "SLURM_STEP_TASKS_PER_NODE"
CUDA_VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
SLURM_STEP_GPUS_ENV = "SLURM_STEP_GPUS"
SLURM_JOB_GPUS_ENV = "SLURM_JOB_GPUS"
SLURM_JOB_ID_ENV = "SLURM_JOB_ID"
# Set by Slurm under --gpus-per-task (a binding per task), and to the node's GPU count
# whenever GPUs are allocated: together they tell a task's own binding from its node's.
SLURM_GPUS_PER_TASK_ENV = "SLURM_GPUS_PER_TASK"
SLURM_GPUS_ON_NODE_ENV = "SLURM_GPUS_ON_NODE"
# Where a GPU binding made before this process started shows, most specific first.
_GPU_BINDING_ENVS = (CUDA_VISIBLE_DEVICES_ENV, SLURM_STEP_GPUS_ENV, SLURM_JOB_GPUS_ENV)
# JAX's choice for Slurm jobs: one of the top 4096 ports, by job id.
_JAX_PORT_SPAN = 4096
_JAX_PORT_FIRST = 65536 - _JAX_PORT_SPAN

# nvidia-smi can hang on a wedged driver; a resolver must not.
_NVIDIA_SMI_TIMEOUT_S = 20.0


def _slurm_var(name: str) -> str:
    try:
        return os.environ[name]
    except KeyError:
        raise RuntimeError(
            f"{name} is not set; SlurmClusterResolver must run inside a Slurm job step "
            "(launched with srun), where Slurm sets it"
        ) from None


def _slurm_int(name: str) -> int:
    value = _slurm_var(name)
    if not value.strip().isdigit():
        raise ValueError(f"{name} is {value!r}; expected a non-negative integer")
    return int(value)


def _visible_ids(value: str) -> list[str]:
    # CUDA stops enumerating at the first entry it cannot use, so "0,-1,2" is one GPU and
    # "" (or Slurm's "NoDevFiles") is none.
    ids: list[str] = []
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry == "NoDevFiles" or entry.startswith("-"):
            break
        ids.append(entry)
    return ids


def _nvidia_smi_gpus() -> int:
    try:
        listing = subprocess.run(
            ["nvidia-smi", "--list-gpus"],
            capture_output=True,
            text=True,
            timeout=_NVIDIA_SMI_TIMEOUT_S,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0  # no binary, no driver, or no answer: no usable GPUs
    return sum(line.startswith("GPU ") for line in listing.splitlines())


def _node_wide(ids: list[str], tasks_on_node: int) -> bool:
    """Whether a GPU binding this task sees is its node's rather than its own: Slurm says
    nothing per task (``SLURM_GPUS_PER_TASK`` unset, as under ``--gres=gpu:N`` or
    ``--gpus-per-node``), the node's GPU count is what the task sees (``SLURM_GPUS_ON_NODE``,
    when set), and there are at least as many as the node has tasks."""
    if os.environ.get(SLURM_GPUS_PER_TASK_ENV) or tasks_on_node < 2 or len(ids) < tasks_on_node:
        return False
    on_node = os.environ.get(SLURM_GPUS_ON_NODE_ENV, "").strip()
    return not on_node.isdigit() or int(on_node) == len(ids)


def get_num_gpus() -> int:
    """GPUs on this node: from ``CUDA_VISIBLE_DEVICES`` if set (``''`` is zero), else the
    lines of ``nvidia-smi --list-gpus`` (zero when it is missing or fails)."""
    visible = os.environ.get(CUDA_VISIBLE_DEVICES_ENV)
    if visible is not None:
        return len(_visible_ids(visible))
    return _nvidia_smi_gpus()


def _gpu_binding() -> tuple[str, list[str]] | None:
    """``(variable, GPU ids it lets this task see)`` when GPUs were bound before we ran."""
    for name in _GPU_BINDING_ENVS:
        value = os.environ.get(name)
        if value is not None:
            return name, _visible_ids(value)
    return None


def jax_coordinator_port(job_id: int | str) -> int:
    """The port ``jax.distributed`` picks for Slurm job ``job_id`` (one of 61440..65535).

    Example::

        >>> jax_coordinator_port(5)
        61445
    """
    text = str(job_id).strip()
    if isinstance(job_id, bool) or not text.isdigit():
        raise ValueError(f"{SLURM_JOB_ID_ENV} is {job_id!r}; expected a non-negative integer")
    return int(text) % _JAX_PORT_SPAN + _JAX_PORT_FIRST


def _non_negative_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{what} is {value!r}; expected a non-negative integer")
    if isinstance(value, str) and not value.strip().isdigit():
        raise ValueError(f"{what} is {value!r}; expected a non-negative integer")
    number = int(value)
    if number < 0:
        raise ValueError(f"{what} is {value!r}; expected a non-negative integer")
    return number


class SlurmClusterResolver(ClusterResolver):
    """Tasks of the current Slurm step, with ports and GPUs assigned per node.

    Constructor arguments as ``tf.distribute.cluster_resolver.SlurmClusterResolver``. Unlike
    TF, ranks go to nodes in ``SLURM_STEP_NODELIST`` order (or ``tasks_per_node``'s order when
    it is a dict) rather than sorted by name, so ``n9,n10`` matches Slurm's own placement;
    ``--distribution=cyclic`` and ``plane=N`` steps are laid out as Slurm laid them out
    (``arbitrary`` is a ``ValueError``); GPUs Slurm bound to the task are left as they are
    when they are the task's own (``gpus_per_task`` of them, as under ``--gpus-per-task``),
    and split by the task's slot on the node when they are the node's: more than
    ``gpus_per_task``, or, with ``gpus_per_task`` not given, a binding Slurm made per node
    (``--gres=gpu:4`` with 4 tasks: every task sees all 4, ``SLURM_GPUS_PER_TASK`` is unset),
    which is shared out one slice per task as TF does; ``CUDA_VISIBLE_DEVICES=''`` means no
    GPUs and ``gpus_per_node=0`` is allowed.

    Example (inside ``srun -N2 --ntasks-per-node=2``)::

        r = SlurmClusterResolver(jobs={"ps": 1, "worker": 3}, port_base=8888)
        r.cluster_spec().as_dict()
        # {'ps': ['n1:8888'], 'worker': ['n1:8889', 'n2:8888', 'n2:8889']}
        r.task_type, r.task_id  # ('worker', 0) on rank 1
    """

    def __init__(
        self,
        jobs: Mapping[str, int] | None = None,
        port_base: int = 8888,
        gpus_per_node: int | None = None,
        gpus_per_task: int | None = None,
        tasks_per_node: int | Mapping[str, int] | None = None,
        auto_set_gpu: bool = True,
        rpc_layer: str | None = "grpc",
    ) -> None:
        super().__init__()
        self._rank = _slurm_int(SLURM_PROCID_ENV)
        if jobs is None:
            jobs = {"worker": _slurm_int(SLURM_STEP_NUM_TASKS_ENV)}
        if not isinstance(jobs, Mapping):
            raise TypeError(f"jobs must be a dict of job name -> task count; got {jobs!r}")
        self._jobs = {str(job): _non_negative_int(n, f"jobs[{job!r}]") for job, n in jobs.items()}
        self._port_base = _non_negative_int(port_base, "port_base")
        self._task_configuration = self._resolve_task_configuration(tasks_per_node)
        self._distribution = distribution_from_env()

        counts = list(self._task_configuration.values())
        max_tasks_per_node = max(counts)
        num_tasks = sum(counts)
        if self._port_base + max_tasks_per_node - 1 > 65535:
            raise ValueError(
                f"port_base {self._port_base} + {max_tasks_per_node} tasks on one node "
                "passes port 65535; expected a lower port_base"
            )
        self._gpu_binding = _gpu_binding()
        self._gpus_per_task_given = gpus_per_task is not None
        self._set_gpus(gpus_per_node, gpus_per_task, max_tasks_per_node)
        if sum(self._jobs.values()) != num_tasks:
            raise RuntimeError(
                f"jobs {self._jobs} need {sum(self._jobs.values())} tasks but the step has "
                f"{num_tasks} ({self._task_configuration}); make the job sizes add up to "
                "the number of Slurm tasks"
            )
        if self._rank >= num_tasks:
            raise ValueError(
                f"{SLURM_PROCID_ENV} is {self._rank}; expected a rank below the step's "
                f"{num_tasks} tasks"
            )
        self._layout = place(self._task_configuration, self._distribution)
        if tasks_per_node is None:  # the layout claims to be Slurm's: hold it to that
            check_placement(
                self._layout,
                self._rank,
                f"{SLURM_STEP_NODELIST_ENV}={os.environ[SLURM_STEP_NODELIST_ENV]!r}, "
                f"{SLURM_STEP_TASKS_PER_NODE_ENV}={os.environ[SLURM_STEP_TASKS_PER_NODE_ENV]!r}"
                f" and the {self._distribution} distribution",
            )
        self._bound_share = self._share_of_binding()
        self._auto_set_gpu = auto_set_gpu
        self._rpc_layer = rpc_layer
        self._task_type = None
        self._task_id = None

    def _set_gpus(
        self, gpus_per_node: int | None, gpus_per_task: int | None, max_tasks_per_node: int
    ) -> None:
        if self._gpu_binding is not None:
            # Slurm (or the launcher) already chose GPUs: by default this task's own.
            bound = len(self._gpu_binding[1])
            self._gpus_per_node = _non_negative_int(
                bound if gpus_per_node is None else gpus_per_node, "gpus_per_node"
            )
            self._gpus_per_task = _non_negative_int(
                bound if gpus_per_task is None else gpus_per_task, "gpus_per_task"
            )
            return
        if gpus_per_node is None:
            gpus_per_node = get_num_gpus()
        self._gpus_per_node = _non_negative_int(gpus_per_node, "gpus_per_node")
        if gpus_per_task is None:
            gpus_per_task = self._gpus_per_node // max(max_tasks_per_node, 1)
        self._gpus_per_task = _non_negative_int(gpus_per_task, "gpus_per_task")
        if max_tasks_per_node * self._gpus_per_task > self._gpus_per_node:
            # RuntimeError, as TF: the request does not fit the nodes Slurm gave us.
            raise RuntimeError(
                f"requested {self._gpus_per_task} GPUs per task for up to "
                f"{max_tasks_per_node} tasks on a node, but a node has {self._gpus_per_node} "
                "GPUs; lower gpus_per_task or tasks per node"
            )

    def _resolve_task_configuration(
        self, tasks_per_node: int | Mapping[str, int] | None
    ) -> dict[str, int]:
        if isinstance(tasks_per_node, Mapping):
            config = {
                str(host): _non_negative_int(n, f"tasks_per_node[{host!r}]")
                for host, n in tasks_per_node.items()
            }
        else:
            raw = _slurm_var(SLURM_STEP_NODELIST_ENV)
            hosts = expand_hostlist(raw)
            if len(set(hosts)) != len(hosts):
                raise ValueError(
                    f"{SLURM_STEP_NODELIST_ENV} is {raw!r}, which names a host twice; "
                    "expected each node once"
                )
            if tasks_per_node is None:
                raw_counts = _slurm_var(SLURM_STEP_TASKS_PER_NODE_ENV)
                counts = expand_tasks_per_node(raw_counts)
                if len(counts) != len(hosts):
                    raise ValueError(
                        f"{SLURM_STEP_TASKS_PER_NODE_ENV} is {raw_counts!r} ({len(counts)} "
                        f"nodes) but {SLURM_STEP_NODELIST_ENV} is {raw!r} ({len(hosts)} "
                        "nodes); expected one task count per node"
                    )
            else:
                per_node = _non_negative_int(tasks_per_node, "tasks_per_node")
                counts = [per_node] * len(hosts)
            config = dict(zip(hosts, counts, strict=True))
        if not config or not any(config.values()):
            raise ValueError(
                f"the step has no tasks (tasks per node: {config}); expected at least one"
            )
        return config

    def _share_of_binding(self) -> list[str] | None:
        """This task's GPU ids out of a binding made before it ran, when they must change:
        ``None`` when there is no binding or it holds exactly ``gpus_per_task`` GPUs (it
        stands), else the slice of the bound ids at the task's slot on its node (a node-wide
        binding such as ``--gres=gpu:4 --ntasks-per-node=4``, where every task sees all 4)."""
        if self._gpu_binding is None:
            return None
        name, ids = self._gpu_binding
        host, slot = self._layout[self._rank]
        on_node = self._task_configuration[host]
        if not self._gpus_per_task_given and _node_wide(ids, on_node):
            # As TF: the node's GPUs shared out among its tasks (one each under --gres=gpu:4
            # with 4 tasks), instead of every task taking all of them.
            self._gpus_per_task = len(ids) // on_node
        per_task = self._gpus_per_task
        if len(ids) == per_task:
            return None
        if on_node * per_task > len(ids):
            # RuntimeError, as the unbound request that does not fit a node.
            raise RuntimeError(
                f"{name}={os.environ.get(name)!r} binds {len(ids)} GPU(s) to this task, "
                f"too few to give each of the {on_node} tasks on node {host!r} "
                f"gpus_per_task={per_task}; lower gpus_per_task (or pass "
                f"gpus_per_task={len(ids)} to keep the binding) or bind more GPUs"
            )
        return ids[slot * per_task : (slot + 1) * per_task]

    @property
    def distribution(self) -> Distribution:
        """How this step's ranks were placed on its nodes (from ``SLURM_DISTRIBUTION``)."""
        return self._distribution

    @property
    def gpu_binding(self) -> str | None:
        """The variable through which GPUs were bound to this task before it started
        (``CUDA_VISIBLE_DEVICES``, ``SLURM_STEP_GPUS`` or ``SLURM_JOB_GPUS``), or ``None``
        when the resolver assigns them."""
        return None if self._gpu_binding is None else self._gpu_binding[0]

    def _allocate(self) -> tuple[dict[str, list[str]], dict[int, tuple[str, int]]]:
        """Jobs' addresses and each rank's (job, index)."""
        addresses = [f"{host}:{self._port_base + local}" for host, local in self._layout]
        jobs: dict[str, list[str]] = {}
        tasks: dict[int, tuple[str, int]] = {}
        start = 0
        for job, count in sorted(self._jobs.items()):
            jobs[job] = addresses[start : start + count]
            tasks.update({start + i: (job, i) for i in range(count)})
            start += count
        return jobs, tasks

    def _own_gpus(self) -> str:
        """TF's share of the node's GPUs for this rank: a slice by its slot on the node."""
        first = self._layout[self._rank][1] * self._gpus_per_task
        return ",".join(str(g) for g in range(first, first + self._gpus_per_task))

    def cluster_spec(self) -> ClusterSpec:
        """The step's jobs; also sets ``CUDA_VISIBLE_DEVICES`` when ``auto_set_gpu`` and
        Slurm has not bound this task's own GPUs (none bound, or bound node-wide)."""
        jobs, _ = self._allocate()
        if self._auto_set_gpu and self._gpu_binding is None:
            os.environ[CUDA_VISIBLE_DEVICES_ENV] = self._own_gpus()
        elif self._auto_set_gpu and self._bound_share is not None:
            os.environ[CUDA_VISIBLE_DEVICES_ENV] = ",".join(self._bound_share)
        return ClusterSpec(jobs)

    @property
    def task_type(self) -> str | None:
        """The job this rank belongs to (unless set explicitly)."""
        if self._task_type is not None:
            return self._task_type
        return self._allocate()[1][self._rank][0]

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        """This rank's index within its job (unless set explicitly)."""
        if self._task_id is not None:
            return self._task_id
        return self._allocate()[1][self._rank][1]

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    def get_task_info(self) -> tuple[str | None, int | None]:
        """``(task_type, task_id)`` of this rank."""
        return self.task_type, self.task_id

    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """The task's address as a master URL (this rank's task by default)."""
        task_type = task_type if task_type is not None else self.task_type
        task_id = task_id if task_id is not None else self.task_id
        if task_type is None or task_id is None:
            return ""
        address = self.cluster_spec().task_address(task_type, task_id)
        return format_master_url(address, rpc_layer or self.rpc_layer)

    def num_accelerators(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        config_proto: Any = None,
    ) -> dict[str, int]:
        """``{'GPU': n}``: ``gpus_per_task``, by default the GPUs Slurm bound to this task
        (as TF, every task gets the same share)."""
        del task_type, task_id, config_proto
        return {"GPU": self._gpus_per_task}

    def jax_distributed_args(self, coordinator_port: int | str | None = None) -> dict[str, Any]:
        """As :meth:`ClusterResolver.jax_distributed_args`, with JAX's own port for Slurm:
        ``SLURM_JOB_ID % 4096 + 61440`` on the first task's node, unless ``coordinator_port``
        or ``JAX_COORDINATOR_PORT`` says otherwise (so two jobs sharing a node never bind
        the same coordinator port, and a job agrees with ``jax.distributed`` detecting Slurm
        itself).
        """
        job_id = os.environ.get(SLURM_JOB_ID_ENV, "").strip()
        if coordinator_port is None and not os.environ.get(JAX_COORDINATOR_PORT_ENV) and job_id:
            coordinator_port = jax_coordinator_port(job_id)
        return super().jax_distributed_args(coordinator_port)
