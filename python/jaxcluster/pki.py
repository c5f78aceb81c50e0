"""A private CA and the server certificates it signs, for running a cluster over TLS without
knowing ``openssl``: what ``jaxcluster tls make-ca`` and ``jaxcluster tls issue`` write.

Keys are ECDSA P-256 in PKCS#8 PEM, readable by their owner only (mode 0600). A server
certificate names every host clients dial it by (DNS names and IP addresses both work) and
is valid for TLS servers only; the CA can sign nothing but end certificates. Needs the
``cryptography`` package: ``pip install 'jaxcluster[tls]'``.

Example::

    from jaxcluster import pki
    ca = pki.make_ca("certs")                       # certs/ca.pem, certs/ca.key
    cert, key = pki.issue("certs", ["n1", "n2", "10.0.0.7"])   # certs/server.pem/.key
    # jaxcluster worker --tls-cert certs/server.pem --tls-key certs/server.key ...
    # ClusterCoordinator(resolver, tls_ca="certs/ca.pem")
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

__all__ = [
    "CA_CERT_FILE",
    "CA_KEY_FILE",
    "DEFAULT_DAYS",
    "MissingTLSExtraError",
    "issue",
    "make_ca",
]

CA_CERT_FILE = "ca.pem"
CA_KEY_FILE = "ca.key"
DEFAULT_DAYS = 365
# A certificate is valid from a little before it is made: clocks of a cluster's nodes differ.
_CLOCK_SKEW = datetime.timedelta(minutes=10)


class MissingTLSExtraError(ImportError):
    """``cryptography`` is not installed; the message gives the pip line that adds it."""


def _crypto() -> Any:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as exc:
        raise MissingTLSExtraError(
            "making TLS certificates needs the 'cryptography' package, which is not "
            f"installed ({exc}); install it with: pip install 'jaxcluster[tls]'"
        ) from exc

    return SimpleNamespace(
        x509=x509,
        hashes=hashes,
        serialization=serialization,
        ec=ec,
        ExtendedKeyUsageOID=ExtendedKeyUsageOID,
        NameOID=NameOID,
    )


def _write_private(path: Path, data: bytes, force: bool) -> None:
    """Writes ``data`` to ``path`` readable by the owner only; never replaces a file unless
    ``force`` (a key lost by accident cannot be recovered)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise FileExistsError(
            f"{path} already exists; refusing to replace it (pass force=True, or --force, "
            "to overwrite)"
        ) from None
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(data)


def _write_public(path: Path, data: bytes, force: bool) -> None:
    if path.exists() and not force:
        raise FileExistsError(
            f"{path} already exists; refusing to replace it (pass force=True, or --force, "
            "to overwrite)"
        )
    path.write_bytes(data)


def _check_days(days: int) -> None:
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ValueError(f"days={days!r}; expected a whole number of days, 1 or more")


def _directory(directory: str | os.PathLike[str]) -> Path:
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path} exists and is not a directory")
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def _key_pem(c: Any, key: Any) -> bytes:
    return key.private_bytes(
        c.serialization.Encoding.PEM,
        c.serialization.PrivateFormat.PKCS8,
        c.serialization.NoEncryption(),
    )


def _key_usage(c: Any, *, ca: bool) -> Any:
    return c.x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def make_ca(
    directory: str | os.PathLike[str],
    *,
    common_name: str = "jaxcluster CA",
    days: int = DEFAULT_DAYS,
    force: bool = False,
) -> Path:
    """Creates ``directory/ca.pem`` (the certificate clients trust) and ``directory/ca.key``
    (keep it private: whoever has it can impersonate any task); returns the ``ca.pem`` path.

    ``FileExistsError`` when either file exists, unless ``force``.
    """
    _check_days(days)
    c = _crypto()
    path = _directory(directory)
    key = c.ec.generate_private_key(c.ec.SECP256R1())
    name = c.x509.Name([c.x509.NameAttribute(c.NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        c.x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(c.x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(c.x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(c, ca=True), critical=True)
        .add_extension(c.x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, c.hashes.SHA256())
    )
    if not force:
        for existing in (path / CA_CERT_FILE, path / CA_KEY_FILE):
            if existing.exists():
                raise FileExistsError(
                    f"{existing} already exists; refusing to replace a CA (pass force=True, "
                    "or --force, to overwrite)"
                )
    _write_private(path / CA_KEY_FILE, _key_pem(c, key), force)
    _write_public(path / CA_CERT_FILE, cert.public_bytes(c.serialization.Encoding.PEM), force)
    return path / CA_CERT_FILE


def _san(c: Any, host: str) -> Any:
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return c.x509.IPAddress(ipaddress.ip_address(text))
    except ValueError:
        pass
    if not text or any(ch.isspace() or ch in "/:@" for ch in text):
        raise ValueError(
            f"host {host!r} is not a DNS name or an IP address; expected e.g. 'n1', "
            "'node1.cluster.local' or '10.0.0.7' (no port)"
        )
    return c.x509.DNSName(text)


def _load_ca(c: Any, path: Path) -> tuple[Any, Any]:
    cert_file, key_file = path / CA_CERT_FILE, path / CA_KEY_FILE
    try:
        cert = c.x509.load_pem_x509_certificate(cert_file.read_bytes())
        key = c.serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"no CA in {path}: {exc.filename} is missing; create one first with "
            f"`jaxcluster tls make-ca {path}`"
        ) from None
    except ValueError as exc:
        raise ValueError(f"cannot load the CA in {path} ({cert_file}, {key_file}): {exc}") from exc
    return cert, key


def issue(
    directory: str | os.PathLike[str],
    hosts: Sequence[str],
    *,
    name: str = "server",
    days: int = DEFAULT_DAYS,
    force: bool = False,
) -> tuple[Path, Path]:
    """Signs a server certificate for ``hosts`` with the CA in ``directory``; writes
    ``directory/<name>.pem`` and ``directory/<name>.key`` and returns their paths.

    Every name or address a client will dial this server by must be in ``hosts``.
    ``FileNotFoundError`` without a CA there; ``ValueError`` for a host that is neither a
    DNS name nor an IP address.
    """
    _check_days(days)
    if isinstance(hosts, str):
        raise TypeError(f"hosts must be a list of host names; got the string {hosts!r}")
    if not hosts:
        raise ValueError("hosts is empty; expected the names clients dial this server by")
    if not name or "/" in name or name.startswith(".") or name == "ca":
        raise ValueError(f"name={name!r}; expected a plain file stem such as 'server' or 'n1'")
    c = _crypto()
    path = Path(directory)
    ca_cert, ca_key = _load_ca(c, path)
    names = [_san(c, host) for host in hosts]
    key = c.ec.generate_private_key(c.ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = c.x509.Name([c.x509.NameAttribute(c.NameOID.COMMON_NAME, str(hosts[0])[:64])])
    cert = (
        c.x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(c.x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(c.x509.SubjectAlternativeName(names), critical=False)
        .add_extension(c.x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(c, ca=False), critical=True)
        .add_extension(c.x509.ExtendedKeyUsage([c.ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(
            c.x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, c.hashes.SHA256())
    )
    cert_path, key_path = path / f"{name}.pem", path / f"{name}.key"
    if not force:
        for existing in (cert_path, key_path):
            if existing.exists():
                raise FileExistsError(
                    f"{existing} already exists; refusing to replace it (pass force=True, "
                    "or --force, to overwrite)"
                )
    _write_private(key_path, _key_pem(c, key), force)
    _write_public(cert_path, cert.public_bytes(c.serialization.Encoding.PEM), force)
    return cert_path, key_path
