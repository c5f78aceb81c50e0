"""Cluster environments of cloud platforms: Kubernetes, GKE TPU slices and Cloud TPU VMs.

Detection stays local (environment variables, ``/sys`` and ``/dev``); only ``build`` may talk
to an API server or the metadata server.
"""

from __future__ import annotations

import glob
import json
import os
import socket
from pathlib import Path
from typing import Any

from jaxcluster.cluster_resolver._env_base import (
    Built,
    Detection,
    Environment,
    construct,
    env_int,
    parse_addresses,
)
from jaxcluster.cluster_resolver._environments import TASK_ID_ENV, TASK_TYPE_ENV
from jaxcluster.cluster_resolver.simple import SimpleClusterResolver
from jaxcluster.cluster_spec import ClusterSpec

__all__ = ["GceTpuVmEnvironment", "GkeTpuEnvironment", "KubernetesEnvironment"]

K8S_SELECTOR_ENV = "JAXCLUSTER_K8S_SELECTOR"
K8S_JOBS_ENV = "JAXCLUSTER_K8S_JOBS"
K8S_NAMESPACE_ENV = "JAXCLUSTER_K8S_NAMESPACE"
K8S_PORT_ENV = "JAXCLUSTER_K8S_PORT"

#: Port of each host in a GKE TPU slice's worker job; the same one TPUClusterResolver gives a
#: TPU VM's hosts, so both ways of finding a slice agree. ``port=`` overrides it.
TPU_WORKER_PORT = 8470


class KubernetesEnvironment(Environment):
    """A pod that opted in with ``JAXCLUSTER_K8S_SELECTOR`` (the worker job's label selector)
    or ``JAXCLUSTER_K8S_JOBS`` (JSON job -> selectors): KubernetesClusterResolver.

    Being in a pod is not enough: most pods run one process, and turning every one of them
    into a "cluster" of pods sharing some label would surprise its owner. The opt-in names
    the pods that form the cluster; ``environment='kubernetes'`` opts in with TF's default
    selector ``job-name=tensorflow``. The search defaults to the pod's own namespace (read
    from its service account), which needs only a namespaced Role, not cluster-wide RBAC.
    """

    name = "kubernetes"
    title = "Kubernetes"

    def detect(self) -> Detection:
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "").strip()
        if not host:
            return Detection(False, "KUBERNETES_SERVICE_HOST is not set (not in a pod)")
        for var in (K8S_JOBS_ENV, K8S_SELECTOR_ENV):
            if os.environ.get(var, "").strip():
                return Detection(True, f"in a pod (KUBERNETES_SERVICE_HOST={host}) with {var}")
        return Detection(
            False,
            f"in a pod (KUBERNETES_SERVICE_HOST={host}) but neither {K8S_SELECTOR_ENV} nor "
            f"{K8S_JOBS_ENV} names the cluster's pods; a pod alone is not a cluster "
            "(environment='kubernetes' opts in with the selector job-name=tensorflow)",
        )

    def _mapping(self) -> tuple[dict[str, Any] | None, str]:
        raw = os.environ.get(K8S_JOBS_ENV, "").strip()
        if raw:
            try:
                mapping = json.loads(raw)
            except ValueError as exc:
                raise ValueError(
                    f"{K8S_JOBS_ENV} is not valid JSON ({exc}): {raw!r}; expected e.g. "
                    '\'{"chief": ["role=chief"], "worker": ["role=worker"]}\''
                ) from None
            return mapping, K8S_JOBS_ENV
        selector = os.environ.get(K8S_SELECTOR_ENV, "").strip()
        if selector:
            return {"worker": [selector]}, f"{K8S_SELECTOR_ENV}={selector!r}"
        return None, "the default selector job-name=tensorflow"

    def build(self, **overrides: Any) -> Built:
        from jaxcluster.cluster_resolver import k8s

        mapping, mapping_source = self._mapping()
        defaults: dict[str, Any] = {"job_to_label_mapping": mapping}
        namespace_source = "all namespaces"
        if os.environ.get(K8S_NAMESPACE_ENV, "").strip():
            defaults["namespace"] = os.environ[K8S_NAMESPACE_ENV].strip()
            namespace_source = f"namespace from {K8S_NAMESPACE_ENV}"
        else:
            sa_dir = Path(overrides.get("service_account_dir") or k8s.SERVICE_ACCOUNT_DIR)
            try:
                defaults["namespace"] = (sa_dir / "namespace").read_text().strip() or None
                namespace_source = "this pod's namespace (service account)"
            except OSError:
                pass
        if os.environ.get(K8S_PORT_ENV, "").strip():
            defaults["tf_server_port"] = env_int(K8S_PORT_ENV, minimum=1)
        sources = {"cluster": f"pods matching {mapping_source} in {namespace_source}"}
        built = construct(self, k8s.KubernetesClusterResolver, defaults, overrides, sources)
        self._find_own_task(built, overrides)
        return built

    @staticmethod
    def _find_own_task(built: Built, overrides: dict[str, Any]) -> None:
        resolver = built.resolver
        if os.environ.get(TASK_ID_ENV, "").strip() and "task_id" not in overrides:
            resolver.task_id = env_int(TASK_ID_ENV)
            built.sources["task_id"] = TASK_ID_ENV
            if "task_type" not in overrides:
                resolver.task_type = os.environ.get(TASK_TYPE_ENV, "").strip() or "worker"
                built.sources["task_type"] = (
                    TASK_TYPE_ENV if os.environ.get(TASK_TYPE_ENV) else "default 'worker'"
                )
            return
        if "task_id" in overrides and "task_type" in overrides:
            return
        # This pod's place among the matched pods: its name is its hostname.
        pod = os.environ.get("HOSTNAME") or socket.gethostname()
        found = resolver.find_task(pod)  # type: ignore[attr-defined]
        if found is None:
            note = f"unknown: this pod ({pod!r}, from HOSTNAME) matches no selector"
            built.sources.setdefault("task_type", note)
            built.sources.setdefault("task_id", note)
            return
        for name, value in zip(("task_type", "task_id"), found, strict=True):
            if name not in overrides:
                setattr(resolver, name, value)
                built.sources[name] = f"position of this pod ({pod!r}) among the matched pods"


