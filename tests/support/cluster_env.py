"""Clearing the cluster environment a test inherits from the developer's shell or CI job.

Example::

    @pytest.fixture(autouse=True)
    def _bare_env(monkeypatch):
        clear_cluster_env(monkeypatch)
"""

from __future__ import annotations

import os

import pytest

# Variables that make some resolver or detector think it runs in a cluster.
_PREFIXES = (
    "SLURM_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "TPU_",
    "SM_",
    "JAXCLUSTER_",
    "KUBERNETES_",
    "MEGASCALE_",
    "CLOUD_TPU_",
)
_NAMES = (
    "TF_CONFIG",
    "KUBECONFIG",
    "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS",
    "JAX_COORDINATOR_PORT",
    "JAX_COORDINATOR_ADDRESS",
    "JAX_NUM_PROCESSES",
    "JAX_PROCESS_ID",
    "GCE_METADATA_HOST",
    "GCE_METADATA_IP",
    "JOB_COMPLETION_INDEX",
    "CUDA_VISIBLE_DEVICES",
)


def clear_cluster_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove every cluster-describing variable from ``os.environ`` for one test."""
    for name in list(os.environ):
        if name in _NAMES or name.startswith(_PREFIXES):
            monkeypatch.delenv(name, raising=False)


def bare_env() -> dict[str, str]:
    """A copy of ``os.environ`` without cluster variables, for subprocesses."""
    return {k: v for k, v in os.environ.items() if not (k in _NAMES or k.startswith(_PREFIXES))}
