"""Cluster environments found from environment variables alone: TF_CONFIG, Slurm, SageMaker,
Open MPI and jaxcluster's own ``JAXCLUSTER_*`` variables.

The cloud ones (Kubernetes, GKE TPU, GCE TPU VM) are in ``_cloud_environments``; the order
they are tried in is ``detect.ENVIRONMENTS``.
"""

from __future__ import annotations

import functools
import json
import os
import re
from typing import Any

from jaxcluster.cluster_resolver._bridge import JAX_COORDINATOR_PORT_ENV, distributed_args
from jaxcluster.cluster_resolver._env_base import (
    Built,
    Detection,
    Environment,
    construct,
    env_int,
    parse_addresses,
)
from jaxcluster.cluster_resolver.simple import SimpleClusterResolver
from jaxcluster.cluster_spec import ClusterSpec

__all__ = [
    "ExplicitEnvironment",
    "OpenMPIEnvironment",
    "SageMakerEnvironment",
    "SlurmEnvironment",
    "TFConfigEnvironment",
]

WORKERS_ENV = "JAXCLUSTER_WORKERS"
PS_ENV = "JAXCLUSTER_PS"
TASK_TYPE_ENV = "JAXCLUSTER_TASK_TYPE"
TASK_ID_ENV = "JAXCLUSTER_TASK_ID"
COORDINATOR_ENV = "JAX_COORDINATOR_ADDRESS"
# Open MPI's own spelling; set by mpirun/mpiexec only.
ORTE_URI_ENV = "OMPI_MCA_orte_hnp_uri"


def _missing(names: tuple[str, ...]) -> list[str]:
    return [n for n in names if not os.environ.get(n, "").strip()]


class TFConfigEnvironment(Environment):
    """``TF_CONFIG`` with a ``cluster``: TFConfigClusterResolver."""

    name = "tf_config"
    title = "TF_CONFIG"

    def detect(self) -> Detection:
        raw = os.environ.get("TF_CONFIG", "")
        if not raw.strip():
            return Detection(False, "TF_CONFIG is not set")
        try:
            config = json.loads(raw)
        except ValueError:
            # Present but broken: building reports exactly what is wrong, which beats
            # silently falling through to another environment.
            return Detection(True, "TF_CONFIG is set (but is not valid JSON)")
        cluster = config.get("cluster") if isinstance(config, dict) else None
        if not cluster:
            return Detection(False, "TF_CONFIG is set but has no 'cluster', so no cluster")
        jobs = ", ".join(cluster) if isinstance(cluster, dict) else repr(cluster)
        return Detection(True, f"TF_CONFIG is set with jobs: {jobs}")

    def build(self, **overrides: Any) -> Built:
        from jaxcluster.cluster_resolver.tfconfig import TFConfigClusterResolver, load_tf_config

        config = load_tf_config()
        raw_task = config.get("task")
        task: dict[str, Any] = raw_task if isinstance(raw_task, dict) else {}
        sources = {
            "cluster": "TF_CONFIG cluster",
            "task_type": "TF_CONFIG task.type" if "type" in task else "TF_CONFIG (no task.type)",
            "task_id": "TF_CONFIG task.index" if "index" in task else "TF_CONFIG (no task.index)",
            "rpc_layer": (
                "TF_CONFIG rpc_layer" if "rpc_layer" in config else "TF_CONFIG (no rpc_layer)"
            ),
        }
        return construct(self, TFConfigClusterResolver, {}, overrides, sources)


def _ompi_launcher() -> str:
    """How Open MPI's mpirun shows in this process's environment, or ``''``."""
    if os.environ.get(ORTE_URI_ENV, "").strip():
        return f"{ORTE_URI_ENV} is set (started by mpirun)"
    if not _missing(("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")):
        return "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE are set (started by mpirun)"
    return ""


