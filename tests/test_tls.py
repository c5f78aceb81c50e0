"""Optional TLS (SPEC §7): workers and ps tasks serve with --tls-cert/--tls-key, clients
verify them against tls_ca; plaintext or a foreign CA fails before anything runs."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from jaxcluster import ClusterSpec
from jaxcluster._native import core
from jaxcluster.cluster_resolver import SimpleClusterResolver
from jaxcluster.coordinator import ClusterCoordinator
from jaxcluster.errors import UnavailableError
from jaxcluster.strategy import ParameterServerStrategy, ParameterServerVariable
from support.pki import Pki, make_pki
from support.workers import WorkerProc, launch, running_worker

# Closures defined here travel by value: workers cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TOKEN = "test-token"
DEADLINE = 120.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, a server certificate it signed for 127.0.0.1/localhost, and an unrelated CA."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_worker(pki: Pki) -> Iterator[WorkerProc]:
    args = ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key)]
    # Closures on this worker reach TLS parameter servers with the CA from its environment.
    with running_worker(args, token=TOKEN, env={"JAXCLUSTER_TLS_CA": str(pki.ca)}) as worker:
        yield worker


def test_a_tls_worker_serves_get_status_to_a_client_with_its_ca(
    tls_worker: WorkerProc, pki: Pki
) -> None:
    client = core.WorkerClient(tls_worker.address, auth_token=TOKEN, tls_ca=pki.ca.read_bytes())
    status = client.get_status()
    assert status["worker_index"] == 0
    assert status["state"] == "serving"
    # Verified by name instead of the address's IP: the certificate also names localhost.
    by_name = core.WorkerClient(
        tls_worker.address, auth_token=TOKEN, tls_ca=pki.ca.read_bytes(), tls_domain="localhost"
    )
    assert by_name.get_status()["pid"] == status["pid"]


def _registered(worker: WorkerProc, pki: Pki) -> int:
    client = core.WorkerClient(worker.address, auth_token=TOKEN, tls_ca=pki.ca.read_bytes())
    return int(client.get_status()["functions_registered"])


@pytest.mark.parametrize("ca", ["none", "other"])
def test_a_plaintext_or_foreign_ca_client_fails_and_nothing_runs(
    tls_worker: WorkerProc, pki: Pki, ca: str
) -> None:
    before = _registered(tls_worker, pki)
    tls_ca = None if ca == "none" else pki.other_ca.read_bytes()
    client = core.WorkerClient(
        tls_worker.address, auth_token=TOKEN, tls_ca=tls_ca, connect_timeout=5.0, timeout=10.0
    )
    payload = b"\x80\x05K\x01."
    with pytest.raises(Exception) as caught:
        client.register_function(hashlib.sha256(payload).digest(), "cloudpickle", payload)
    message = str(caught.value)
    assert tls_worker.address in message, message
    if ca == "other":
        # rustls says why the handshake failed: the certificate's issuer is not trusted.
        assert "certificate" in message.lower(), message
    else:
        # The plaintext side sees either the server's TLS alert read as an HTTP/2 frame
        # (then the message says to pass tls_ca=) or, when its write loses the race, a
        # closed connection; a coordinator names the fix in both cases (test below).
        hinted = "may be serving TLS" in message and "tls_ca=" in message
        hung_up = any(sign in message for sign in ("broken pipe", "reset", "connection closed"))
        assert hinted or hung_up, message
    assert _registered(tls_worker, pki) == before


def test_a_coordinator_with_tls_ca_schedules_and_fetches(tls_worker: WorkerProc, pki: Pki) -> None:
    resolver = SimpleClusterResolver(ClusterSpec({"worker": [tls_worker.address]}))
    with ClusterCoordinator(resolver, auth_token=TOKEN, tls_ca=str(pki.ca)) as coordinator:
        values = [coordinator.schedule(lambda x: x * x, args=(i,)) for i in range(4)]
        assert coordinator.join(timeout=DEADLINE)
        assert coordinator.fetch(values) == [0, 1, 4, 9]


def test_a_plaintext_coordinator_gives_up_on_a_tls_worker_saying_why(
    tls_worker: WorkerProc, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAXCLUSTER_WORKER_RECOVERY_SEC", "2")
    before = _registered(tls_worker, pki)
    resolver = SimpleClusterResolver(ClusterSpec({"worker": [tls_worker.address]}))
    with ClusterCoordinator(resolver, auth_token=TOKEN) as coordinator:
        value = coordinator.schedule(lambda: 1)
        with pytest.raises(UnavailableError) as caught:
            value.fetch(timeout=DEADLINE)
    message = str(caught.value)
    # The closure's error carries the worker's last failure, not only "given up".
    assert "given up" in message and tls_worker.address in message, message
    # Which error the plaintext side sees first races ("frame with invalid size" or a broken
    # pipe); either way the message points at the TLS settings.
    assert "tls_ca=" in message and "TLS" in message, message
    assert _registered(tls_worker, pki) == before


def add_ones(total: ParameterServerVariable) -> Any:
    total.assign_add(np.ones(3, np.float32))
    return total.read_value()


def test_a_tls_ps_serves_variables_to_the_strategy_and_to_workers(
    tls_worker: WorkerProc, pki: Pki
) -> None:
    ps = core.PsServer(
        "127.0.0.1:0",
        auth_token=TOKEN,
        tls_cert=pki.cert.read_bytes(),
        tls_key=pki.key.read_bytes(),
    )
    try:
        spec = ClusterSpec({"worker": [tls_worker.address], "ps": [ps.address]})
        strategy = ParameterServerStrategy(
            SimpleClusterResolver(spec), auth_token=TOKEN, tls_ca=pki.ca.read_bytes()
        )
        assert strategy.tls_ca == pki.ca.read_bytes()
        with strategy.scope():
            total = strategy.Variable(np.zeros(3, np.float32), name="total")
        # Both spellings take the strategy's CA for the TLS workers (SPEC writes it positionally).
        with ClusterCoordinator(strategy) as coordinator:
            added = coordinator.schedule(add_ones, args=(total,))
            np.testing.assert_array_equal(added.fetch(timeout=DEADLINE), np.ones(3))
        with ClusterCoordinator(strategy=strategy) as coordinator:
            added = coordinator.schedule(add_ones, args=(total,))
            np.testing.assert_array_equal(added.fetch(timeout=DEADLINE), np.full(3, 2.0))
        np.testing.assert_array_equal(total.read_value(), np.full(3, 2.0, np.float32))
        plain = core.PsClient(ps.address, auth_token=TOKEN, connect_timeout=5.0, timeout=10.0)
        with pytest.raises(Exception, match=ps.address.replace(".", r"\.")):
            plain.read("total")
    finally:
        ps.shutdown()


@pytest.mark.parametrize("job", ["worker", "ps"])
@pytest.mark.parametrize("given", ["--tls-cert", "--tls-key"])
def test_one_tls_flag_without_the_other_exits_2_naming_both(pki: Pki, job: str, given: str) -> None:
    path = pki.cert if given == "--tls-cert" else pki.key
    done = subprocess.run(
        [sys.executable, "-m", f"jaxcluster.{job}", given, str(path)],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    assert "--tls-cert" in done.stderr and "--tls-key" in done.stderr, done.stderr
    assert done.stdout == ""


def test_a_key_given_as_the_certificate_is_refused_naming_the_files(pki: Pki) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxcluster.ps",
            "--tls-cert",
            str(pki.key),
            "--tls-key",
            str(pki.key),
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    assert "tls_cert is not a usable PEM file" in done.stderr, done.stderr
    assert str(pki.key) in done.stderr and "CERTIFICATE" in done.stderr, done.stderr


def test_tls_still_needs_a_token_off_loopback(pki: Pki) -> None:
    with pytest.raises(ValueError, match="token"):
        core.WorkerServer("0.0.0.0:0", tls_cert=pki.cert.read_bytes(), tls_key=pki.key.read_bytes())


def test_bad_client_tls_settings_are_refused(pki: Pki) -> None:
    with pytest.raises(ValueError, match="tls_domain"):
        core.WorkerClient("127.0.0.1:1", tls_domain="localhost")
    with pytest.raises(ValueError, match="tls_ca"):
        core.PsClient("127.0.0.1:1", tls_ca=pki.key.read_bytes())
    with pytest.raises(ValueError, match="cannot read tls_ca file"):
        ClusterCoordinator(
            SimpleClusterResolver(ClusterSpec({"worker": ["127.0.0.1:1"]})),
            tls_ca=str(pki.ca) + ".missing",
        )


def test_a_key_that_does_not_match_the_certificate_is_refused(pki: Pki, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger.key"
    stranger.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxcluster.worker",
            "--tls-cert",
            str(pki.cert),
            "--tls-key",
            str(stranger),
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    assert "does the key belong to the certificate?" in done.stderr, done.stderr
    assert str(stranger) in done.stderr, done.stderr


def _slice_probe() -> tuple[int, int]:
    import jax

    return jax.process_count(), jax.device_count()


def test_a_slice_of_tls_hosts_forwards_over_tls(pki: Pki) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    common = ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key), "--no-restart"]
    common += ["--slice-size", "2", "--slice-coordinator", f"127.0.0.1:{port}"]
    env = {"JAXCLUSTER_TLS_CA": str(pki.ca), "JAX_PLATFORMS": "cpu"}
    # Both hosts start before either listens: a slice host serves once its slice formed.
    hosts = [launch([*common, "--index", str(i)], token=TOKEN, env=env) for i in range(2)]
    try:
        for host in hosts:
            host.wait_listening()
        leader, peer = hosts
        with ClusterCoordinator(
            slices=[[leader.address, peer.address]], auth_token=TOKEN, tls_ca=str(pki.ca)
        ) as coordinator:
            assert coordinator.schedule(_slice_probe).fetch() == (2, 2)
        client = core.WorkerClient(peer.address, TOKEN, tls_ca=pki.ca.read_bytes())
        assert client.get_status()["closures_run"] >= 1  # rank 0 forwarded it over TLS
    finally:
        for host in hosts:
            host.finish(kill=True)


def test_a_tls_slice_host_without_a_ca_for_its_peers_is_refused(pki: Pki) -> None:
    args = ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key), "--no-restart"]
    args += ["--slice-size", "2", "--slice-coordinator", "127.0.0.1:1", "--index", "0"]
    done = subprocess.run(
        [sys.executable, "-m", "jaxcluster.worker", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**_env_without_ca(), "JAXCLUSTER_AUTH_TOKEN": TOKEN},
    )
    assert done.returncode == 2, done.stderr
    assert "set JAXCLUSTER_TLS_CA to the CA" in done.stderr


def _env_without_ca() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "JAXCLUSTER_TLS_CA"}
