"""The Kubernetes API side of KubernetesClusterResolver: loading credentials, listing pods,
and turning client failures into errors that say what to fix.

The official ``kubernetes`` client is imported here, lazily, and configured on a private
``Configuration`` so the resolver never changes the process-wide default client config.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxcluster import errors
from jaxcluster._extras import require


@dataclass(frozen=True)
class PodInfo:
    """The few fields of a ``V1Pod`` the resolver needs."""

    name: str
    namespace: str | None
    phase: str | None
    pod_ip: str | None
    host_ip: str | None


def _get(obj: Any, attr: str, key: str) -> Any:
    # V1Pod objects expose snake_case attributes; an override_client may hand back raw JSON.
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, attr, None)


def pod_info(pod: Any, selector: str) -> PodInfo:
    metadata = _get(pod, "metadata", "metadata")
    status = _get(pod, "status", "status")
    name = _get(metadata, "name", "name")
    if not isinstance(name, str) or not name:
        raise RuntimeError(
            f"The Kubernetes API returned a pod without metadata.name for label selector "
            f"{selector!r}: {pod!r}"
        )
    return PodInfo(
        name=name,
        namespace=_get(metadata, "namespace", "namespace"),
        phase=_get(status, "phase", "phase"),
        pod_ip=_get(status, "pod_ip", "podIP"),
        host_ip=_get(status, "host_ip", "hostIP"),
    )


def _scope(namespace: str | None) -> str:
    return f"in namespace {namespace!r}" if namespace else "in all namespaces"


class PodLister:
    """Lists pods by label selector through one CoreV1Api (ours or an override)."""

    def __init__(self, api: Any, source: str, host: str, timeout: float | None) -> None:
        self.api = api
        self.source = source
        self.host = host
        self.timeout = timeout

    @classmethod
    def create(
        cls,
        *,
        override_client: Any,
        in_cluster: bool,
        timeout: float,
        kubeconfig: str | os.PathLike[str] | None,
        context: str | None,
        service_account_dir: str | os.PathLike[str],
    ) -> PodLister:
        require("k8s", "kubernetes", "KubernetesClusterResolver")
        from kubernetes import client

        if override_client is not None:
            host = getattr(
                getattr(getattr(override_client, "api_client", None), "configuration", None),
                "host",
                "",
            )
            # A real CoreV1Api takes _request_timeout; a hand-written stand-in may not.
            real = isinstance(override_client, client.CoreV1Api)
            return cls(override_client, "override", host or "", timeout if real else None)
        if in_cluster:
            configuration = _in_cluster_configuration(Path(service_account_dir))
            source = "in-cluster"
        else:
            configuration = _kubeconfig_configuration(kubeconfig, context)
            source = "kubeconfig"
        import urllib3

        # A refused connection is retried twice, quickly; a slow read is not retried, so
        # `timeout` bounds each list call.
        configuration.retries = urllib3.Retry(total=2, read=0, backoff_factor=0.1)
        api = client.CoreV1Api(client.ApiClient(configuration))
        return cls(api, source, configuration.host, timeout)

    def list(self, selector: str, namespace: str | None) -> list[PodInfo]:
        kwargs: dict[str, Any] = {"label_selector": selector}
        if self.timeout is not None:
            # A (connect, read) pair: clients before 29 ignore a float timeout silently
            # (they only honour an int or a pair), so 0.3 s would have meant no timeout.
            kwargs["_request_timeout"] = (self.timeout, self.timeout)
        try:
            if namespace:
                result = self.api.list_namespaced_pod(namespace, **kwargs)
            else:
                result = self.api.list_pod_for_all_namespaces(**kwargs)
        except Exception as exc:
            translated = self._translate(exc, selector, namespace)
            if translated is None:
                raise
            raise translated from exc
        items = _get(result, "items", "items") or []
        return [pod_info(p, selector) for p in items]

    def _translate(self, exc: Exception, selector: str, namespace: str | None) -> Exception | None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import MaxRetryError, NewConnectionError, SSLError
        from urllib3.exceptions import TimeoutError as Urllib3Timeout

        server = (
            f"the Kubernetes API server at {self.host}"
            if self.host
            else ("the Kubernetes API server")
        )
        what = f"listing pods {_scope(namespace)} with label selector {selector!r}"
        if isinstance(exc, ApiException):
            return _api_error(exc, server, what, namespace)
        reason = exc.reason if isinstance(exc, MaxRetryError) and exc.reason else exc
        # urllib3's NewConnectionError subclasses its TimeoutError: a refused connection is
        # not a timeout, so it is tested first.
        if isinstance(reason, (Urllib3Timeout, TimeoutError)) and not isinstance(
            reason, NewConnectionError
        ):
            return errors.DeadlineExceededError(
                f"Timed out after {self.timeout:g}s {what} from {server}. Likely causes: the "
                "server is overloaded or unreachable from here (network policy, firewall, "
                "wrong address in the kubeconfig); raise timeout= if the cluster is just slow."
            )
        if isinstance(reason, SSLError):
            return errors.UnavailableError(
                f"TLS handshake with {server} failed while {what}: {reason}. Check the CA "
                "certificate in the kubeconfig or the service account's ca.crt."
            )
        if isinstance(exc, (MaxRetryError, ConnectionError)):
            return errors.UnavailableError(
                f"Could not reach {server} while {what}: {reason}. Is the address right and "
                "the server up? Outside a pod the address comes from the kubeconfig."
            )
        return None


def _api_error(exc: Any, server: str, what: str, namespace: str | None) -> Exception:
    message = exc.reason or ""
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        message = json.loads(exc.body).get("message") or message
    if exc.status == 403:
        grant = (
            f"a Role and RoleBinding in namespace {namespace!r}"
            if namespace
            else "a ClusterRole and ClusterRoleBinding (or pass namespace= to list only one "
            "namespace, which needs just a Role there)"
        )
        return PermissionError(
            f"{server} refused {what} (403 Forbidden: {message}). The service account or "
            f"user needs the RBAC verbs 'get' and 'list' on resource 'pods' (API group ''), "
            f"granted by {grant}."
        )
    if exc.status == 401:
        return errors.UnauthenticatedError(
            f"{server} rejected the credentials while {what} (401 Unauthorized: {message}). "
            "The token or client certificate is missing, expired or for another cluster."
        )
    return RuntimeError(f"{server} answered {exc.status} {exc.reason} while {what}: {message}")


def _in_cluster_configuration(directory: Path) -> Any:
    from kubernetes.client import Configuration
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.incluster_config import InClusterConfigLoader

    token, ca = directory / "token", directory / "ca.crt"
    configuration = Configuration()
    try:
        InClusterConfigLoader(token_filename=str(token), cert_filename=str(ca)).load_and_set(
            configuration
        )
    except ConfigException as exc:
        service = (
            f"{os.environ.get('KUBERNETES_SERVICE_HOST')}:"
            f"{os.environ.get('KUBERNETES_SERVICE_PORT', '<unset>')}"
        )
        raise ConfigException(
            f"KUBERNETES_SERVICE_HOST is set (API server {service}), so the pod's service "
            f"account was used, but loading it failed: {exc} (token {token}, CA {ca}). "
            "Is automountServiceAccountToken off for this pod? To use a kubeconfig instead "
            "pass executable_location=KubernetesExecutableLocation.OFF_CLUSTER."
        ) from exc
    return configuration


def _kubeconfig_configuration(path: str | os.PathLike[str] | None, context: str | None) -> Any:
    from kubernetes.client import Configuration
    from kubernetes.config import load_kube_config
    from kubernetes.config.config_exception import ConfigException

    # Read KUBECONFIG now: the client reads it once, at import time.
    if path is not None:
        config_file, origin = os.fspath(path), "kubeconfig="
    elif os.environ.get("KUBECONFIG"):
        config_file, origin = os.environ["KUBECONFIG"], "KUBECONFIG"
    else:
        config_file, origin = os.path.expanduser("~/.kube/config"), "the default location"
    configuration = Configuration()
    try:
        load_kube_config(
            config_file=config_file,
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
    except (ConfigException, OSError) as exc:
        raise ConfigException(
            f"Could not load the kubeconfig {config_file!r} (from {origin})"
            + (f" with context {context!r}" if context else "")
            + f": {exc}. Outside a pod the resolver reads a kubeconfig: set KUBECONFIG or "
            "pass kubeconfig=; inside a pod KUBERNETES_SERVICE_HOST selects the service "
            "account instead."
        ) from exc
    return configuration
