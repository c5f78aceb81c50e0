"""The GCE metadata server, and what a Cloud TPU VM's metadata says about its slice.

The metadata server answers at ``GCE_METADATA_HOST``, else ``GCE_METADATA_IP``, else
``metadata.google.internal`` (the order google-auth uses), needs the request header
``Metadata-Flavor: Google`` and sends it back. Requests get a short timeout
(``GCE_METADATA_TIMEOUT``, default 3 s) and never go through an environment proxy.

A TPU VM's instance attributes describe its slice: ``accelerator-type`` (``v4-16``),
``agent-worker-number`` (this host's index), ``worker-network-endpoints`` (every host, in
worker order, as ``unknown:unknown:<ip>`` triples or plain IPs) and ``tpu-env`` (``KEY: 'value'``
lines, among them ``TOPOLOGY``).

Example::

    md = MetadataServer()
    vm = read_tpu_vm(md)        # None off a TPU VM
    vm.hosts, vm.worker_id      # (['10.0.0.2', '10.0.0.3'], 1)
"""

from __future__ import annotations

import glob
import ipaddress
import os
import re
import time
from dataclasses import dataclass

from jaxcluster._extras import require
from jaxcluster.cluster_resolver._google import env_timeout, positive_timeout, snippet
from jaxcluster.errors import DeadlineExceededError, NotFoundError, UnavailableError

__all__ = [
    "DEFAULT_METADATA_TIMEOUT",
    "TPU_VM_WORKER_PORT",
    "MetadataServer",
    "TpuVm",
    "is_running_in_gce",
    "metadata_host",
    "might_be_tpu_vm",
    "parse_tpu_env",
    "parse_worker_endpoints",
    "read_tpu_vm",
]

METADATA_DEFAULT_HOST = "metadata.google.internal"
#: Seconds one metadata request may take; ``GCE_METADATA_TIMEOUT`` overrides it (the variable
#: google-auth reads for the same purpose).
DEFAULT_METADATA_TIMEOUT = 3.0


def metadata_host() -> tuple[str, str]:
    """``(host, where it came from)``: ``GCE_METADATA_HOST``, then ``GCE_METADATA_IP``, then
    ``metadata.google.internal``."""
    for name in ("GCE_METADATA_HOST", "GCE_METADATA_IP"):
        value = os.environ.get(name, "").strip()
        if value:
            return value.removeprefix("http://").rstrip("/"), f"from {name}"
    return METADATA_DEFAULT_HOST, "the default host"


