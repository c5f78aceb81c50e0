"""TF-style ClusterCoordinator for JAX: schedule closures on a cluster's workers.

Example::

    from jaxcluster import LocalCluster
    from jaxcluster.coordinator import ClusterCoordinator

    with LocalCluster(2) as cluster, cluster.coordinator() as coordinator:
        rv = coordinator.schedule(lambda a, b: a + b, args=(1, 2))
        coordinator.join()
        rv.fetch()  # 3
"""

from __future__ import annotations

from jaxcluster._native import core as _core
from jaxcluster.coordinator.cluster_coordinator import ClusterCoordinator as ClusterCoordinator
from jaxcluster.coordinator.device_state import DeviceState as DeviceState
from jaxcluster.coordinator.device_state import PerWorkerState as PerWorkerState
from jaxcluster.coordinator.per_worker import PerWorkerValue as PerWorkerValue
from jaxcluster.coordinator.per_worker import PerWorkerValues as PerWorkerValues
from jaxcluster.coordinator.remote_value import RemoteValue as RemoteValue
from jaxcluster.coordinator.remote_value import RemoteValueStatus as RemoteValueStatus
from jaxcluster.worker.context import get_current_worker_index as get_current_worker_index

#: TF's name for :func:`get_current_worker_index`
#: (``tf.distribute.coordinator.experimental_get_current_worker_index``).
experimental_get_current_worker_index = get_current_worker_index

#: The Rust closure queue with TF's ``_CoordinatedClosureQueue`` semantics.
ClosureQueue = _core.ClosureQueue

__all__ = [
    "ClosureQueue",
    "ClusterCoordinator",
    "DeviceState",
    "PerWorkerState",
    "PerWorkerValue",
    "PerWorkerValues",
    "RemoteValue",
    "RemoteValueStatus",
    "experimental_get_current_worker_index",
    "get_current_worker_index",
]
