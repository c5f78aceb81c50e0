"""A small Kubernetes API server on 127.0.0.1 for tests.

It answers ``GET /api/v1/pods`` and ``GET /api/v1/namespaces/{ns}/pods`` with real
``v1.PodList`` JSON, filters by ``labelSelector`` (equality, inequality, set-based ``in`` /
``notin`` and existence terms, comma-joined), checks a bearer token, can refuse with a 403
``Status`` or hold a request open, and records every request. With ``tls=True`` it serves
HTTPS with a fresh self-signed certificate, which is what the in-cluster config loader
requires.

Example::

    with FakeKubernetesAPI(token="s3cret") as api:
        api.add_pod("w-0", {"job-name": "tensorflow"}, pod_ip="10.0.0.5")
        kubeconfig = write_kubeconfig(tmp_path / "config", api)
        ...  # point the official client at ``kubeconfig``
        assert api.requests[0].authorization == "Bearer s3cret"
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
import shutil
import ssl
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

# How long a held request waits for release() before answering anyway, so a test that forgets
# to release cannot leave a server thread behind forever.
_MAX_HOLD_SECONDS = 30.0


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server saw."""

    method: str
    path: str
    query: dict[str, list[str]]
    authorization: str | None

    @property
    def label_selector(self) -> str | None:
        values = self.query.get("labelSelector")
        return values[0] if values else None


class SelectorError(ValueError):
    """A label selector the real API server would reject with 400."""


_TERM = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9._/-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9._-]*)"
    r"|\s(?P<setop>in|notin)\s*\((?P<values>[^()]*)\))?\s*$"
)


def _split_terms(selector: str) -> list[str]:
    # Commas separate terms except inside the parentheses of a set-based term.
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(selector):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            terms.append(selector[start:i])
            start = i + 1
    terms.append(selector[start:])
    return [t for t in terms if t.strip()]


def selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy every term of ``selector`` (Kubernetes semantics)."""
    for term in _split_terms(selector):
        m = _TERM.match(term)
        if m is None:
            raise SelectorError(f"unable to parse requirement: {term!r}")
        key, neg = m["key"], m["neg"]
        if neg and (m["op"] or m["setop"]):
            raise SelectorError(f"unable to parse requirement: {term!r}")
        if m["op"] in ("=", "=="):
            ok = labels.get(key) == m["value"]
        elif m["op"] == "!=":
            ok = labels.get(key) != m["value"]
        elif m["setop"]:
            values = {v.strip() for v in m["values"].split(",") if v.strip()}
            ok = (
                (labels.get(key) in values)
                if m["setop"] == "in"
                else (labels.get(key) not in values)
            )
        else:
            ok = (key in labels) != bool(neg)
        if not ok:
            return False
    return True


class SelfSignedCert:
    """A throwaway certificate for ``127.0.0.1`` (its own CA), written to a temp directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.cert_file = directory / "server.crt"
        self.key_file = directory / "server.key"

    @classmethod
    def create(cls, ip: str) -> SelfSignedCert:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-kubernetes")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        out = cls(Path(tempfile.mkdtemp(prefix="fake-k8s-tls-")))
        out.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        out.key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return out

    def cleanup(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out and hung up is expected in tests; anything else is a bug
        # in this server and should be seen.
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, ssl.SSLError)):
            super().handle_error(request, client_address)


@dataclass
class _State:
    pods: list[dict[str, Any]] = field(default_factory=list)
    requests: list[RecordedRequest] = field(default_factory=list)
    forbidden: bool = False
    hold: threading.Event | None = None
    resource_version: int = 1000