class GkeTpuEnvironment(Environment):
    """A GKE TPU slice: ``TPU_WORKER_HOSTNAMES`` (or ``TPU_PROCESS_ADDRESSES``) and
    ``TPU_WORKER_ID``. A SimpleClusterResolver whose worker job is those hosts in order; the
    first is the coordinator."""

    name = "gke_tpu"
    title = "GKE TPU"

    @staticmethod
    def _hosts_var() -> str | None:
        for var in ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES"):
            if os.environ.get(var, "").strip():
                return var
        return None

    def detect(self) -> Detection:
        var = self._hosts_var()
        if var is None:
            return Detection(False, "neither TPU_WORKER_HOSTNAMES nor TPU_PROCESS_ADDRESSES is set")
        worker = os.environ.get("TPU_WORKER_ID", "<unset>")
        return Detection(True, f"{var}={os.environ[var]} and TPU_WORKER_ID={worker}")

    def build(self, **overrides: Any) -> Built:
        overrides = dict(overrides)
        port = overrides.pop("port", TPU_WORKER_PORT)
        var = self._hosts_var()
        if var is None:
            raise ValueError(
                "GKE TPU: neither TPU_WORKER_HOSTNAMES nor TPU_PROCESS_ADDRESSES is set; "
                "expected a comma-separated list of the slice's hosts"
            )
        raw = os.environ[var]
        if var == "TPU_PROCESS_ADDRESSES":
            # Each entry is one process's host:port (several processes may share a host).
            addresses = parse_addresses(var, raw)
            cluster_source = f"{var} in order"
        else:
            hosts = [h.strip() for h in raw.split(",")]
            if not all(hosts):
                raise ValueError(f"{var} is {raw!r}; expected comma-separated host names")
            addresses = parse_addresses(var, ",".join(f"{h}:{port}" for h in hosts))
            cluster_source = f"{var} in order, port {port}"
        sources = {
            "cluster": cluster_source,
            "task_type": "GKE TPU: every host is a worker",
            "task_id": "TPU_WORKER_ID",
            "rpc_layer": "default 'grpc'",
        }
        task_id = None
        if "task_id" not in overrides:
            task_id = env_int("TPU_WORKER_ID")
            if task_id >= len(addresses):
                raise ValueError(
                    f"TPU_WORKER_ID is {task_id} but {var} lists {len(addresses)} hosts; "
                    f"expected 0..{len(addresses) - 1}"
                )
        defaults = {
            "cluster_spec": ClusterSpec({"worker": addresses}),
            "task_type": "worker",
            "task_id": task_id,
            "rpc_layer": "grpc",
            "environment": "google",
        }
        return construct(self, SimpleClusterResolver, defaults, overrides, sources)


class GceTpuVmEnvironment(Environment):
    """A Cloud TPU VM: ``TPUClusterResolver(tpu='local')``, which reads the slice from the
    metadata server. Detected locally first: a Google Compute Engine machine (DMI product
    name) with TPU devices (``/dev/accel*``, ``/dev/vfio/<n>``) or ``TPU_ACCELERATOR_TYPE`` /
    ``TPU_NAME`` set. ``root`` relocates ``/sys`` and ``/dev`` (for tests)."""

    name = "gce_tpu_vm"
    title = "GCE TPU VM"

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        self.root = Path(root)

    def detect(self) -> Detection:
        if os.environ.get("TPU_SKIP_MDS_QUERY") is not None:
            return Detection(False, "TPU_SKIP_MDS_QUERY is set")
        product_file = self.root / "sys/class/dmi/id/product_name"
        try:
            product = product_file.read_text().strip()
        except OSError:
            return Detection(False, f"not a GCE VM ({product_file} is unreadable)")
        if product != "Google Compute Engine":
            return Detection(False, f"not a GCE VM (DMI product name {product!r})")
        devices = sorted(glob.glob(str(self.root / "dev/accel*"))) + sorted(
            p for p in glob.glob(str(self.root / "dev/vfio/*")) if Path(p).name.isdigit()
        )
        if devices:
            return Detection(True, f"a GCE VM with TPU devices ({', '.join(devices[:4])})")
        for var in ("TPU_ACCELERATOR_TYPE", "TPU_NAME"):
            if os.environ.get(var, "").strip():
                return Detection(True, f"a GCE VM with {var}={os.environ[var]}")
        return Detection(
            False,
            "a GCE VM without TPU devices (/dev/accel*, /dev/vfio/<n>) or "
            "TPU_ACCELERATOR_TYPE/TPU_NAME",
        )

    def build(self, **overrides: Any) -> Built:
        from jaxcluster.cluster_resolver.tpu import TPUClusterResolver

        sources = {
            "cluster": "GCE metadata worker-network-endpoints",
            "task_type": "job_name (default 'worker')",
            "task_id": "GCE metadata agent-worker-number",
        }
        return construct(self, TPUClusterResolver, {"tpu": "local"}, overrides, sources)
