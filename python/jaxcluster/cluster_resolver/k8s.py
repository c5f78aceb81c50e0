"""KubernetesClusterResolver: the tasks of each job are the pods matching its label selectors.

TF 2.21 semantics (``tf.distribute.cluster_resolver.KubernetesClusterResolver``) with three
deliberate changes: inside a pod (``KUBERNETES_SERVICE_HOST`` set) the in-cluster service
account is used and elsewhere the kubeconfig; a task's address is the pod's own IP
(``status.pod_ip``), not its node's, unless ``use_host_ip=True``; and every API failure (403,
timeout, unreachable server, half-initialised pod) raises an error saying what to fix.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping, Sequence
from typing import Any

from jaxcluster.cluster_resolver._hints import did_you_mean, format_choices
from jaxcluster.cluster_resolver._k8s_api import PodInfo, PodLister
from jaxcluster.cluster_resolver.base import ClusterResolver, format_master_url
from jaxcluster.cluster_spec import ClusterSpec

__all__ = [
    "DEFAULT_JOB_TO_LABEL_MAPPING",
    "SERVICE_ACCOUNT_DIR",
    "ExecutableLocation",
    "KubernetesClusterResolver",
    "KubernetesExecutableLocation",
]

#: The job → selectors mapping used when none is given (TF's default).
DEFAULT_JOB_TO_LABEL_MAPPING: dict[str, list[str]] = {"worker": ["job-name=tensorflow"]}

#: Where Kubernetes mounts a pod's service-account ``token`` and ``ca.crt``. Pass
#: ``service_account_dir=`` to the resolver to read them from elsewhere (tests do).
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

_DEFAULT_TIMEOUT = 10.0


class KubernetesExecutableLocation(enum.Enum):
    """Where the program runs, which decides how the API server's credentials are found.

    ``WITHIN_CLUSTER`` (the default) uses the pod's service account when
    ``KUBERNETES_SERVICE_HOST`` is set and falls back to the kubeconfig otherwise;
    ``OFF_CLUSTER`` always uses the kubeconfig (``KUBECONFIG`` or ``~/.kube/config``).
    """

    WITHIN_CLUSTER = 0
    OFF_CLUSTER = 1


# TF's own name for the enum, in its kubernetes_cluster_resolver module.
ExecutableLocation = KubernetesExecutableLocation


def _check_mapping(mapping: Mapping[str, Any]) -> dict[str, list[str]]:
    if not isinstance(mapping, Mapping):
        raise TypeError(
            "job_to_label_mapping must be a dict of job name -> list of label selectors, "
            f"e.g. {{'worker': ['job-name=tensorflow']}}; got {type(mapping).__name__}: "
            f"{mapping!r}"
        )
    checked: dict[str, list[str]] = {}
    for job, selectors in mapping.items():
        if not isinstance(job, str) or not job:
            raise TypeError(f"job_to_label_mapping: job names must be non-empty str; got {job!r}")
        # A bare string is one selector; iterating it per character (as TF does) never works.
        if isinstance(selectors, str):
            selectors = [selectors]
        if not isinstance(selectors, Sequence) or not all(
            isinstance(s, str) and s.strip() for s in selectors
        ):
            raise TypeError(
                f"job_to_label_mapping[{job!r}] must be a list of non-empty label selector "
                f"strings such as 'job-name=tensorflow'; got {selectors!r}"
            )
        checked[job] = list(selectors)
    return checked


class KubernetesClusterResolver(ClusterResolver):
    """Cluster spec from the pods a Kubernetes API server lists for each job's label selectors.

    Each job's tasks are the pods matched by its selectors, selector by selector and, within
    one selector, sorted by pod name; each address is ``<pod IP>:<tf_server_port>``. Every
    matched pod must be ``Running``.

    Example::

        resolver = KubernetesClusterResolver(
            {"worker": ["app=trainer,role=worker"]}, tf_server_port=9000, namespace="ml"
        )
        resolver.cluster_spec().as_dict()   # {'worker': ['10.4.0.7:9000', '10.4.1.3:9000']}
        resolver.task_type, resolver.task_id = "worker", 0
        resolver.master()                   # 'grpc://10.4.0.7:9000'

    Keyword-only additions to TF's signature: ``namespace`` (default: all namespaces),
    ``use_host_ip``, ``timeout`` (seconds per API request), ``kubeconfig`` and ``context``
    (kubeconfig path and context; default ``KUBECONFIG`` / ``~/.kube/config`` and its
    current context), ``service_account_dir`` (default :data:`SERVICE_ACCOUNT_DIR`; the
    directory holding the in-cluster ``token`` and ``ca.crt``, which tests point at a
    temporary directory). Credentials are loaded when the resolver is made, into a private
    client configuration (the process-wide default is left alone); with ``override_client``
    nothing is loaded and that client is used as given.
    """

    def __init__(
        self,
        job_to_label_mapping: Mapping[str, Sequence[str]] | None = None,
        tf_server_port: int = 8470,
        rpc_layer: str | None = "grpc",
        override_client: Any = None,
        executable_location: KubernetesExecutableLocation = (
            KubernetesExecutableLocation.WITHIN_CLUSTER
        ),
        *,
        namespace: str | None = None,
        use_host_ip: bool = False,
        timeout: float = _DEFAULT_TIMEOUT,
        kubeconfig: str | os.PathLike[str] | None = None,
        context: str | None = None,
        service_account_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(executable_location, KubernetesExecutableLocation):
            raise ValueError(
                "executable_location must be KubernetesExecutableLocation.WITHIN_CLUSTER or "
                f"KubernetesExecutableLocation.OFF_CLUSTER; got {executable_location!r}"
            )
        if isinstance(tf_server_port, bool) or not isinstance(tf_server_port, int):
            raise TypeError(f"tf_server_port must be an int; got {tf_server_port!r}")
        if not 0 < tf_server_port < 65536:
            raise ValueError(f"tf_server_port must be in 1..65535; got {tf_server_port}")
        if namespace is not None and (not isinstance(namespace, str) or not namespace):
            raise ValueError(f"namespace must be a non-empty str or None; got {namespace!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds; got {timeout!r}")

        self._job_to_label_mapping = _check_mapping(
            job_to_label_mapping or DEFAULT_JOB_TO_LABEL_MAPPING
        )
        self._tf_server_port = tf_server_port
        self._override_client = override_client
        self._executable_location = executable_location
        self._namespace = namespace
        self._use_host_ip = bool(use_host_ip)
        self._lister = PodLister.create(
            override_client=override_client,
            in_cluster=(
                executable_location is KubernetesExecutableLocation.WITHIN_CLUSTER
                and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
            ),
            timeout=float(timeout),
            kubeconfig=kubeconfig,
            context=context,
            service_account_dir=service_account_dir or SERVICE_ACCOUNT_DIR,
        )
        self.task_type = None
        self.task_id = None
        self.rpc_layer = rpc_layer

    @property
    def config_source(self) -> str:
        """How the API server was found: ``'in-cluster'``, ``'kubeconfig'`` or ``'override'``."""
        return self._lister.source

    @property
    def api_server(self) -> str:
        """The API server's base URL (``''`` when an ``override_client`` hides it)."""
        return self._lister.host

    @property
    def namespace(self) -> str | None:
        """The namespace searched, or ``None`` for all namespaces."""
        return self._namespace

    @property
    def job_to_label_mapping(self) -> dict[str, list[str]]:
        """Each job's label selectors (a copy)."""
        return {job: list(selectors) for job, selectors in self._job_to_label_mapping.items()}

    def cluster_spec(self) -> ClusterSpec:
        """Lists the pods of every job now and returns their addresses.

        Raises ``RuntimeError`` naming the pod when a matched pod is not ``Running`` or has no
        IP yet, ``PermissionError`` when RBAC forbids listing pods, and
        :class:`~jaxcluster.errors.DeadlineExceededError` /
        :class:`~jaxcluster.errors.UnavailableError` when the API server is slow or
        unreachable.
        """
        return ClusterSpec(
            {job: [address for _, address in tasks] for job, tasks in self._tasks().items()}
        )

    def find_task(self, pod_name: str) -> tuple[str, int] | None:
        """``(job, task index)`` of the pod named ``pod_name`` now, or ``None`` if no
        selector matches it. Inside a pod, ``HOSTNAME`` is the pod's name.

        Example::

            resolver.task_type, resolver.task_id = resolver.find_task(os.environ["HOSTNAME"])
        """
        for job, tasks in self._tasks().items():
            for index, (pod, _) in enumerate(tasks):
                if pod.name == pod_name:
                    return job, index
        return None

    def _tasks(self) -> dict[str, list[tuple[PodInfo, str]]]:
        jobs: dict[str, list[tuple[PodInfo, str]]] = {}
        for job, selectors in self._job_to_label_mapping.items():
            tasks: list[tuple[PodInfo, str]] = []
            for selector in selectors:
                pods = self._lister.list(selector, self._namespace)
                # Sorted per selector, then selectors in order: TF's task order.
                for pod in sorted(pods, key=lambda p: p.name):
                    tasks.append((pod, self._address(pod, job, selector)))
            jobs[job] = tasks
        return jobs

    def _address(self, pod: PodInfo, job: str, selector: str) -> str:
        where = (
            f"pod {pod.name!r} in namespace {pod.namespace!r} (job {job!r}, selector {selector!r})"
        )
        if pod.phase != "Running":
            if pod.phase is None:
                raise RuntimeError(
                    f"The {where} has no status.phase yet; it is still being created."
                )
            # TF's sentence first: code (and TF's own test) matches it.
            raise RuntimeError(
                f'Pod "{pod.name}" is not running; phase: "{pod.phase}". The {where} is in '
                f"phase {pod.phase!r}, expected 'Running'. "
                "Every pod a selector matches must be running before the cluster can be "
                "resolved; wait for it, or narrow the selector."
            )
        ip = pod.host_ip if self._use_host_ip else pod.pod_ip
        field = "status.host_ip" if self._use_host_ip else "status.pod_ip"
        if not ip:
            raise RuntimeError(
                f"The {where} is Running but has no {field} yet; retry in a moment"
                + ("" if self._use_host_ip else ", or pass use_host_ip=True for the node's IP")
                + "."
            )
        host = f"[{ip}]" if ":" in ip else ip
        return f"{host}:{self._tf_server_port}"

    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """The address of ``task_type``/``task_id`` (default: this resolver's), or ``''``.

        Raises ``ValueError`` naming the job and its selectors when that task does not exist,
        e.g. because the selectors matched no pods.
        """
        task_type = task_type if task_type is not None else self.task_type
        task_id = task_id if task_id is not None else self.task_id
        if task_type is None or task_id is None:
            return ""
        spec = self.cluster_spec()
        if task_type not in spec.jobs:
            raise ValueError(
                f"task type {task_type!r} is not a job of this resolver (jobs: "
                f"{format_choices(spec.jobs)}){did_you_mean(task_type, spec.jobs)}; jobs "
                "come from job_to_label_mapping"
            )
        count = spec.num_tasks(task_type)
        if task_id not in spec.task_indices(task_type):
            selectors = self._job_to_label_mapping[task_type]
            scope = f"namespace {self._namespace!r}" if self._namespace else "all namespaces"
            found = "matched no pods" if count == 0 else f"matched {count} pod(s)"
            raise ValueError(
                f"No task {task_id} in job {task_type!r}: its label selectors {selectors} "
                f"{found} in {scope}"
                + (f" (valid task ids: 0..{count - 1})" if count else "")
                + ". Check the pods' labels, e.g. `kubectl get pods -l "
                + f"'{selectors[0]}'`."
            )
        return format_master_url(spec.task_address(task_type, task_id), rpc_layer or self.rpc_layer)

    def __repr__(self) -> str:
        return (
            f"KubernetesClusterResolver({self._job_to_label_mapping!r}, "
            f"tf_server_port={self._tf_server_port}, namespace={self._namespace!r}, "
            f"source={self.config_source!r})"
        )
