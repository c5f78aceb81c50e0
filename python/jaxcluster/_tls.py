"""The CA clients verify workers and ps tasks against: one reading of ``tls_ca=`` and of
``JAXCLUSTER_TLS_CA``.

A CA is given as PEM bytes, PEM text, or the path of a PEM file. Processes that unpickle
variables (workers) never receive it through pickles: they read ``JAXCLUSTER_TLS_CA``.

Example::

    ca = load_ca("certs/ca.pem")      # PEM bytes, or None when given None
    ca = load_ca(None) or ca_from_env()
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["TLS_CA_ENV", "ca_from_env", "load_ca"]

TLS_CA_ENV = "JAXCLUSTER_TLS_CA"

_PEM_MARK = b"-----BEGIN "


def load_ca(
    value: str | bytes | os.PathLike[str] | None, *, source: str = "tls_ca"
) -> bytes | None:
    """PEM bytes from ``value`` (PEM bytes or text, or a file path); ``None`` stays ``None``.

    Raises ``ValueError`` naming ``source`` when the file cannot be read or holds no PEM.
    """
    if value is None:
        return None
    if isinstance(value, bytes):
        pem, origin = value, f"{source} (bytes)"
    elif isinstance(value, str) and _PEM_MARK.decode() in value:
        pem, origin = value.encode(), f"{source} (PEM text)"
    elif isinstance(value, (str, os.PathLike)):
        path = Path(value)
        try:
            pem = path.read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read {source} file {str(path)!r}: {exc}") from exc
        origin = f"{source} file {str(path)!r}"
    else:
        raise TypeError(f"{source}={value!r}; expected a path, PEM bytes/text, or None")
    if _PEM_MARK not in pem:
        raise ValueError(
            f"{origin} holds no PEM block ({len(pem)} bytes); expected a CA certificate "
            "starting with '-----BEGIN CERTIFICATE-----'"
        )
    return pem


def ca_from_env() -> bytes | None:
    """The CA named by ``JAXCLUSTER_TLS_CA`` (a path or PEM text), or ``None`` when unset."""
    value = os.environ.get(TLS_CA_ENV, "").strip()
    return load_ca(value, source=TLS_CA_ENV) if value else None