class SlurmEnvironment(Environment):
    """An ``srun`` job step: SlurmClusterResolver."""

    name = "slurm"
    title = "Slurm"
    required = (
        "SLURM_PROCID",
        "SLURM_STEP_NUM_TASKS",
        "SLURM_STEP_NODELIST",
        "SLURM_STEP_TASKS_PER_NODE",
    )

    def detect(self) -> Detection:
        missing = _missing(self.required)
        launcher = _ompi_launcher()
        if not missing and launcher:
            # mpirun inside an allocation starts its ranks through srun, one launcher daemon
            # per node: the step these variables describe is the daemons', not the ranks'.
            return Detection(
                False,
                f"SLURM_PROCID and the step variables are set, but {launcher}: this process "
                "is an Open MPI rank inside a Slurm allocation, so the ompi environment "
                "describes it (as in JAX)",
            )
        if not missing:
            return Detection(
                True,
                f"SLURM_PROCID={os.environ['SLURM_PROCID']} in a job step of "
                f"{os.environ['SLURM_STEP_NUM_TASKS']} tasks on "
                f"{os.environ['SLURM_STEP_NODELIST']}",
            )
        if os.environ.get("SLURM_JOB_ID"):
            return Detection(
                False,
                f"inside Slurm job {os.environ['SLURM_JOB_ID']} but not in a job step "
                f"({', '.join(missing)} unset); launch the program with srun",
            )
        return Detection(False, f"{missing[0]} is not set")

    def build(self, **overrides: Any) -> Built:
        from jaxcluster.cluster_resolver.slurm import SlurmClusterResolver

        rank = os.environ.get("SLURM_PROCID")
        distribution = os.environ.get("SLURM_DISTRIBUTION")
        placed = (
            f"placed by SLURM_DISTRIBUTION={distribution!r}"
            if distribution
            else "placed block by block (SLURM_DISTRIBUTION unset)"
        )
        sources = {
            "cluster": (
                f"SLURM_STEP_NODELIST={os.environ.get('SLURM_STEP_NODELIST')!r} and "
                f"SLURM_STEP_TASKS_PER_NODE={os.environ.get('SLURM_STEP_TASKS_PER_NODE')!r}, "
                f"{placed}, ports from port_base"
            ),
            "task_type": f"SLURM_PROCID={rank} (ranks fill jobs in sorted name order)",
            "task_id": f"SLURM_PROCID={rank}",
        }
        job_id = os.environ.get("SLURM_JOB_ID", "").strip()
        if job_id and not os.environ.get(JAX_COORDINATOR_PORT_ENV):
            sources["jax_distributed_args"] = (
                f"cluster_spec and task; coordinator port from SLURM_JOB_ID={job_id} as "
                "jax.distributed derives it (job id % 4096 + 61440)"
            )
        return construct(self, SlurmClusterResolver, {}, overrides, sources)


class SageMakerEnvironment(Environment):
    """An Amazon SageMaker training job: SageMakerClusterResolver."""

    name = "sagemaker"
    title = "SageMaker"

    def detect(self) -> Detection:
        missing = _missing(("SM_HOSTS", "SM_CURRENT_HOST"))
        if missing:
            return Detection(False, f"{' and '.join(missing)} not set")
        return Detection(
            True,
            f"SM_HOSTS={os.environ['SM_HOSTS']}, SM_CURRENT_HOST={os.environ['SM_CURRENT_HOST']}",
        )

    def build(self, **overrides: Any) -> Built:
        from jaxcluster.cluster_resolver.sagemaker import SageMakerClusterResolver

        current = os.environ.get("SM_CURRENT_HOST")
        sources = {
            "cluster": "SM_HOSTS (sorted), one worker per host",
            "task_type": "SageMaker: every host is a worker",
            "task_id": f"position of SM_CURRENT_HOST={current!r} in sorted SM_HOSTS",
        }
        return construct(self, SageMakerClusterResolver, {}, overrides, sources)


def _explicit_cluster() -> tuple[dict[str, list[str]], str]:
    jobs = {"worker": parse_addresses(WORKERS_ENV, os.environ.get(WORKERS_ENV, ""))}
    source = WORKERS_ENV
    if os.environ.get(PS_ENV, "").strip():
        jobs["ps"] = parse_addresses(PS_ENV, os.environ[PS_ENV])
        source += f" and {PS_ENV}"
    return jobs, source


class ExplicitEnvironment(Environment):
    """``JAXCLUSTER_WORKERS=host:port,...`` (and ``JAXCLUSTER_PS``, ``JAXCLUSTER_TASK_TYPE``,
    ``JAXCLUSTER_TASK_ID``): a SimpleClusterResolver."""

    name = "explicit"
    title = "explicit JAXCLUSTER_* variables"

    def detect(self) -> Detection:
        if _missing((WORKERS_ENV,)):
            return Detection(False, f"{WORKERS_ENV} is not set")
        return Detection(True, f"{WORKERS_ENV}={os.environ[WORKERS_ENV]}")

    def build(self, **overrides: Any) -> Built:
        jobs, source = _explicit_cluster()
        task_type = os.environ.get(TASK_TYPE_ENV, "").strip() or "worker"
        sources = {
            "cluster": source,
            "task_type": TASK_TYPE_ENV
            if os.environ.get(TASK_TYPE_ENV, "").strip()
            else (f"default 'worker' ({TASK_TYPE_ENV} unset)"),
            "task_id": TASK_ID_ENV,
            "rpc_layer": "default 'grpc'",
        }
        task_id: int | None = None
        if os.environ.get(TASK_ID_ENV, "").strip():
            task_id = env_int(TASK_ID_ENV)
        elif "task_id" not in overrides:
            sources["task_id"] = f"unknown ({TASK_ID_ENV} unset)"
        if "task_type" not in overrides and task_type not in jobs:
            raise ValueError(
                f"{TASK_TYPE_ENV} is {task_type!r}; expected one of the jobs {', '.join(jobs)}"
            )
        defaults = {
            "cluster_spec": ClusterSpec(jobs),
            "task_type": task_type,
            "task_id": task_id,
            "rpc_layer": "grpc",
        }
        return construct(self, SimpleClusterResolver, defaults, overrides, sources)


