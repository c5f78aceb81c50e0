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
TLS_MOUNT = "/var/run/jaxcluster-tls"
CA_MOUNT = "/var/run/secrets/jaxcluster-ca"
METRICS_PORT = 9090


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
    assert api_version in (
        "v1",
        "batch/v1",
        "rbac.authorization.k8s.io/v1",
        "networking.k8s.io/v1",
    ), api_version
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
        "NetworkPolicy",
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
        mounts = {m.name: m.mount_path for m in container.volume_mounts}
        assert mounts == {"token": TOKEN_MOUNT, "tls": TLS_MOUNT, "tmp": "/tmp"}
        volumes = {v.name: v for v in pod.volumes}
        assert volumes["token"].secret.secret_name == "jaxcluster-token"
        env = env_of(container)
        assert env["JAXCLUSTER_TASK_TYPE"].value == role
        index_field = env["JAXCLUSTER_TASK_ID"].value_from.field_ref.field_path
        assert index_field == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        port = int(env["JAXCLUSTER_K8S_PORT"].value)
        assert [p.container_port for p in container.ports] == [port, METRICS_PORT]
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
    # The program waits for the ps tasks through the public API, not jaxcluster._native.
    assert "strategy.wait_for_ps(" in config_map.data["train.py"]
    assert "_native" not in config_map.data["train.py"]
    secret = env["JAXCLUSTER_AUTH_TOKEN"].value_from.secret_key_ref
    assert (secret.name, secret.key) == ("jaxcluster-token", "token")
    volumes = {v.name: v for v in job.spec.template.spec.volumes}
    assert volumes["program"].config_map.name == "jaxcluster-train"
    claim = volumes["checkpoints"].persistent_volume_claim.claim_name
    assert claim in by_kind("PersistentVolumeClaim")
    mounts = {m.name: m.mount_path for m in container.volume_mounts}
    assert env["CHECKPOINT"].value.startswith(mounts["checkpoints"] + "/")


def flag_value(command: list[str], flag: str) -> str:
    assert flag in command, f"{flag} missing from {command}"
    return command[command.index(flag) + 1]


def test_workers_and_ps_serve_tls_with_a_certificate_from_the_ca_secret() -> None:
    for role, job in task_jobs().items():
        pod = job.spec.template.spec
        (container,) = pod.containers
        cert = flag_value(container.command, "--tls-cert")
        key = flag_value(container.command, "--tls-key")
        assert cert == f"{TLS_MOUNT}/server.pem" and key == f"{TLS_MOUNT}/server.key", role
        # Workers verify the ps tasks (and every task its peers) against the CA.
        assert env_of(container)["JAXCLUSTER_TLS_CA"].value == f"{TLS_MOUNT}/ca.pem"
        volumes = {v.name: v for v in pod.volumes}
        assert volumes["tls"].empty_dir.medium == "Memory"
        assert volumes["ca"].secret.secret_name == "jaxcluster-tls"
        # The serving container never sees the CA key: only the init container mounts it,
        # and it issues the certificate for the pod's IP (what the resolver dials).
        assert "ca" not in {m.name for m in container.volume_mounts}
        (init,) = pod.init_containers
        script = " ".join(init.command)
        assert "jaxcluster tls issue /var/run/jaxcluster-tls" in script
        assert '"$POD_IP"' in script and "rm -f /var/run/jaxcluster-tls/ca.key" in script
        assert env_of(init)["POD_IP"].value_from.field_ref.field_path == "status.podIP"
        init_mounts = {m.name: m.mount_path for m in init.volume_mounts}
        assert init_mounts == {"ca": CA_MOUNT, "tls": TLS_MOUNT}


def test_the_token_is_never_in_clear_text() -> None:
    for name, doc in documents():
        text = yaml.safe_dump(doc)
        assert "--auth-token " not in text and "--auth-token=" not in text, name
        if doc["kind"] == "Secret":
            raise AssertionError(f"{name} commits a Secret; create it with kubectl instead")
    for job in by_kind("Job").values():
        pod = job.spec.template.spec
        for container in [*pod.containers, *(pod.init_containers or [])]:
            env = env_of(container) if container.env else {}
            token = env.get("JAXCLUSTER_AUTH_TOKEN")
            if token is not None:
                assert token.value is None and token.value_from.secret_key_ref is not None
            # Whoever holds a token also talks TLS: a CA to verify the tasks with.
            holds_token = token is not None or "--auth-token-file" in container.command
            if holds_token:
                assert env["JAXCLUSTER_TLS_CA"].value.endswith("/ca.pem"), job.metadata.name


