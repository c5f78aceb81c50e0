"""Bearer-token auth on every RPC: a missing or wrong token runs nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jaxcluster import wire
from jaxcluster._native import core
from jaxcluster.coordinator import functions
from jaxcluster.errors import UnauthenticatedError
from support.workers import WorkerProc, launch, running_worker

TOKEN = "auth-test-token"


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProc]:
    with running_worker(["--index", "1"], token=TOKEN) as w:
        yield w


@pytest.mark.parametrize("token", [None, "wrong-token", TOKEN + "x", TOKEN[:-1]])
def test_missing_or_wrong_token_is_refused_and_nothing_runs(
    worker: WorkerProc, token: str | None, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"

    def leaves_a_mark() -> str:
        marker.write_text("ran")
        return "ran"

    authorised = worker.client(TOKEN)
    payload = functions.pickle_function(leaves_a_mark)
    authorised.register_function(payload.function_hash, payload.kind, payload.payload)
    before = authorised.get_status()

    intruder = core.WorkerClient(worker.address, auth_token=token)
    with pytest.raises(UnauthenticatedError, match="token"):
        intruder.run_closure(payload.function_hash, closure_id=1)
    with pytest.raises(UnauthenticatedError):
        intruder.create_resource(1, payload.function_hash)
    other = functions.pickle_function(lambda: "other")
    with pytest.raises(UnauthenticatedError):
        intruder.register_function(other.function_hash, other.kind, other.payload)
    with pytest.raises(UnauthenticatedError):
        intruder.get_status()
    with pytest.raises(UnauthenticatedError):
        intruder.list_devices()

    after = authorised.get_status()
    assert not marker.exists()
    assert after["closures_run"] == before["closures_run"]
    assert after["resources_created"] == before["resources_created"]
    assert after["functions_registered"] == before["functions_registered"]
    assert after["unauthenticated_requests"] == before["unauthenticated_requests"] + 5

    # The same function does run for the right token, so the marker check above means
    # something.
    reply = authorised.run_closure(payload.function_hash, closure_id=2)
    assert wire.decode(reply["value"], reply["buffers"]) == "ran"
    assert marker.read_text() == "ran"


def test_a_non_loopback_bind_without_a_token_is_refused() -> None:
    worker = launch(["--address", "0.0.0.0:0"], token=None)
    assert worker.finish() == 2
    assert worker.lines == []  # never announced itself
    assert "without an auth token" in worker.stderr and "0.0.0.0" in worker.stderr


def test_the_server_api_refuses_it_too() -> None:
    with pytest.raises(ValueError, match="without an auth token"):
        core.WorkerServer("0.0.0.0:0")
    # With a token the same bind is allowed.
    server = core.WorkerServer("0.0.0.0:0", auth_token=TOKEN)
    try:
        assert server.port > 0
    finally:
        server.shutdown(timeout=5.0)


def test_tokens_that_cannot_travel_in_a_header_are_refused() -> None:
    with pytest.raises(ValueError, match="auth token"):
        core.WorkerServer("127.0.0.1:0", auth_token="has space")
    with pytest.raises(Exception, match="auth token"):
        core.WorkerClient("127.0.0.1:1", auth_token="")
