"""``ParameterServerStrategy.wait_for_ps``: returns once every ps task answers, waits for
one that starts late, and names the ones that never answer after its timeout."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from jaxcluster.cluster_resolver import SimpleClusterResolver
from jaxcluster.errors import DeadlineExceededError, UnauthenticatedError
from jaxcluster.local_cluster import LocalCluster
from jaxcluster.strategy import ParameterServerStrategy


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(num_workers=1, num_ps=2) as c:
        yield c


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """An address that accepts TCP connections and never answers a request."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


def closed_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def strategy_with_ps(cluster: LocalCluster, ps: list[str]) -> ParameterServerStrategy:
    resolver = SimpleClusterResolver({"worker": cluster.addresses, "ps": ps})
    return ParameterServerStrategy(resolver, auth_token=cluster.auth_token)


def test_returns_at_once_when_every_ps_answers(cluster: LocalCluster) -> None:
    strategy = ParameterServerStrategy(cluster.resolver, auth_token=cluster.auth_token)
    started = time.monotonic()
    strategy.wait_for_ps(timeout=30)
    assert time.monotonic() - started < 10


def test_waits_for_a_ps_task_that_starts_late(cluster: LocalCluster) -> None:
    strategy = ParameterServerStrategy(cluster.resolver, auth_token=cluster.auth_token)
    cluster.kill_ps(1)
    try:
        with pytest.raises(DeadlineExceededError) as info:
            strategy.wait_for_ps(timeout=0.5)
        assert f"/job:ps/task:1 at {cluster.ps_addresses[1]}" in str(info.value)
        assert "task:0" not in str(info.value)
        outcome: list[BaseException | None] = []
        waiter = threading.Thread(
            target=lambda: outcome.append(_call(strategy.wait_for_ps, 120)), daemon=True
        )
        waiter.start()
        assert waiter.is_alive() and not outcome  # the ps is down: still waiting
    finally:
        cluster.restart_ps(1)
    waiter.join(60)
    assert outcome == [None]


def _call(fn: object, timeout: float) -> BaseException | None:
    try:
        fn(timeout=timeout)  # type: ignore[operator]
    except BaseException as exc:  # reported to the test thread
        return exc
    return None


def test_names_every_ps_task_that_never_answers(
    cluster: LocalCluster, silent_listener: str
) -> None:
    dead = closed_address()
    strategy = strategy_with_ps(cluster, [cluster.ps_addresses[0], dead, silent_listener])
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError) as info:
        strategy.wait_for_ps(timeout=1.5)
    elapsed = time.monotonic() - started
    assert 1.5 <= elapsed < 8, elapsed
    message = str(info.value)
    assert "2 of 3 ps tasks did not answer within 1.5 s" in message
    assert f"/job:ps/task:1 at {dead}" in message
    assert f"/job:ps/task:2 at {silent_listener}" in message
    assert "task:0" not in message


def test_a_wrong_token_fails_at_once_instead_of_waiting(cluster: LocalCluster) -> None:
    resolver = SimpleClusterResolver({"worker": cluster.addresses, "ps": cluster.ps_addresses})
    strategy = ParameterServerStrategy(resolver, auth_token="not-the-token")
    started = time.monotonic()
    with pytest.raises(UnauthenticatedError):
        strategy.wait_for_ps(timeout=60)
    assert time.monotonic() - started < 30


def test_a_negative_timeout_is_refused(cluster: LocalCluster) -> None:
    strategy = ParameterServerStrategy(cluster.resolver, auth_token=cluster.auth_token)
    with pytest.raises(ValueError, match="timeout"):
        strategy.wait_for_ps(timeout=-1)


def test_warns_about_a_ps_task_of_another_jaxcluster_release(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from jaxcluster.strategy import _ps_wait

    strategy = ParameterServerStrategy(cluster.resolver, auth_token=cluster.auth_token)
    with caplog.at_level(logging.WARNING, logger=_ps_wait.__name__):
        strategy.wait_for_ps(timeout=30)
    assert not [r for r in caplog.records if "runs jaxcluster" in r.getMessage()]
    # This process plays another release; the ps tasks report theirs.
    monkeypatch.setattr(_ps_wait, "__version__", "0.0.1")
    with caplog.at_level(logging.WARNING, logger=_ps_wait.__name__):
        strategy.wait_for_ps(timeout=30)
    warnings = [r.getMessage() for r in caplog.records if "runs jaxcluster" in r.getMessage()]
    assert len(warnings) == len(cluster.ps_addresses), warnings
    assert f"at {cluster.ps_addresses[0]} runs jaxcluster" in warnings[0]
    assert "this process jaxcluster 0.0.1" in warnings[0]
