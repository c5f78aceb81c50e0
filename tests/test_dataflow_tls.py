"""Kept values pulled worker to worker under real TLS (SPEC §7, §12): workers serving
``--tls-cert/--tls-key`` verify each other with ``JAXCLUSTER_TLS_CA`` when a consumer on
one reads a value another holds (``ReadValue``); a TLS worker without that CA never dials
its peer in clear text and its consumer fails saying so.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

from jaxcluster import ClusterSpec
from jaxcluster.cluster_resolver import SimpleClusterResolver
from jaxcluster.coordinator import ClusterCoordinator
from jaxcluster.errors import ClosureInputError
from support.closures import TESTS_DIR, barrier, wait_for_file, wait_until
from support.pki import Pki, make_pki
from support.workers import WorkerProc, running_worker

# Closures defined here travel by value: workers cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TOKEN = "test-token"
MIB = 1 << 20
PEER = ("peer_bytes_sent", "peer_bytes_received", "peer_pulls", "peer_reads_served")


def _ones(n: int) -> Any:
    return np.ones(n, np.float32)


def _total(array: Any) -> float:
    return float(array.sum())


def _held(directory: str) -> int:
    """Runs on a worker: both pass the barrier together (so one per worker), then each
    waits for its own gate ``go.<index>``; returns the worker's index."""
    index = barrier(directory, 2)
    assert wait_for_file(Path(directory, f"go.{index}")), f"go.{index} never appeared"
    return index


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@contextlib.contextmanager
def _tls_workers(pki: Pki, *, peer_ca: bool) -> Iterator[list[WorkerProc]]:
    """Two TLS workers; with ``peer_ca`` each trusts the other through ``JAXCLUSTER_TLS_CA``."""
    path = os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p)
    env = {k: v for k, v in os.environ.items() if k != "JAXCLUSTER_TLS_CA"}
    env["PYTHONPATH"] = path
    if peer_ca:
        env["JAXCLUSTER_TLS_CA"] = str(pki.ca)
    tls = ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key)]
    with (
        running_worker([*tls, "--index", "0"], token=TOKEN, env=env) as w0,
        running_worker([*tls, "--index", "1"], token=TOKEN, env=env) as w1,
    ):
        yield [w0, w1]


def _coordinator(workers: list[WorkerProc], pki: Pki, **kw: Any) -> ClusterCoordinator:
    resolver = SimpleClusterResolver(ClusterSpec({"worker": [w.address for w in workers]}))
    return ClusterCoordinator(
        resolver, auth_token=TOKEN, tls_ca=pki.ca.read_bytes(), error_policy="per_closure", **kw
    )


def _peer(workers: list[WorkerProc], pki: Pki) -> list[dict[str, int]]:
    """Each worker's own peer counters, read over TLS (``GetStatus``)."""
    statuses = [w.client(tls_ca=pki.ca.read_bytes()).get_status(timeout=10.0) for w in workers]
    return [{k: int(s[k]) for k in PEER} for s in statuses]


def _consume_off_the_holder(coordinator: ClusterCoordinator, tmp_path: Path) -> tuple[Any, int]:
    """Keeps 4 MiB on one worker, keeps that holder busy and schedules a consumer of the
    value while only the other worker is free, so the consumer runs there and pulls it.
    Returns ``(consumer, holder)``; the holder is released before returning."""
    kept = coordinator.schedule(_ones, args=(MIB,), keep_result=True)
    assert kept.nbytes == 4 * MIB
    holder = kept.worker
    assert holder in (0, 1)
    gates = [coordinator.schedule(_held, args=(str(tmp_path),)) for _ in range(2)]
    (tmp_path / f"go.{1 - holder}").touch()
    wait_until(lambda: any(g.done() for g in gates), "the free worker's gated closure")
    assert [g.fetch() for g in gates if g.done()] == [1 - holder]
    consumer = coordinator.schedule(_total, args=(kept,))
    try:
        consumer.fetch(timeout=60)
    except ClosureInputError:
        pass
    finally:
        (tmp_path / f"go.{holder}").touch()
    assert sorted(g.fetch(timeout=60) for g in gates) == [0, 1]
    return consumer, holder


def test_a_kept_value_moves_worker_to_worker_over_tls(pki: Pki, tmp_path: Path) -> None:
    with _tls_workers(pki, peer_ca=True) as workers, _coordinator(workers, pki) as coordinator:
        before = _peer(workers, pki)
        consumer, holder = _consume_off_the_holder(coordinator, tmp_path)
        assert consumer.fetch(timeout=60) == float(MIB)
        assert consumer.worker == 1 - holder
        after = _peer(workers, pki)
        sent = after[holder]["peer_bytes_sent"] - before[holder]["peer_bytes_sent"]
        got = after[1 - holder]["peer_bytes_received"] - before[1 - holder]["peer_bytes_received"]
        assert 4 * MIB <= got < 4 * MIB + 64 * 1024  # the value, pulled once
        assert sent == got
        assert after[holder]["peer_reads_served"] - before[holder]["peer_reads_served"] == 1
        assert after[1 - holder]["peer_pulls"] - before[1 - holder]["peer_pulls"] == 1

        # The coordinator sees the same counters in its workers' reports.
        def reported() -> bool:
            report = coordinator.workers[1 - holder].report
            return report is not None and report.peer_bytes_received >= got

        wait_until(reported, "the consumer's worker report of its pull")


def test_a_tls_worker_without_a_peer_ca_fails_its_pull_saying_why(pki: Pki, tmp_path: Path) -> None:
    with (
        _tls_workers(pki, peer_ca=False) as workers,
        _coordinator(workers, pki, max_closure_retries=0) as coordinator,
    ):
        before = _peer(workers, pki)
        consumer, holder = _consume_off_the_holder(coordinator, tmp_path)
        with pytest.raises(ClosureInputError) as caught:
            consumer.fetch(timeout=60)
        message = str(caught.value)
        assert "JAXCLUSTER_TLS_CA" in message and "serves TLS" in message, message
        assert f"worker {1 - holder} could not read kept value" in message, message
        # Nothing was dialled: no token went to the holder in clear text.
        assert _peer(workers, pki) == before
