"""The Google plumbing under the GCE and TPU resolvers, against local fake servers: credentials,
retries, timeouts and errors of ``GoogleAPI``, and the GCE metadata client."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from google.auth.credentials import AnonymousCredentials
from google.oauth2.credentials import Credentials

from jaxcluster.cluster_resolver._google import (
    Backoff,
    GoogleAPI,
    GoogleAPIError,
    load_credentials,
)
from jaxcluster.cluster_resolver._tpu_metadata import MetadataServer, metadata_host
from jaxcluster.errors import (
    DeadlineExceededError,
    NotFoundError,
    UnauthenticatedError,
    UnavailableError,
)
from support.cluster_env import clear_cluster_env
from support.gce_metadata import FakeMetadataServer
from support.tpu_api import FakeTPUServer

NODE = "v2/projects/p/locations/z/nodes/n"
FAST = Backoff(attempts=3, initial=0.01, maximum=0.02)
# Timeout tests check only that the bound was honoured at all, not how fast anything is.
SANITY_BOUND = 4.0


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_cluster_env(monkeypatch)
    for name in ("GCE_METADATA_TIMEOUT", "GOOGLE_APPLICATION_CREDENTIALS", "GCE_METADATA_ROOT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def tpu_api() -> Iterator[FakeTPUServer]:
    with FakeTPUServer() as server:
        server.add_node("p", "z", "n", endpoints=[("10.0.0.2", 8470)])
        yield server


def _api(server: FakeTPUServer, credentials: object, **kw: object) -> GoogleAPI:
    return GoogleAPI("Cloud TPU API", server.url, credentials=credentials, **kw)  # type: ignore[arg-type]


def _dead_port() -> int:
    server = FakeTPUServer().start()
    port = server.port
    server.stop()
    return port


# -- credentials ---------------------------------------------------------------------------


def test_oauth_token_is_sent_as_bearer(tpu_api: FakeTPUServer) -> None:
    node = _api(tpu_api, Credentials(token="tok-123")).call(
        "GET", NODE, what="test", permission="tpu.nodes.get"
    )
    assert node["state"] == "READY"
    assert tpu_api.requests[-1].authorization == "Bearer tok-123"


def test_anonymous_credentials_send_no_authorization(tpu_api: FakeTPUServer) -> None:
    _api(tpu_api, AnonymousCredentials()).call("GET", NODE, what="t", permission="x")
    assert tpu_api.requests[-1].authorization is None


def test_default_credentials_come_from_adc_file(
    tpu_api: FakeTPUServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adc = tmp_path / "adc.json"
    adc.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "id.apps.googleusercontent.com",
                "client_secret": "s",
                "refresh_token": "r",
                "token": "adc-token",
                "expiry": "2999-01-01T00:00:00Z",
            }
        )
    )
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    _api(tpu_api, "default").call("GET", NODE, what="t", permission="x")
    assert tpu_api.requests[-1].authorization == "Bearer adc-token"


def test_default_credentials_missing_says_how_to_get_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="Application Default Credentials") as info:
        load_credentials("default")
    assert "gcloud auth application-default login" in str(info.value)
    assert "AnonymousCredentials" in str(info.value)


def test_credentials_that_cannot_refresh_are_unauthenticated(tpu_api: FakeTPUServer) -> None:
    # No token and nothing to refresh one with: google-auth cannot authorise the request.
    with pytest.raises(UnauthenticatedError, match="could not get an access token") as info:
        _api(tpu_api, Credentials(token=None)).call("GET", NODE, what="t", permission="x")
    assert "credentials=" in str(info.value)
    assert tpu_api.requests == []


@pytest.mark.parametrize("bad", ["anonymous", 42, object()])
def test_bad_credentials_are_a_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match=r"google\.auth\.credentials\.Credentials"):
        load_credentials(bad)


def test_service_session_is_used_as_given(tpu_api: FakeTPUServer) -> None:
    session = requests.Session()
    session.headers["X-Test"] = "mine"
    api = GoogleAPI("Cloud TPU API", tpu_api.url, service=session)
    api.call("GET", NODE, what="t", permission="x")
    assert tpu_api.requests[-1].headers["x-test"] == "mine"


def test_discovery_client_service_is_rejected_with_advice(tpu_api: FakeTPUServer) -> None:
    with pytest.raises(TypeError, match="discovery") as info:
        GoogleAPI("Cloud TPU API", tpu_api.url, service=object())
    assert "credentials=" in str(info.value)


@pytest.mark.parametrize("url", ["tpu.googleapis.com", "ftp://x/", "http://", 7])
def test_bad_endpoint_is_rejected(url: object) -> None:
    with pytest.raises(ValueError, match="api_endpoint"):
        GoogleAPI("Cloud TPU API", url, credentials=AnonymousCredentials())  # type: ignore[arg-type]


# -- retries and errors ----------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 503, 429])
def test_transient_failures_are_retried(tpu_api: FakeTPUServer, status: int) -> None:
    tpu_api.fail_next(status, times=2)
    node = _api(tpu_api, AnonymousCredentials(), backoff=FAST).call(
        "GET", NODE, what="t", permission="x"
    )
    assert node["networkEndpoints"][0]["ipAddress"] == "10.0.0.2"
    assert len(tpu_api.requests) == 3


def test_retries_are_bounded(tpu_api: FakeTPUServer) -> None:
    tpu_api.fail_next(503, times=100)
    with pytest.raises(GoogleAPIError, match="after 3 attempts") as info:
        _api(tpu_api, AnonymousCredentials(), backoff=FAST).call(
            "GET", NODE, what="reading the node", permission="x"
        )
    assert info.value.status == 503
    assert len(tpu_api.requests) == 3
    assert "reading the node" in str(info.value)


def test_retry_after_header_is_honoured(tpu_api: FakeTPUServer) -> None:
    tpu_api.fail_next(429, headers={"Retry-After": "0"})
    _api(tpu_api, AnonymousCredentials(), backoff=FAST).call("GET", NODE, what="t", permission="x")
    assert len(tpu_api.requests) == 2


def test_403_names_the_permission_and_the_caller(tpu_api: FakeTPUServer) -> None:
    tpu_api.forbidden.add(("p", "z", "n"))
    with pytest.raises(GoogleAPIError) as info:
        _api(tpu_api, Credentials(token="t")).call("GET", NODE, what="t", permission="tpu.x")
    message = str(info.value)
    assert info.value.status == 403 and info.value.reason == "PERMISSION_DENIED"
    # The permission the server names wins over the one the caller guessed.
    assert "'tpu.nodes.get'" in message and "google.oauth2.credentials.Credentials" in message
    assert len(tpu_api.requests) == 1  # a 403 is not retried


def test_404_is_not_retried_and_quotes_the_api(tpu_api: FakeTPUServer) -> None:
    path = "v2/projects/p/locations/z/nodes/absent"
    with pytest.raises(GoogleAPIError, match="was not found") as info:
        _api(tpu_api, AnonymousCredentials()).call("GET", path, what="t", permission="x")
    assert info.value.status == 404 and info.value.url.endswith(path)
    assert len(tpu_api.requests) == 1


def test_non_json_answer_is_an_error(tpu_api: FakeTPUServer) -> None:
    tpu_api.fail_next(200, body="<html>login page</html>")
    with pytest.raises(GoogleAPIError, match="not a JSON object"):
        _api(tpu_api, AnonymousCredentials()).call("GET", NODE, what="t", permission="x")


def test_slow_api_times_out(tpu_api: FakeTPUServer) -> None:
    tpu_api.delay = 30
    start = time.monotonic()
    with pytest.raises(DeadlineExceededError, match=r"within 0\.3s") as info:
        _api(tpu_api, AnonymousCredentials(), timeout=0.3).call(
            "GET", NODE, what="t", permission="x"
        )
    assert time.monotonic() - start < SANITY_BOUND
    assert isinstance(info.value, TimeoutError) and tpu_api.host in str(info.value)


def test_unreachable_api_is_unavailable_after_retries() -> None:
    port = _dead_port()
    api = GoogleAPI(
        "Cloud TPU API",
        f"http://127.0.0.1:{port}",
        credentials=AnonymousCredentials(),
        backoff=FAST,
    )
    with pytest.raises(UnavailableError, match=f"127.0.0.1:{port}") as info:
        api.call("GET", NODE, what="t", permission="x")
    assert "after 3 attempts" in str(info.value)


# -- the metadata server ------------------------------------------------------------------------


def test_metadata_host_order(monkeypatch: pytest.MonkeyPatch) -> None:
    assert metadata_host() == ("metadata.google.internal", "the default host")
    monkeypatch.setenv("GCE_METADATA_IP", "169.254.169.254")
    assert metadata_host()[0] == "169.254.169.254"
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    assert metadata_host() == ("127.0.0.1:9", "from GCE_METADATA_HOST")


def test_metadata_reads_values_with_the_flavor_header(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeMetadataServer(project_id="proj-7", zone="europe-west4-a") as md:
        monkeypatch.setenv("GCE_METADATA_IP", md.host)
        client = MetadataServer()
        assert client.project_id() == "proj-7"
        assert client.zone() == "europe-west4-a"
        assert all(r.headers.get("metadata-flavor") == "Google" for r in md.requests)
        assert md.paths() == [
            "/computeMetadata/v1/project/project-id",
            "/computeMetadata/v1/instance/zone",
        ]


def test_fake_metadata_server_requires_the_header() -> None:
    with FakeMetadataServer() as md:
        url = f"{md.url}/computeMetadata/v1/project/project-id"
        assert requests.get(url, timeout=5).status_code == 403
        assert requests.get(url, headers={"Metadata-Flavor": "Google"}, timeout=5).text == (
            "test-project"
        )


def test_metadata_missing_key() -> None:
    with FakeMetadataServer() as md:
        client = MetadataServer(md.host)
        assert client.attribute("agent-worker-number", what="t") is None
        with pytest.raises(NotFoundError, match="instance/attributes/nope"):
            client.get("instance/attributes/nope", what="t")


def test_metadata_garbage_is_detected() -> None:
    with FakeMetadataServer() as md:
        md.garbage = True
        with pytest.raises(UnavailableError, match="Metadata-Flavor: Google") as info:
            MetadataServer(md.host).project_id()
        assert "captive portal" in str(info.value)


def test_metadata_slow_honours_gce_metadata_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GCE_METADATA_TIMEOUT", "0.3")
    with FakeMetadataServer() as md:
        md.delay = 30
        start = time.monotonic()
        with pytest.raises(DeadlineExceededError, match=r"within 0\.3s") as info:
            MetadataServer(md.host).project_id()
        assert time.monotonic() - start < SANITY_BOUND
        assert "GCE_METADATA_TIMEOUT" in str(info.value)


def test_metadata_bad_timeout_env_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GCE_METADATA_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="GCE_METADATA_TIMEOUT='soon'"):
        MetadataServer("127.0.0.1:9")


def test_metadata_down_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    port = _dead_port()
    monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{port}")
    with pytest.raises(UnavailableError, match="GCE_METADATA_HOST") as info:
        MetadataServer().zone(otherwise="Pass zone= explicitly.")
    assert f"127.0.0.1:{port}" in str(info.value) and "Pass zone= explicitly." in str(info.value)


def test_metadata_5xx_is_retried() -> None:
    with FakeMetadataServer() as md:
        md.fail_next(503, body="busy", headers={"Metadata-Flavor": "Google"})
        assert MetadataServer(md.host).project_id() == "test-project"
        assert len(md.requests) == 2