class _ProcessGroupResolver(SimpleClusterResolver):
    """Open MPI without a worker list: only rank 0 (the coordinator) has a known address.

    The cluster spec is honest about that (a sparse job holding task 0 only), while
    :meth:`jax_distributed_args` still knows the group size from ``OMPI_COMM_WORLD_SIZE``.
    """

    def __init__(
        self,
        coordinator: str,
        num_processes: int,
        master: str = "",
        task_type: str | None = None,
        task_id: int | None = None,
        environment: str = "",
        num_accelerators: dict[str, int] | None = None,
        rpc_layer: str | None = None,
    ) -> None:
        super().__init__(
            ClusterSpec({"worker": {0: coordinator}}),
            master=master,
            task_type=task_type,
            task_id=task_id,
            environment=environment,
            num_accelerators=num_accelerators,
            rpc_layer=rpc_layer,
        )
        self._num_processes = num_processes

    def jax_distributed_args(self, coordinator_port: int | str | None = None) -> dict[str, Any]:
        # Coordinator as rank 0 would compute it (port override rules included).
        args = distributed_args(self.cluster_spec(), "worker", 0, coordinator_port)
        process_id = self.task_id if self.task_id is not None else 0
        if not 0 <= int(process_id) < self._num_processes:
            raise ValueError(
                f"task_id {process_id!r} is not a rank of this Open MPI job of "
                f"{self._num_processes} processes"
            )
        return {**args, "num_processes": self._num_processes, "process_id": int(process_id)}


_ORTE_HOST = re.compile(r"tcp://([^,:/]+)|tcp6://\[([^,\]]+)")


def _coordinator_from_orte(uri: str) -> str:
    """Launcher host from ``OMPI_MCA_orte_hnp_uri`` and a port every rank derives alike."""
    match = _ORTE_HOST.search(uri)
    job_id = uri.split(".", 1)[0]
    if match is None or not job_id.isdigit():
        raise ValueError(
            f"OMPI_MCA_orte_hnp_uri is {uri!r}; expected '<jobid>.<vpid>;tcp://<ip>[,...]:<port>'"
        )
    host = match.group(1) or f"[{match.group(2)}]"
    # Open MPI job ids are multiples of 2**12; spread jobs over the top 4096 ports so two
    # jobs on one launcher rarely collide (the same choice jax makes, so both agree).
    port = (int(job_id) >> 12) % 4096 + 61440
    return f"{host}:{port}"


class OpenMPIEnvironment(Environment):
    """Processes launched by Open MPI's ``mpirun``: a SimpleClusterResolver."""

    name = "ompi"
    title = "Open MPI"

    def detect(self) -> Detection:
        missing = _missing(("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"))
        if missing:
            return Detection(False, f"{' and '.join(missing)} not set")
        return Detection(
            True,
            f"OMPI_COMM_WORLD_RANK={os.environ['OMPI_COMM_WORLD_RANK']} of "
            f"OMPI_COMM_WORLD_SIZE={os.environ['OMPI_COMM_WORLD_SIZE']}",
        )

    def build(self, **overrides: Any) -> Built:
        size = env_int("OMPI_COMM_WORLD_SIZE", minimum=1)
        rank = env_int("OMPI_COMM_WORLD_RANK")
        if rank >= size:
            raise ValueError(f"OMPI_COMM_WORLD_RANK is {rank}; expected below {size}")
        sources = {
            "task_type": "Open MPI: every rank is a worker",
            "task_id": "OMPI_COMM_WORLD_RANK",
            "rpc_layer": "default 'grpc'",
        }
        defaults: dict[str, Any] = {"task_type": "worker", "task_id": rank, "rpc_layer": "grpc"}
        if os.environ.get(WORKERS_ENV, "").strip():
            jobs, sources["cluster"] = _explicit_cluster()
            if len(jobs["worker"]) != size:
                raise ValueError(
                    f"{WORKERS_ENV} lists {len(jobs['worker'])} workers but "
                    f"OMPI_COMM_WORLD_SIZE is {size}; expected one address per rank"
                )
            defaults["cluster_spec"] = ClusterSpec(jobs)
            return construct(self, SimpleClusterResolver, defaults, overrides, sources)
        if os.environ.get(COORDINATOR_ENV, "").strip():
            coordinator = parse_addresses(COORDINATOR_ENV, os.environ[COORDINATOR_ENV])[0]
            origin = COORDINATOR_ENV
        elif os.environ.get(ORTE_URI_ENV, "").strip():
            coordinator = _coordinator_from_orte(os.environ[ORTE_URI_ENV])
            origin = "the mpirun launcher in OMPI_MCA_orte_hnp_uri (port from its job id)"
        else:
            raise ValueError(
                f"Open MPI rank {rank} of {size}, but no address to coordinate on: set "
                f"{WORKERS_ENV}=host:port,... (one per rank) or {COORDINATOR_ENV}=host:port, "
                "or launch with mpirun (which sets OMPI_MCA_orte_hnp_uri)"
            )
        sources["cluster"] = (
            f"rank 0 only, at {coordinator} from {origin}; other ranks' addresses are unknown "
            f"(set {WORKERS_ENV} to list them)"
        )
        factory = functools.partial(_ProcessGroupResolver, coordinator, size)
        return construct(self, factory, defaults, overrides, sources, name="SimpleClusterResolver")