class FakeKubernetesAPI:
    """The Kubernetes pods API on a free 127.0.0.1 port; a context manager.

    ``token``: when set, requests must carry ``Authorization: Bearer <token>`` (else 401).
    ``tls``: serve HTTPS with a self-signed certificate (``ca_file`` holds it).
    """

    def __init__(self, *, token: str | None = None, tls: bool = False) -> None:
        self.token = token
        self._state = _State()
        self._lock = threading.Lock()
        self._server = _QuietServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        self._cert: SelfSignedCert | None = None
        if tls:
            self._cert = SelfSignedCert.create("127.0.0.1")
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self._cert.cert_file, self._cert.key_file)
            self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    # lifecycle -------------------------------------------------------------------------
    def start(self) -> FakeKubernetesAPI:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        if self._cert is not None:
            self._cert.cleanup()

    def __enter__(self) -> FakeKubernetesAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # addresses -------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        scheme = "https" if self._cert is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> str | None:
        return None if self._cert is None else str(self._cert.cert_file)

    # what the server holds -------------------------------------------------------------
    def add_pod(
        self,
        name: str,
        labels: Mapping[str, str],
        *,
        namespace: str = "default",
        phase: str = "Running",
        pod_ip: str | None = "10.0.0.1",
        host_ip: str | None = "192.168.0.1",
    ) -> dict[str, Any]:
        """Add a pod shaped as the API returns it; ``None`` IPs are left out, as for a
        pod not yet scheduled."""
        status: dict[str, Any] = {"phase": phase}
        if pod_ip is not None:
            status["podIP"] = pod_ip
            status["podIPs"] = [{"ip": pod_ip}]
        if host_ip is not None:
            status["hostIP"] = host_ip
        pod = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{namespace}-{name}",
                "labels": dict(labels),
                "creationTimestamp": "2024-01-01T00:00:00Z",
            },
            "spec": {"containers": [{"name": "main", "image": "python:3.11"}]},
            "status": status,
        }
        self.add_raw_pod(pod)
        return pod

    def add_raw_pod(self, pod: dict[str, Any]) -> None:
        """Add a pod object exactly as given (to test missing or odd fields)."""
        with self._lock:
            self._state.pods.append(pod)
            self._state.resource_version += 1

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        """Remove one pod, as a deletion (or a finished Job's pod) does."""
        with self._lock:
            pods = self._state.pods
            kept = [
                pod
                for pod in pods
                if (pod["metadata"]["name"], pod["metadata"]["namespace"]) != (name, namespace)
            ]
            if len(kept) == len(pods):
                raise KeyError(f"no pod {namespace}/{name}")
            self._state.pods[:] = kept
            self._state.resource_version += 1

    def clear_pods(self) -> None:
        with self._lock:
            self._state.pods.clear()

    def set_forbidden(self, forbidden: bool = True) -> None:
        """Answer every list with 403, as for a service account without RBAC on pods."""
        self._state.forbidden = forbidden

    def hold_requests(self) -> None:
        """Keep list requests open until :meth:`release` (to exercise client timeouts)."""
        self._state.hold = threading.Event()

    def release(self) -> None:
        hold, self._state.hold = self._state.hold, None
        if hold is not None:
            hold.set()

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._state.requests)

    # request handling ------------------------------------------------------------------
    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._state.requests.append(request)

    def _list(self, namespace: str | None, selector: str) -> dict[str, Any]:
        selector_matches(selector, {})  # reject a malformed selector even with no pods
        with self._lock:
            pods = [
                p
                for p in self._state.pods
                if (namespace is None or p["metadata"].get("namespace") == namespace)
                and selector_matches(selector, p["metadata"].get("labels") or {})
            ]
            version = str(self._state.resource_version)
        # The real server returns pods in storage order (by namespace, then name); tests
        # insert out of order so the resolver's own sorting is what they observe.
        return {
            "apiVersion": "v1",
            "kind": "PodList",
            "metadata": {"resourceVersion": version},
            "items": pods,
        }


def status_json(code: int, reason: str, message: str, kind: str = "pods") -> dict[str, Any]:
    """A ``v1.Status`` failure body as the API server sends it."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {"kind": kind},
        "code": code,
    }


_NAMESPACED = re.compile(r"^/api/v1/namespaces/(?P<ns>[a-z0-9]([-a-z0-9]*[a-z0-9])?)/pods/?$")


def _make_handler(api: FakeKubernetesAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass  # keep pytest output clean

        def _send(self, code: int, body: Mapping[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            query = parse_qs(parts.query, keep_blank_values=True)
            auth = self.headers.get("Authorization")
            api._record(RecordedRequest("GET", parts.path, query, auth))
            hold = api._state.hold
            if hold is not None:
                hold.wait(_MAX_HOLD_SECONDS)
            scheme, _, credential = (auth or "").partition(" ")
            if api.token is not None and (scheme.lower(), credential) != ("bearer", api.token):
                self._send(401, status_json(401, "Unauthorized", "Unauthorized"))
                return
            if parts.path.rstrip("/") == "/api/v1/pods":
                namespace = None
            elif (m := _NAMESPACED.match(parts.path)) is not None:
                namespace = m["ns"]
            else:
                self._send(
                    404,
                    status_json(
                        404, "NotFound", "the server could not find the requested resource"
                    ),
                )
                return
            if api._state.forbidden:
                scope = (
                    "at the cluster scope"
                    if namespace is None
                    else (f'in the namespace "{namespace}"')
                )
                message = (
                    'pods is forbidden: User "system:serviceaccount:default:default" cannot '
                    f'list resource "pods" in API group "" {scope}'
                )
                self._send(403, status_json(403, "Forbidden", message))
                return
            selector = (query.get("labelSelector") or [""])[0]
            try:
                body = api._list(namespace, selector)
            except SelectorError as exc:
                self._send(400, status_json(400, "BadRequest", str(exc)))
                return
            self._send(200, body)

    return Handler


def write_kubeconfig(
    path: str | Path,
    api: FakeKubernetesAPI,
    *,
    token: str | None = None,
    namespace: str | None = None,
    context: str = "test",
) -> Path:
    """Write a kubeconfig whose current context reaches ``api`` with token auth.

    JSON is valid YAML, so the file is written with :mod:`json`.
    """
    cluster: dict[str, Any] = {"server": api.url}
    if api.ca_file is not None:
        cluster["certificate-authority"] = api.ca_file
    ctx: dict[str, Any] = {"cluster": "fake", "user": "tester"}
    if namespace is not None:
        ctx["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": cluster}],
        "users": [{"name": "tester", "user": {"token": token or api.token or "unused"}}],
        "contexts": [{"name": context, "context": ctx}],
        "current-context": context,
    }
    path = Path(path)
    path.write_text(json.dumps(config, indent=2))
    return path


def incluster_env(
    directory: str | Path, api: FakeKubernetesAPI, *, token: str | None = None
) -> dict[str, str]:
    """Lay out a service-account directory (``token``, ``ca.crt``, ``namespace``) for ``api``
    in ``directory`` and return the environment variables a pod would see.

    ``api`` must serve TLS: the in-cluster loader always speaks https.
    """
    if api.ca_file is None:
        raise ValueError("in-cluster config needs a TLS server: FakeKubernetesAPI(tls=True)")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(token or api.token or "unused")
    (directory / "ca.crt").write_text(Path(api.ca_file).read_text())
    (directory / "namespace").write_text("default")
    return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port)}