def test_every_container_runs_unprivileged_on_a_read_only_root() -> None:
    for job in by_kind("Job").values():
        pod = job.spec.template.spec
        assert pod.security_context.run_as_non_root is True
        assert pod.security_context.run_as_user not in (None, 0)
        assert pod.security_context.seccomp_profile.type == "RuntimeDefault"
        for container in [*pod.containers, *(pod.init_containers or [])]:
            context = container.security_context
            where = f"{job.metadata.name}/{container.name}"
            assert context.allow_privilege_escalation is False, where
            assert context.read_only_root_filesystem is True, where
            assert context.run_as_non_root is True, where
            assert context.capabilities.drop == ["ALL"], where
            assert not context.capabilities.add, where
            assert not context.privileged, where


def test_the_coordinator_gets_the_ca_certificate_but_not_its_key() -> None:
    job = by_kind("Job")["jaxcluster-coordinator"]
    (container,) = job.spec.template.spec.containers
    assert env_of(container)["JAXCLUSTER_TLS_CA"].value == f"{CA_MOUNT}/ca.pem"
    volumes = {v.name: v for v in job.spec.template.spec.volumes}
    ca = volumes["ca"].secret
    assert ca.secret_name == "jaxcluster-tls"
    assert [(i.key, i.path) for i in ca.items] == [("ca.pem", "ca.pem")]


def pods_labels() -> dict[str, dict[str, str]]:
    return {
        name.removeprefix("jaxcluster-"): job.spec.template.metadata.labels
        for name, job in by_kind("Job").items()
    }


def label_selector_matches(selector: Any, labels: dict[str, str]) -> bool:
    assert not selector.match_expressions
    return all(labels.get(k) == v for k, v in (selector.match_labels or {}).items())


def allowed(policy: Any, source_role: str | None, port: int) -> bool:
    """Whether the policy admits ``source_role``'s pods (``None``: a pod in the monitoring
    namespace) on ``port``."""
    labels = pods_labels()
    for rule in policy.spec.ingress:
        ports = [p.port for p in rule.ports] if rule.ports else None
        if ports is not None and port not in ports:
            continue
        for peer in rule._from:
            if source_role is None and peer.namespace_selector is not None:
                match = peer.namespace_selector.match_labels
                if match == {"kubernetes.io/metadata.name": "monitoring"}:
                    return True
            if (
                source_role is not None
                and peer.pod_selector is not None
                and peer.namespace_selector is None
                and label_selector_matches(peer.pod_selector, labels[source_role])
            ):
                return True
    return False


def test_network_policies_admit_only_the_coordinator_peers_and_monitoring() -> None:
    policies = by_kind("NetworkPolicy")
    labels = pods_labels()
    for role in ("ps", "worker"):
        policy = policies[f"jaxcluster-{role}"]
        assert policy.spec.policy_types == ["Ingress"]
        selected = [
            r for r in labels if label_selector_matches(policy.spec.pod_selector, labels[r])
        ]
        assert selected == [role]
        container = task_jobs()[role].spec.template.spec.containers[0]
        grpc = int(env_of(container)["JAXCLUSTER_K8S_PORT"].value)
        assert int(flag_value(container.command, "--metrics-port")) == METRICS_PORT
        assert flag_value(container.command, "--metrics-host") == "0.0.0.0"
        assert allowed(policy, "coordinator", grpc)
        assert allowed(policy, None, METRICS_PORT)
        assert not allowed(policy, None, grpc)
        assert not allowed(policy, "coordinator", 22)
    # ps tasks are reached by the workers (variables); workers by their slice peers.
    assert allowed(policies["jaxcluster-ps"], "worker", 8470)
    assert not allowed(policies["jaxcluster-ps"], "ps", 8470)
    assert allowed(policies["jaxcluster-worker"], "worker", 8470)
    assert not allowed(policies["jaxcluster-worker"], "ps", 8470)


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
