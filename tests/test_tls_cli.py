"""`jaxcluster tls make-ca` / `issue` (jaxcluster.pki): certificates a real worker serves
and a real coordinator verifies; and the warning when a token would travel in clear text."""

from __future__ import annotations

import logging
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from jaxcluster import ClusterSpec, pki
from jaxcluster._auth import ClearTextTokenWarning, warn_if_token_in_clear
from jaxcluster.cli import main
from jaxcluster.cluster_resolver import SimpleClusterResolver
from jaxcluster.coordinator import ClusterCoordinator
from jaxcluster.errors import UnavailableError
from support.workers import running_worker

TOKEN = "tls-cli-token"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jaxcluster", "tls", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs") / "job"
    made = _cli("make-ca", str(directory))
    assert made.returncode == 0, made.stderr
    assert made.stdout.split() == [str(directory / "ca.pem"), str(directory / "ca.key")]
    issued = _cli("issue", str(directory), "127.0.0.1", "localhost", "n1")
    assert issued.returncode == 0, issued.stderr
    assert issued.stdout.split() == [str(directory / "server.pem"), str(directory / "server.key")]
    return directory


def test_keys_are_private_and_nothing_is_overwritten(certs: Path) -> None:
    for key in ("ca.key", "server.key"):
        assert stat.S_IMODE((certs / key).stat().st_mode) == 0o600
    assert stat.S_IMODE(certs.stat().st_mode) == 0o700
    before = (certs / "ca.key").read_bytes()
    again = _cli("make-ca", str(certs))
    assert again.returncode == 2 and "refusing to replace a CA" in again.stderr
    assert (certs / "ca.key").read_bytes() == before
    clash = _cli("issue", str(certs), "n2")
    assert clash.returncode == 2 and "server.pem already exists" in clash.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["issue", "{missing}", "n1"], "create one first with `jaxcluster tls make-ca"),
        (["issue", "{certs}", "n1:8888", "--name", "x"], "'n1:8888' is not a DNS name"),
        (["issue", "{certs}", "n1", "--name", "ca"], "expected a plain file stem"),
        (["make-ca", "{fresh}", "--days", "0"], "days=0"),
    ],
)
def test_bad_requests_exit_2_saying_what_was_wrong(
    certs: Path, tmp_path: Path, args: list[str], fragment: str
) -> None:
    paths = {"missing": tmp_path / "none", "certs": certs, "fresh": tmp_path / "fresh"}
    result = _cli(*(arg.format(**paths) for arg in args))
    assert result.returncode == 2, result
    assert result.stderr.startswith("jaxcluster tls ") and fragment in result.stderr


def test_a_worker_serves_the_issued_certificate_and_a_coordinator_verifies_it(
    certs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key")]
    with running_worker(args, token=TOKEN) as worker:
        resolver = SimpleClusterResolver(ClusterSpec({"worker": [worker.address]}))
        with ClusterCoordinator(resolver, auth_token=TOKEN, tls_ca=certs / "ca.pem") as coord:
            values = [coord.schedule(lambda x: x + 1, args=(i,)) for i in range(3)]
            assert coord.join(timeout=120)
            assert coord.fetch(values) == [1, 2, 3]

        # Another job's CA (a squatter's certificate would be signed by it, or by none)
        # does not verify: the coordinator gives up on the worker and runs nothing there.
        monkeypatch.setenv("JAXCLUSTER_WORKER_RECOVERY_SEC", "2")
        other = tmp_path / "other"
        pki.make_ca(other)
        with ClusterCoordinator(resolver, auth_token=TOKEN, tls_ca=other / "ca.pem") as coord:
            value = coord.schedule(lambda: 1)
            with pytest.raises(UnavailableError) as caught:
                value.fetch(timeout=120)
        assert "certificate" in str(caught.value).lower(), caught.value


def test_without_cryptography_the_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "cryptography", None)  # import now raises ImportError
    with pytest.raises(pki.MissingTLSExtraError, match=r"pip install 'jaxcluster\[tls\]'"):
        pki.make_ca(tmp_path / "ca")
    assert main(["tls", "make-ca", str(tmp_path / "ca")]) == 2
    assert "pip install 'jaxcluster[tls]'" in capsys.readouterr().err


def test_the_token_in_clear_text_off_loopback_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("jaxcluster.coordinator")
    with (
        caplog.at_level(logging.WARNING, logger="jaxcluster"),
        pytest.warns(ClearTextTokenWarning, match="clear text to workers 10.0.0.7:8888") as shown,
    ):
        exposed = warn_if_token_in_clear(
            ["10.0.0.7:8888", "127.0.0.2:8888", "[::1]:1", "localhost:2"], "t", None, log, "workers"
        )
    assert exposed == ["10.0.0.7:8888"]
    # Shown even where logging is not configured, and pointed at the caller's line.
    assert len(shown) == 1 and issubclass(shown[0].category, RuntimeWarning)
    assert shown[0].filename == __file__
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.name == "jaxcluster.coordinator"
    assert "clear text to workers 10.0.0.7:8888" in record.getMessage()
    assert "jaxcluster tls make-ca" in record.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jaxcluster"), warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is warned either
        assert warn_if_token_in_clear(["10.0.0.7:8888"], "t", b"pem", log, "workers") == []
        assert warn_if_token_in_clear(["10.0.0.7:8888"], None, None, log, "workers") == []
    assert not caplog.records


def test_a_coordinator_warns_once_when_its_workers_are_off_loopback_without_tls(
    certs: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker really is on loopback (tests send no traffic elsewhere); the check is
    # told it is not, to see the coordinator consult it with its real token and CA.
    monkeypatch.setattr("jaxcluster._auth._is_loopback", lambda address: False)
    with running_worker([], token=TOKEN) as worker:
        resolver = SimpleClusterResolver(ClusterSpec({"worker": [worker.address]}))
        with (
            caplog.at_level(logging.WARNING, logger="jaxcluster"),
            pytest.warns(ClearTextTokenWarning, match=worker.address) as shown,
            ClusterCoordinator(resolver, auth_token=TOKEN) as coordinator,
        ):
            assert coordinator.fetch(coordinator.schedule(lambda: 2)) == 2
        records = [r for r in caplog.records if "clear text" in r.getMessage()]
        assert len(records) == 1 and records[0].name == "jaxcluster.coordinator"
        assert worker.address in records[0].getMessage()
        # The warning points at the line that made the coordinator, not into jaxcluster.
        # (pytest.warns records every warning raised meanwhile, whatever its category: the
        # lowest declared jax and pytest add two from the standard library's dis module.)
        ours = [w for w in shown if issubclass(w.category, ClearTextTokenWarning)]
        assert [w.filename for w in ours] == [__file__]
    caplog.clear()
    args = ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key")]
    with running_worker(args, token=TOKEN) as worker:
        resolver = SimpleClusterResolver(ClusterSpec({"worker": [worker.address]}))
        with (
            caplog.at_level(logging.WARNING, logger="jaxcluster"),
            ClusterCoordinator(resolver, auth_token=TOKEN, tls_ca=certs / "ca.pem") as c,
        ):
            assert c.fetch(c.schedule(lambda: 3)) == 3
        assert not [r for r in caplog.records if "clear text" in r.getMessage()]