def is_running_in_gce(timeout: float | None = None) -> bool:
    """Whether a GCE metadata server answers here (so this is a GCE or Cloud TPU VM).

    One ``GET /`` to :func:`metadata_host` with ``Metadata-Flavor: Google``, no proxy, and a
    short timeout (``GCE_METADATA_TIMEOUT``, default 3 s); ``True`` only when the answer
    carries ``Metadata-Flavor: Google`` back, so a captive portal or another server on that
    name does not count. Uses the standard library: it works without ``jaxcluster[gcp]``.

    Example::

        >>> is_running_in_gce()   # on a laptop, after at most the timeout
        False
    """
    import urllib.error
    import urllib.request

    host, _source = metadata_host()
    seconds = (
        env_timeout("GCE_METADATA_TIMEOUT", DEFAULT_METADATA_TIMEOUT)
        if timeout is None
        else positive_timeout(timeout)
    )
    request = urllib.request.Request(f"http://{host}/", headers={"Metadata-Flavor": "Google"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=seconds) as response:
            return response.headers.get("Metadata-Flavor") == "Google"
    except urllib.error.HTTPError as exc:
        return exc.headers.get("Metadata-Flavor") == "Google"
    except (OSError, ValueError):  # URLError, timeouts, refused connections, bad host
        return False


class MetadataServer:
    """Reads ``/computeMetadata/v1/<path>`` with ``Metadata-Flavor: Google`` and a short timeout.

    Example::

        md = MetadataServer()
        md.get("project/project-id", what="finding the project")   # 'my-project'
    """

    def __init__(
        self,
        host: str | None = None,
        *,
        timeout: float | None = None,
        attempts: int = 3,
    ) -> None:
        if host is None:
            self.host, self.source = metadata_host()
        else:
            self.host, self.source = host, "as given"
        self.timeout = (
            env_timeout("GCE_METADATA_TIMEOUT", DEFAULT_METADATA_TIMEOUT)
            if timeout is None
            else positive_timeout(timeout)
        )
        self.attempts = attempts
        requests = require("gcp", "requests", "Reading the GCE metadata server")
        self._session = requests.Session()
        # The metadata server is link-local: a proxy from the environment can only get in the way.
        self._session.trust_env = False

    @property
    def base_url(self) -> str:
        return f"http://{self.host}/computeMetadata/v1/"

    def get(self, path: str, *, what: str, otherwise: str = "") -> str:
        """The value at ``path``; ``NotFoundError`` when the server has no such key.

        ``what`` says why the value is needed and ``otherwise`` how to do without the server;
        both go into error messages.
        """
        value = self.get_optional(path, what=what, otherwise=otherwise)
        if value is None:
            raise NotFoundError(
                f"the GCE metadata server at {self.host} ({self.source}) has no {path!r} "
                f"(needed for {what}). {otherwise}".rstrip()
            )
        return value

    def get_optional(self, path: str, *, what: str, otherwise: str = "") -> str | None:
        """The value at ``path``, or ``None`` when the server answers 404."""
        url = self.base_url + path
        where = f"the GCE metadata server at {self.host} ({self.source})"
        if otherwise:
            advice = otherwise
        elif self.source.startswith("from "):
            advice = f"Check that {self.source[5:]} names a running GCE metadata server."
        else:
            advice = (
                "The metadata server exists only on Google Compute Engine and Cloud TPU VMs; "
                "elsewhere set GCE_METADATA_HOST to one."
            )
        import requests

        for attempt in range(self.attempts):
            try:
                response = self._session.get(
                    url, headers={"Metadata-Flavor": "Google"}, timeout=self.timeout
                )
            except requests.Timeout as exc:
                raise DeadlineExceededError(
                    f"{where} did not answer GET {url} ({what}) within {self.timeout:g}s. "
                    f"{advice} Set GCE_METADATA_TIMEOUT to wait longer."
                ) from exc
            except requests.ConnectionError as exc:
                if attempt + 1 < self.attempts:
                    time.sleep(0.1 * (2**attempt))
                    continue
                raise UnavailableError(
                    f"could not reach {where} for GET {url} ({what}): {exc}. {advice}"
                ) from exc
            if response.headers.get("Metadata-Flavor") != "Google":
                raise UnavailableError(
                    f"something answered at {self.host} ({self.source}) for {what}, but not a "
                    "GCE metadata server: the 'Metadata-Flavor: Google' response header is "
                    f"missing (HTTP {response.status_code}, "
                    f"{response.headers.get('Content-Type', 'no content type')}, body "
                    f"{snippet(response.text, 80)!r}). A proxy or captive portal may be "
                    f"intercepting {self.host}. {advice}"
                )
            if response.status_code == 404:
                return None
            if response.status_code >= 500 and attempt + 1 < self.attempts:
                time.sleep(0.1 * (2**attempt))
                continue
            if response.status_code != 200:
                raise UnavailableError(
                    f"{where} refused GET {url} ({what}) with HTTP {response.status_code}: "
                    f"{snippet(response.text, 160)!r}. It refuses requests without the "
                    "Metadata-Flavor header and requests relayed by a proxy (X-Forwarded-For)."
                )
            return response.text
        raise AssertionError("unreachable: the last attempt returns or raises")

    def project_id(self, *, otherwise: str = "") -> str:
        return self.get("project/project-id", what="the project id", otherwise=otherwise).strip()

    def zone(self, *, otherwise: str = "") -> str:
        """This VM's zone, e.g. ``us-central2-b`` (the server says ``projects/N/zones/Z``)."""
        raw = self.get("instance/zone", what="the zone", otherwise=otherwise).strip()
        zone = raw.rsplit("/", 1)[-1]
        if not zone:
            raise UnavailableError(
                f"the GCE metadata server at {self.host} answered instance/zone with {raw!r}; "
                "expected 'projects/<number>/zones/<zone>'"
            )
        return zone

    def attribute(self, key: str, *, what: str) -> str | None:
        """Instance attribute ``key`` (``None`` when the VM has none by that name)."""
        return self.get_optional(f"instance/attributes/{key}", what=what)


# -- TPU VM ------------------------------------------------------------------------------------

#: Port of each host's address in the worker job of a TPU VM slice: the one Cloud TPU
#: reports in ``networkEndpoints``, so both discovery paths give the same addresses.
TPU_VM_WORKER_PORT = 8470

# PCI ids of Cloud TPU chips (vendor Google): v2/v3, v4, v5e, v5p, v6e. Only a cheap hint
# that this may be a TPU VM; the metadata server has the last word.
_GOOGLE_PCI_VENDOR = "0x1ae0"
_TPU_PCI_DEVICES = frozenset({"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f"})
_TPU_ENV_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(.*?)\s*$")


@dataclass(frozen=True)
class TpuVm:
    """What a TPU VM's metadata says about its slice."""

    worker_id: int
    hosts: list[str]
    accelerator_type: str
    topology: str | None
    env: dict[str, str]

    def addresses(self, port: int = TPU_VM_WORKER_PORT) -> list[str]:
        return [f"[{h}]:{port}" if ":" in h else f"{h}:{port}" for h in self.hosts]


def might_be_tpu_vm() -> bool:
    """Cheap, local check (no network): could this be a Cloud TPU VM?

    True when a metadata server is configured explicitly (``GCE_METADATA_HOST`` or
    ``GCE_METADATA_IP``) or a TPU chip is on the PCI bus.
    """
    if os.environ.get("GCE_METADATA_HOST") or os.environ.get("GCE_METADATA_IP"):
        return True
    for device in glob.glob("/sys/bus/pci/devices/*"):
        try:
            with open(os.path.join(device, "vendor")) as f:
                if f.read().strip() != _GOOGLE_PCI_VENDOR:
                    continue
            with open(os.path.join(device, "device")) as f:
                if f.read().strip() in _TPU_PCI_DEVICES:
                    return True
        except OSError:
            continue
    return False


def parse_worker_endpoints(text: str) -> list[str]:
    """Host IPs, in worker order, from ``worker-network-endpoints`` in either format:
    ``unknown:unknown:10.0.0.2,unknown:unknown:10.0.0.3`` or ``10.0.0.2,10.0.0.3``."""
    hosts: list[str] = []
    for raw in text.strip().split(","):
        entry = raw.strip()
        if not entry:
            continue
        try:
            hosts.append(str(ipaddress.ip_address(entry)))  # the plain-IP format (v4 or v6)
            continue
        except ValueError:
            pass
        parts = entry.split(":")
        host = ":".join(parts[2:]) if len(parts) >= 3 else ""
        if not host:
            raise ValueError(
                f"cannot read entry {entry!r} of the TPU VM metadata attribute "
                f"worker-network-endpoints ({snippet(text, 120)!r}); expected "
                "'<uid>:<worker>:<ip>' triples or plain IPs, separated by commas"
            )
        hosts.append(host)
    if not hosts:
        raise ValueError(
            f"the TPU VM metadata attribute worker-network-endpoints is empty ({text!r}); "
            "expected at least this host's address"
        )
    return hosts


def parse_tpu_env(text: str) -> dict[str, str]:
    """The ``KEY: 'value'`` lines of the ``tpu-env`` attribute as a dict (quotes removed)."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        match = _TPU_ENV_LINE.match(line)
        if match is None:
            continue
        value = match[2]
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[match[1]] = value
    return env


def read_tpu_vm(md: MetadataServer) -> TpuVm | None:
    """This VM's slice from its metadata; ``None`` when it is not a TPU VM (no
    ``accelerator-type`` attribute)."""
    accelerator = md.attribute("accelerator-type", what="telling whether this is a TPU VM")
    if accelerator is None:
        return None
    env_text = md.attribute("tpu-env", what="the TPU slice topology") or ""
    env = parse_tpu_env(env_text)
    worker_text = md.attribute("agent-worker-number", what="this TPU host's worker number")
    if worker_text is None:
        worker_text = env.get("WORKER_ID")
    if worker_text is None or not worker_text.strip().isdigit():
        raise ValueError(
            "this TPU VM's metadata has no usable worker number: agent-worker-number is "
            f"{worker_text!r}; expected a non-negative integer such as '0'"
        )
    endpoints = md.attribute("worker-network-endpoints", what="the hosts of this TPU slice")
    if endpoints is None:
        # A single-host VM may omit it; its only worker is itself.
        own_ip = md.get("instance/network-interfaces/0/ip", what="this TPU VM's address")
        endpoints = own_ip.strip()
    hosts = parse_worker_endpoints(endpoints)
    worker_id = int(worker_text.strip())
    if worker_id >= len(hosts):
        raise ValueError(
            f"this TPU VM's agent-worker-number is {worker_id}, but worker-network-endpoints "
            f"lists only {len(hosts)} hosts ({', '.join(hosts)}); expected 0..{len(hosts) - 1}"
        )
    return TpuVm(
        worker_id=worker_id,
        hosts=hosts,
        accelerator_type=accelerator.strip(),
        topology=env.get("TOPOLOGY") or None,
        env=env,
    )
