"""Which TPU a ``TPUClusterResolver`` means: its ``tpu`` argument or the environment.

Order, as in TF: the ``tpu`` argument, ``KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS`` (set by GKE),
``TPU_NAME``, then ``TPU_CONFIG`` (JSON with ``tpu_node_name``, ``project``, ``zone``). A value
starting with ``grpc://`` is a list of worker addresses that needs no API
(``grpc://10.0.0.2:8470,grpc://10.0.0.3``; the port defaults to 8470); ``local`` means the chips
attached to this VM; anything else is a Cloud TPU node name.

Example::

    target = resolve_target("grpc://10.0.0.2,10.0.0.3:8471")
    target.endpoints    # [('10.0.0.2', 8470), ('10.0.0.3', 8471)]
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_TPU_PORT",
    "TPU_NAME_ENV_VARS",
    "TpuTarget",
    "parse_grpc_endpoints",
    "resolve_target",
]

#: Port of a TPU worker when a ``grpc://`` address gives none.
DEFAULT_TPU_PORT = 8470
#: Environment variables naming the TPU, in the order they are consulted.
TPU_NAME_ENV_VARS = ("KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_NAME")
_GRPC = "grpc://"
# Cloud TPU node names: lower-case letters, digits and hyphens, starting with a letter.
_NODE_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class TpuTarget:
    """A resolved ``tpu`` argument. ``kind`` is ``"local"``, ``"grpc"`` or ``"node"``."""

    kind: str
    name: str
    source: str
    endpoints: list[tuple[str, int]] = field(default_factory=list)
    project: str | None = None
    zone: str | None = None


def _as_text(value: object, what: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{what} {value!r} is bytes that are not valid UTF-8") from None
    if isinstance(value, str):
        return value
    raise TypeError(
        f"{what} must be a TPU name, 'grpc://host:port' or 'local'; "
        f"got {type(value).__name__}: {value!r}"
    )


def parse_grpc_endpoints(text: str, source: str) -> list[tuple[str, int]]:
    """``[(host, port), ...]`` from ``grpc://h1[:p1],[grpc://]h2[:p2],...``."""
    endpoints: list[tuple[str, int]] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        address = entry.removeprefix(_GRPC)
        host, port_text = _split(address)
        if not host:
            raise ValueError(f"{source}: entry {entry!r} of {text!r} has no host")
        port = DEFAULT_TPU_PORT
        if port_text is not None:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise ValueError(
                    f"{source}: entry {entry!r} of {text!r} has port {port_text!r}; expected "
                    "a number from 1 to 65535 (or no port, meaning 8470)"
                )
            port = int(port_text)
        endpoints.append((host, port))
    if not endpoints:
        raise ValueError(f"{source} is {text!r}, a grpc:// list with no addresses")
    return endpoints


def _split(address: str) -> tuple[str, str | None]:
    if address.startswith("["):  # [v6]:port
        end = address.find("]")
        if end == -1:
            return "", None
        rest = address[end + 1 :]
        return address[1:end], (rest[1:] if rest.startswith(":") else None)
    host, sep, port = address.rpartition(":")
    if not sep:
        return address, None
    return host, port


def _tpu_config() -> TpuTarget | None:
    raw = os.environ.get("TPU_CONFIG")
    if not raw:
        return None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"TPU_CONFIG is not valid JSON ({exc.msg} at character {exc.pos}): {raw!r}; "
            'expected e.g. {"tpu_node_name": "my-tpu", "project": "p", "zone": "us-central1-b"}'
        ) from None
    if not isinstance(config, dict) or not isinstance(config.get("tpu_node_name"), str):
        raise ValueError(
            f"TPU_CONFIG is {raw!r}; expected a JSON object with a string 'tpu_node_name' "
            "(and optionally 'project' and 'zone')"
        )
    for key in ("project", "zone"):
        if config.get(key) is not None and not isinstance(config[key], str):
            raise ValueError(f"TPU_CONFIG {key!r} is {config[key]!r}; expected a string")
    name = config["tpu_node_name"]
    return _classify(name, "TPU_CONFIG", config.get("project"), config.get("zone"))


def _classify(
    name: str, source: str, project: str | None = None, zone: str | None = None
) -> TpuTarget:
    name = name.strip()
    if name == "local":
        return TpuTarget("local", name, source)
    if name.startswith(_GRPC):
        return TpuTarget("grpc", name, source, parse_grpc_endpoints(name, source))
    if not _NODE_NAME.match(name):
        hint = ""
        if ":" in name or re.match(r"^\d+\.\d+\.\d+\.\d+$", name):
            hint = f"; for worker addresses use 'grpc://{name}'"
        raise ValueError(
            f"{source} is {name!r}, which is not a Cloud TPU node name (lower-case letters, "
            f"digits and hyphens, starting with a letter){hint}; also accepted: "
            "'grpc://host[:port][,...]' and 'local'"
        )
    return TpuTarget("node", name, source, project=project, zone=zone)


def resolve_target(tpu: object) -> TpuTarget:
    """The TPU meant by the ``tpu`` argument (a name, a one-element list, bytes, or ``None``
    to look in the environment)."""
    if isinstance(tpu, Sequence) and not isinstance(tpu, (str, bytes)):
        if not tpu:
            raise ValueError("tpu is an empty list; expected one TPU name")
        if len(tpu) != 1:
            raise NotImplementedError(
                f"tpu lists {len(tpu)} TPUs ({list(tpu)!r}); one resolver handles one TPU. "
                "Use a UnionClusterResolver over one TPUClusterResolver per TPU (each TPU is "
                "then one slice for ClusterCoordinator)."
            )
        tpu = tpu[0]
    if tpu is not None:
        text = _as_text(tpu, "tpu")
        if not text.strip():
            # TF's sentence first: code (and TF's own test) matches it.
            raise ValueError(
                "Please provide a TPU Name to connect to: tpu is an empty string; expected a "
                "TPU name, grpc:// or 'local'"
            )
        return _classify(text, "the tpu argument")
    for var in TPU_NAME_ENV_VARS:
        value = os.environ.get(var)
        if value and value.strip():
            return _classify(value, var)
    config = _tpu_config()
    if config is not None:
        return config
    raise ValueError(
        "no TPU to resolve: tpu= was not given and none of KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS, "
        "TPU_NAME, TPU_CONFIG is set. Pass tpu='<node name>', tpu='grpc://<ip>[:port]', or "
        "tpu='local' for the chips attached to this TPU VM."
    )
