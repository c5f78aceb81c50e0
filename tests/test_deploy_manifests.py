"""The deployment recipes under deploy/: every Kubernetes document loads into the official
client's models without losing a field, the Jobs, Service, RBAC and commands fit together,
and the Slurm script is valid bash."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
K8S = DEPLOY / "kubernetes"
TOKEN_MOUNT = "/var/run/secrets/jaxcluster"


def documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


def model(doc: dict[str, Any]) -> Any:
    """The ``kubernetes.client`` model for ``doc`` (e.g. ``V1Job``)."""
    api_version = doc["apiVersion"]
    assert api_version in ("v1", "batch/v1", "rbac.authorization.k8s.io/v1"), api_version
    klass = f"V1{doc['kind']}"
    assert hasattr(client, klass), f"kubernetes.client has no {klass}"
    return client.ApiClient()._ApiClient__deserialize(doc, klass)


def by_kind(kind: str) -> dict[str, Any]:
    return {d["metadata"]["name"]: model(d) for _, d in documents() if d["kind"] == kind}


def test_every_document_round_trips_through_the_client_models() -> None:
    docs = documents()
    kinds = sorted({d["kind"] for _, d in docs})
    assert kinds == [
        "ConfigMap",
        "Job",
        "PersistentVolumeClaim",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    serializer = client.ApiClient()
    for name, doc in docs:
        loaded = model(doc)
        # A misspelled or misplaced field is dropped by the model: the round trip shows it.
        assert serializer.sanitize_for_serialization(loaded) == doc, f"{name}: {doc['kind']}"


def task_jobs() -> dict[str, Any]:
    jobs = by_kind("Job")
    return {role: jobs[f"jaxcluster-{role}"] for role in ("worker", "ps")}


def env_of(container: Any) -> dict[str, Any]:
    return {e.name: e for e in container.env}


def test_workers_and_ps_are_indexed_jobs_started_from_the_resolver() -> None:
    for role, job in task_jobs().items():
        spec = job.spec
        assert spec.completion_mode == "Indexed"
        assert spec.completions == spec.parallelism >= 1
        pod = spec.template.spec
        (container,) = pod.containers
        assert container.command[:4] == ["jaxcluster", role, "--from-resolver", "kubernetes"]
        token_file = container.command[container.command.index("--auth-token-file") + 1]
        assert token_file.startswith(TOKEN_MOUNT + "/")
        assert [m.mount_path for m in container.volume_mounts] == [TOKEN_MOUNT]
        (volume,) = pod.volumes
        assert volume.secret.secret_name == "jaxcluster-token"
        env = env_of(container)
        assert env["JAXCLUSTER_TASK_TYPE"].value == role
        index_field = env["JAXCLUSTER_TASK_ID"].value_from.field_ref.field_path
        assert index_field == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        port = int(env["JAXCLUSTER_K8S_PORT"].value)
        assert [p.container_port for p in container.ports] == [port]
        assert container.readiness_probe.tcp_socket.port == port


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    pairs = [term.split("=", 1) for term in selector.split(",")]
    return all(labels.get(key) == value for key, value in pairs)


def test_job_selectors_pick_exactly_their_own_pods() -> None:
    jobs = task_jobs()
    coordinator = by_kind("Job")["jaxcluster-coordinator"]
    containers = [j.spec.template.spec.containers[0] for j in jobs.values()]
    containers.append(coordinator.spec.template.spec.containers[0])
    mappings = {env_of(c)["JAXCLUSTER_K8S_JOBS"].value for c in containers}
    assert len(mappings) == 1, "every pod must see the same cluster"
    mapping = json.loads(mappings.pop())
    assert sorted(mapping) == ["ps", "worker"]
    for job_name, selectors in mapping.items():
        for role, job in jobs.items():
            labels = job.spec.template.metadata.labels
            matched = any(selector_matches(s, labels) for s in selectors)
            assert matched == (role == job_name), (job_name, role)
        coordinator_labels = coordinator.spec.template.metadata.labels
        assert not any(selector_matches(s, coordinator_labels) for s in selectors)


def test_the_headless_service_covers_workers_and_ps() -> None:
    service = by_kind("Service")["jaxcluster-train"]
    assert service.spec.cluster_ip == "None"
    assert service.spec.publish_not_ready_addresses is True
    for job in task_jobs().values():
        pod = job.spec.template
        assert pod.spec.subdomain == "jaxcluster-train"
        assert selector_matches(
            ",".join(f"{k}={v}" for k, v in service.spec.selector.items()), pod.metadata.labels
        )
        port = int(env_of(pod.spec.containers[0])["JAXCLUSTER_K8S_PORT"].value)
        assert [p.target_port for p in service.spec.ports] == [port]


def test_rbac_grants_get_and_list_on_pods_to_every_pod() -> None:
    (account,) = by_kind("ServiceAccount")
    role = by_kind("Role")["jaxcluster-pod-reader"]
    (rule,) = role.rules
    assert rule.api_groups == [""] and rule.resources == ["pods"]
    assert sorted(rule.verbs) == ["get", "list"]
    binding = by_kind("RoleBinding")["jaxcluster-pod-reader"]
    assert (binding.role_ref.kind, binding.role_ref.name) == ("Role", role.metadata.name)
    assert [(s.kind, s.name) for s in binding.subjects] == [("ServiceAccount", account)]
    for job in by_kind("Job").values():
        assert job.spec.template.spec.service_account_name == account


def test_the_coordinator_runs_the_example_program_with_the_token() -> None:
    config_map = by_kind("ConfigMap")["jaxcluster-train"]
    assert config_map.data["train.py"] == (DEPLOY / "example_train.py").read_text()
    job = by_kind("Job")["jaxcluster-coordinator"]
    (container,) = job.spec.template.spec.containers
    assert container.command == ["python", "/opt/jaxcluster/train.py"]
    env = env_of(container)
    assert env["JAXCLUSTER_ENVIRONMENT"].value == "kubernetes"
    secret = env["JAXCLUSTER_AUTH_TOKEN"].value_from.secret_key_ref
    assert (secret.name, secret.key) == ("jaxcluster-token", "token")
    volumes = {v.name: v for v in job.spec.template.spec.volumes}
    assert volumes["program"].config_map.name == "jaxcluster-train"
    claim = volumes["checkpoints"].persistent_volume_claim.claim_name
    assert claim in by_kind("PersistentVolumeClaim")
    mounts = {m.name: m.mount_path for m in container.volume_mounts}
    assert env["CHECKPOINT"].value.startswith(mounts["checkpoints"] + "/")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_sbatch_script_is_valid_bash_starting_both_roles_from_the_resolver() -> None:
    script = DEPLOY / "slurm" / "jaxcluster-ps.sbatch"
    checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n") and "#SBATCH --nodes=" in text
    for role in ("ps", "worker"):
        assert re.search(
            rf"jaxcluster {role} --from-resolver slurm --auth-token-file \S+ \S*TLS_ARGS", text
        ), role
    # Cleanup signals the tasks themselves (srun would SIGKILL them); the job makes its own
    # CA and certificates; a task that exits non-zero ends its step.
    assert 'scancel --signal=TERM "$SLURM_JOB_ID"' in text
    assert "jaxcluster tls make-ca" in text and "jaxcluster tls issue" in text
    assert "--kill-on-bad-exit=1" in text and 'kill -TERM "${STEP_PIDS' not in text
    assert "example_train.py" in text
