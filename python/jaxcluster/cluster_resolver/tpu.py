"""TPUClusterResolver: the workers of a Cloud TPU, from its name, a grpc:// list, or this VM.

TF 2.21 semantics (``tf.distribute.cluster_resolver.TPUClusterResolver``) with deliberate
changes: the Cloud TPU REST API is called directly through google-auth (v2 by default, v1 and
v2alpha1 available; ``api_endpoint=`` points it anywhere); both node shapes are understood
(``networkEndpoints`` and the legacy ``ipAddress``/``port``); on a multi-host TPU VM
``tpu='local'`` reads the slice from the VM's metadata; giving only one of
``coordinator_name``/``coordinator_address`` is an error; ``with`` works; every network step
has a timeout and an error that says what to check.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from jaxcluster.cluster_resolver._bridge import distributed_args
from jaxcluster.cluster_resolver._google import DEFAULT_API_TIMEOUT, positive_timeout
from jaxcluster.cluster_resolver._tpu_api import (
    API_VERSIONS,
    TpuNodeApi,
    api_root,
    node_endpoints,
)
from jaxcluster.cluster_resolver._tpu_api import node_topology as _node_topology
from jaxcluster.cluster_resolver._tpu_devices import (
    DeviceInfo,
    TPUSystemMetadata,
    call_lister,
    check_lister,
    core_counts,
    list_devices_over_grpc,
    local_jax_devices,
)
from jaxcluster.cluster_resolver._tpu_metadata import (
    MetadataServer,
    TpuVm,
    is_running_in_gce,
    might_be_tpu_vm,
    read_tpu_vm,
)
from jaxcluster.cluster_resolver._tpu_names import resolve_target
from jaxcluster.cluster_resolver._tpu_topology import (
    TPUHardwareFeature,
    TPUTopology,
    parse_topology,
)
from jaxcluster.cluster_resolver.base import ClusterResolver, format_master_url
from jaxcluster.cluster_spec import ClusterSpec

__all__ = [
    "DeviceInfo",
    "TPUClusterResolver",
    "TPUHardwareFeature",
    "TPUSystemMetadata",
    "TPUTopology",
    "is_running_in_gce",
]

_NO_METADATA_ADVICE = (
    "Off a GCE or Cloud TPU VM, pass project= and zone= to TPUClusterResolver (or set "
    "TPU_CONFIG), or point GCE_METADATA_HOST at a metadata server."
)


@dataclass(frozen=True)
class _Snapshot:
    """One resolution: worker addresses in task order, and what else was learnt with them."""

    workers: list[str]
    topology: str | None


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _text(value: object, name: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string or None; got {value!r}")
    return value.strip()


class _Connect:
    """``resolver.connect()``, and TF's static form ``TPUClusterResolver.connect(tpu, zone,
    project)`` that builds a resolver first."""

    def __get__(
        self, obj: TPUClusterResolver | None, objtype: type[TPUClusterResolver] | None = None
    ) -> Callable[..., TPUClusterResolver]:
        if obj is not None:
            return obj._connect
        assert objtype is not None
        cls = objtype

        def connect(
            tpu: Any = None, zone: str | None = None, project: str | None = None, **kwargs: Any
        ) -> TPUClusterResolver:
            return cls(tpu, zone, project, **kwargs)._connect()

        connect.__doc__ = TPUClusterResolver._connect.__doc__
        return connect


class TPUClusterResolver(ClusterResolver):
    """The workers of one Cloud TPU as a cluster spec with a single job (``job_name``).

    ``tpu`` is a Cloud TPU node name (looked up in the Cloud TPU API), ``'grpc://ip[:port],...'``
    (no API; port 8470 by default), ``'local'`` (the chips attached to this VM), or ``None``
    to read ``KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS``, ``TPU_NAME`` or ``TPU_CONFIG``. Project and zone
    default to this VM's, from the GCE metadata server.

    Example::

        resolver = TPUClusterResolver(tpu="my-pod", zone="us-central2-b", project="my-proj")
        resolver.cluster_spec().as_dict()  # {'worker': ['10.130.0.2:8470', '10.130.0.3:8470']}
        resolver.master()                  # 'grpc://10.130.0.2:8470'

        with TPUClusterResolver(tpu="local").connect() as r:   # on each host of a TPU VM slice
            ...                                                # jax.distributed is initialised

    ``credentials``: ``'default'`` (or ``None``) for Application Default Credentials, or any
    ``google.auth.credentials.Credentials`` (``AnonymousCredentials()`` for a local test
    server). ``service``: a googleapiclient discovery client for Cloud TPU (as TF; its
    ``projects().locations().nodes().get(name=...)`` is called and ``execute()``-d), or a
    ``requests.Session`` (e.g. an ``AuthorizedSession``) to make the REST calls with;
    anything else is a ``TypeError``. ``discovery_url`` / ``TPU_API_DISCOVERY_URL``: the API
    root is read from it. Keyword-only: ``api_version`` (``'v2'``, ``'v1'``, ``'v2alpha1'``),
    ``api_endpoint`` (API root URL, wins over the discovery URL), ``device_lister`` (a callable
    returning ``(name, device_type)`` pairs, used by :meth:`num_accelerators` and
    :meth:`get_tpu_system_metadata`), ``timeout`` (seconds per API request, default 30; the
    metadata server's is ``GCE_METADATA_TIMEOUT``, default 3).
    """

    connect = _Connect()

    def __init__(
        self,
        tpu: Any = None,
        zone: str | None = None,
        project: str | None = None,
        job_name: str = "worker",
        coordinator_name: str | None = None,
        coordinator_address: str | None = None,
        credentials: Any = "default",
        service: Any = None,
        discovery_url: str | None = None,
        *,
        api_version: str = "v2",
        api_endpoint: str | None = None,
        device_lister: Callable[[], Iterable[tuple[str, str]]] | None = None,
        timeout: float | None = None,
    ) -> None:
        if bool(coordinator_name) != bool(coordinator_address):
            given, missing = (
                ("coordinator_name", "coordinator_address")
                if coordinator_name
                else ("coordinator_address", "coordinator_name")
            )
            raise ValueError(
                f"{given} is set ({coordinator_name or coordinator_address!r}) but {missing} is "
                f"not; pass both (e.g. coordinator_name='coordinator', "
                "coordinator_address='10.0.0.9:8470') or neither"
            )
        if not isinstance(job_name, str) or not job_name:
            raise ValueError(f"job_name must be a non-empty string; got {job_name!r}")
        if api_version not in API_VERSIONS:
            raise ValueError(
                f"api_version is {api_version!r}; expected one of {', '.join(API_VERSIONS)}"
            )
        self._job_name = job_name
        self._coordinator_name = _text(coordinator_name, "coordinator_name")
        self._coordinator_address = _text(coordinator_address, "coordinator_address")
        self._device_lister = check_lister(device_lister)
        self._timeout = DEFAULT_API_TIMEOUT if timeout is None else positive_timeout(timeout)
        self._target = resolve_target(tpu)
        self._tpu = self._target.name
        self._api: TpuNodeApi | None = None
        self._project: str | None = None
        self._zone: str | None = None
        self._local_vm_cache: tuple[TpuVm | None] | None = None
        self._distributed_started = False
        self._tpu_topology: TPUTopology | None = None
        self.task_type = job_name
        self.rpc_layer = "grpc"

        if self._target.kind == "node":
            self._project = _text(project, "project") or self._target.project
            self._zone = _text(zone, "zone") or self._target.zone
            root, _source = api_root(api_endpoint, discovery_url)
            # Built (and service= checked) before any metadata call, so a bad argument is
            # reported as such rather than as an unreachable metadata server.
            self._api = TpuNodeApi(
                root=root,
                api_version=api_version,
                credentials=credentials,
                service=service,
                timeout=self._timeout,
            )
            if self._project is None or self._zone is None:
                md = MetadataServer()
                if self._project is None:
                    self._project = md.project_id(otherwise=_NO_METADATA_ADVICE)
                if self._zone is None:
                    self._zone = md.zone(otherwise=_NO_METADATA_ADVICE)

    # -- resolution ---------------------------------------------------------------------------
    def _local_vm(self, refresh: bool = False) -> TpuVm | None:
        """This TPU VM's slice, or ``None`` off a TPU VM (decided without network when
        nothing suggests one)."""
        if self._local_vm_cache is None or refresh:
            vm = read_tpu_vm(MetadataServer()) if might_be_tpu_vm() else None
            self._local_vm_cache = (vm,)
        return self._local_vm_cache[0]

    def _resolve(self) -> _Snapshot:
        kind = self._target.kind
        if kind == "local":
            vm = self._local_vm(refresh=True)
            # A single host needs no cluster, as in TF: empty spec, master ''.
            workers = vm.addresses() if vm is not None and len(vm.hosts) > 1 else []
            return _Snapshot(workers, vm.topology if vm is not None else None)
        if kind == "grpc":
            return _Snapshot([_address(h, p) for h, p in self._target.endpoints], None)
        assert self._api is not None and self._project and self._zone
        node = self._api.get_node(self._project, self._zone, self._tpu)
        endpoints = node_endpoints(node, self._tpu)
        return _Snapshot([_address(h, p) for h, p in endpoints], _node_topology(node))

    def _job(self) -> str:
        return self.task_type or self._job_name

    def cluster_spec(self) -> ClusterSpec:
        """The TPU's workers now: ``{job_name: [ip:port, ...]}``, plus ``{coordinator_name:
        [coordinator_address]}`` when given; empty for ``tpu='local'`` on a single host.

        ``RuntimeError`` when the node is not ``READY``; ``ValueError`` naming the node when the
        API lookup fails.
        """
        workers = self._resolve().workers
        if not workers:
            return ClusterSpec({})
        spec: dict[str, list[str]] = {self._job(): workers}
        if self._coordinator_name and self._coordinator_address:
            spec[self._coordinator_name] = [self._coordinator_address]
        return ClusterSpec(spec)

    def slices(self) -> list[list[str]]:
        """The TPU's hosts as one multi-host slice (a TPU node is one ``jax.distributed``
        group), for ``ClusterCoordinator``, which schedules a closure onto all of a slice's
        hosts at once; empty when the cluster spec is. Several TPUs are several slices:
        ``UnionClusterResolver(TPUClusterResolver("a"), TPUClusterResolver("b"))``."""
        if self._job() != "worker":
            return []
        workers = self._resolve().workers
        return [workers] if workers else []

    @property
    def task_id(self) -> int | None:
        """This host's task index: as set, else ``agent-worker-number`` for ``tpu='local'`` on
        a multi-host TPU VM, else 0 (TF's default)."""
        if self._task_id is not None:
            return self._task_id
        if self._target.kind == "local":
            vm = self._local_vm()
            if vm is not None:
                return vm.worker_id
        return 0

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """``grpc://ip:port`` of a task (by default this resolver's), ``''`` for ``tpu='local'``
        on a single host."""
        spec = self.cluster_spec()
        if not spec:
            return ""
        task_type = task_type if task_type is not None else self.task_type
        task_id = task_id if task_id is not None else self.task_id
        if task_type is not None and task_id is not None:
            address = spec.task_address(task_type, task_id)
        else:
            first = spec.job_tasks(self._job())[:1]
            if not first or first[0] is None:
                raise ValueError(f"the TPU {self._tpu!r} has no workers in job {self._job()!r}")
            address = first[0]
        return format_master_url(address, rpc_layer or self.rpc_layer or "grpc")

    def get_master(self) -> str:
        """Same as :meth:`master` with no arguments."""
        return self.master()

    def get_job_name(self) -> str | None:
        """The job the TPU workers are in (``task_type``)."""
        return self.task_type

    def get_coordination_service_leader(self) -> str:
        """Where the coordination service runs: ``/job:<job>/task:0``, the first TPU worker
        (also the ``jax.distributed`` coordinator :meth:`jax_distributed_args` picks)."""
        return f"/job:{self.get_job_name()}/task:0"

    # -- topology, as TF's TPU system initialisation reports it --------------------------------
    def set_tpu_topology(self, serialized_tpu_topology: bytes) -> None:
        """Stores the TPU topology: a serialized ``tensorflow.tpu.TopologyProto`` (what TF's
        ``initialize_tpu_system`` produces). ``ValueError`` when the bytes are not one."""
        self._tpu_topology = parse_topology(serialized_tpu_topology)

    @property
    def tpu_hardware_feature(self) -> TPUHardwareFeature | None:
        """The stored topology's hardware features (embedding accelerator), or ``None`` before
        :meth:`set_tpu_topology`."""
        return None if self._tpu_topology is None else self._tpu_topology.tpu_hardware_feature

    # -- devices ------------------------------------------------------------------------------
    def _list_devices(self, task_type: str | None, task_id: int | None) -> list[DeviceInfo]:
        if self._device_lister is not None:
            return call_lister(self._device_lister)
        if self._target.kind == "local":
            return local_jax_devices(self._job())
        return list_devices_over_grpc(self.master(task_type, task_id), self._timeout)

    def num_accelerators(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        config_proto: Any = None,
    ) -> collections.defaultdict[str, int]:
        """``{'TPU': cores per host}``; ``RuntimeError`` when hosts differ in core count."""
        del config_proto
        _map, _total, per_host = core_counts(self._list_devices(task_type, task_id))
        return collections.defaultdict(int, {"TPU": per_host})

    def get_tpu_system_metadata(self) -> TPUSystemMetadata:
        """Cores, hosts, cores per host, topology and devices of this TPU.

        ``RuntimeError`` when no TPU core is listed or the hosts differ in core count.
        """
        devices = self._list_devices(None, None)
        device_map, total, per_host = core_counts(devices)
        if total == 0:
            listed = ", ".join(f"{d.name} ({d.device_type})" for d in devices) or "none"
            raise RuntimeError(
                f"no TPU cores found for TPU {self._tpu!r}; devices listed: {listed}. Check "
                "the TPU name and that its workers are up."
            )
        return TPUSystemMetadata(
            num_cores=total,
            num_hosts=len(device_map),
            num_of_cores_per_host=per_host,
            topology=self._resolve().topology,
            devices=devices,
        )

    # -- JAX ----------------------------------------------------------------------------------
    def _process_index(self, workers: list[str]) -> int:
        if self._task_id is not None or len(workers) == 1 or self._target.kind == "local":
            task_id = self.task_id
            return 0 if task_id is None else task_id
        # Every host running the same program with task_id=0 would all claim process 0; find
        # this host among the workers by its own IP instead.
        if might_be_tpu_vm():
            own = (
                MetadataServer()
                .get("instance/network-interfaces/0/ip", what="which TPU host this process runs on")
                .strip()
            )
            for index, address in enumerate(workers):
                if address.rsplit(":", 1)[0].strip("[]") == own:
                    return index
        raise ValueError(
            f"cannot tell which of the {len(workers)} hosts of TPU {self._tpu!r} "
            f"({', '.join(workers)}) this process runs on; set resolver.task_id to its index"
        )

    def jax_distributed_args(self, coordinator_port: int | str | None = None) -> dict[str, Any]:
        """``jax.distributed.initialize`` arguments: one process per TPU host (the coordinator
        job, a TF client, is not a JAX process), coordinator = the first host."""
        job = self._job()
        spec = self.cluster_spec()
        workers = [w for w in spec.job_tasks(job) if w] if job in spec.jobs else []
        if not workers:
            raise ValueError(
                f"TPU {self._tpu!r} has no multi-host cluster to initialise (cluster spec "
                f"{spec.as_dict()!r}); a single host needs no jax.distributed"
            )
        process = self._process_index(workers)
        return distributed_args(ClusterSpec({job: workers}), job, process, coordinator_port)

    def _connect(self) -> TPUClusterResolver:
        """Resolves the TPU and, for a multi-host slice, initialises ``jax.distributed``
        (coordinator on the first host); returns the resolver."""
        spec = self.cluster_spec()
        job = self._job()
        if spec and job in spec.jobs and spec.num_tasks(job) > 1:
            import jax

            if not jax.distributed.is_initialized():
                jax.distributed.initialize(**self.jax_distributed_args())
                self._distributed_started = True
        return self

    def __enter__(self) -> TPUClusterResolver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._distributed_started:
            import jax

            self._distributed_started = False
            jax.distributed.shutdown()
