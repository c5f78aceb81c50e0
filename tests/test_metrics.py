"""What one can see of a running cluster: live ``coordinator.workers`` and ``metrics()``,
and the Prometheus endpoints of a coordinator, a worker and a ps task, scraped over HTTP
and parsed with ``prometheus_client``'s own parser."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from jaxcluster import ClusterSpec
from jaxcluster._native import core
from jaxcluster.cluster_resolver import SimpleClusterResolver
from jaxcluster.coordinator import ClusterCoordinator
from support.closures import TESTS_DIR, local_cluster, wait_until
from support.workers import WorkerProc, running_worker

parser = pytest.importorskip("prometheus_client.parser")


def _scrape(address: str) -> dict[str, Any]:
    """``{family name: family}`` of the endpoint at ``HOST:PORT``."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {family.name: family for family in parser.text_string_to_metric_families(text)}


def _value(families: dict[str, Any], family: str, sample: str, **labels: str) -> float:
    """The value of ``sample`` in ``family`` whose labels include ``labels``."""
    for s in families[family].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise AssertionError(f"no sample {sample}{labels} in {families[family].samples}")


def _endpoint(worker: WorkerProc) -> str:
    """``HOST:PORT`` of a worker's metrics endpoint, from its log line."""
    line = wait_until(
        lambda: next((x for x in worker.err_lines if "serving Prometheus metrics" in x), None),
        "the metrics log line",
    )
    url = str(line).rsplit(" at ", 1)[1].strip()
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics"), url
    return url.removeprefix("http://").removesuffix("/metrics")


# Workers import this module to run the closures below.
_WORKER_ENV = {"PYTHONPATH": str(TESTS_DIR)}


def _square(x: int) -> int:
    return x * x


def _fail(x: int) -> int:
    raise ValueError(f"bad input {x}")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster(2) as c:
        yield c


def test_workers_and_metrics_are_live(cluster: Any) -> None:
    with cluster.coordinator(error_policy="per_closure") as coordinator:
        wait_until(lambda: all(w["state"] == "up" for w in coordinator.workers), "workers up")
        values = [coordinator.schedule(_square, args=(i,)) for i in range(200)]
        failing = coordinator.schedule(_fail, args=(7,))
        assert coordinator.join(timeout=120)
        assert [v.fetch() for v in values] == [i * i for i in range(200)]

        def counted() -> list[dict[str, Any]] | None:
            workers = coordinator.workers
            runs = sum(w["closures_run"] for w in workers)
            return workers if runs >= 201 else None

        workers = wait_until(counted, "the workers' own counts to include the 201 closures")
        # The worker's own view and this coordinator's agree.
        assert sum(w["completed"] for w in workers) == 200
        assert sum(w["failed"] for w in workers) == 1
        assert sum(w["closures_failed"] for w in workers) == 1
        failed_on = next(w for w in workers if w["closures_failed"])
        assert failed_on["worker_last_error"] == "ValueError: bad input 7"
        assert all(w["status_age_seconds"] < 5 for w in workers)
        uptime = {w["index"]: w["uptime_seconds"] for w in workers}
        wait_until(
            lambda: all(w["uptime_seconds"] > uptime[w["index"]] for w in coordinator.workers),
            "uptime to go on",
        )
        metrics = coordinator.metrics()
        assert (metrics["completed"], metrics["failed"]) == (200, 1)
        assert sum(w["completed"] for w in metrics["workers"]) == 200
        assert {w["state"] for w in metrics["workers"]} == {"up"}
        with pytest.raises(ValueError):
            failing.fetch()


def test_a_coordinator_serves_prometheus_metrics_on_loopback(cluster: Any) -> None:
    with cluster.coordinator(metrics_port=0, error_policy="per_closure") as coordinator:
        address = coordinator.metrics_address
        assert address is not None and address.startswith("127.0.0.1:")
        values = [coordinator.schedule(_square, args=(i,)) for i in range(30)]
        coordinator.schedule(_fail, args=(1,))
        assert coordinator.join(timeout=120)
        assert sum(v.fetch() for v in values) == sum(i * i for i in range(30))
        families = _scrape(address)
        total = "jaxcluster_closures"
        assert _value(families, total, "jaxcluster_closures_total", outcome="completed") == 30
        assert _value(families, total, "jaxcluster_closures_total", outcome="failed") == 1
        assert _value(families, total, "jaxcluster_closures_total", outcome="cancelled") == 0
        queued = families["jaxcluster_closures_queued"]
        assert queued.type == "gauge" and queued.samples[0].value == 0
        assert families["jaxcluster_closures_inflight"].samples[0].value == 0
        retries = families["jaxcluster_closure_retries"]
        assert retries.type == "counter" and retries.samples[0].value == 0
        latency = families["jaxcluster_closure_latency_seconds"]
        assert latency.type == "histogram"
        count = _value(families, latency.name, "jaxcluster_closure_latency_seconds_count")
        inf = _value(families, latency.name, "jaxcluster_closure_latency_seconds_bucket", le="+Inf")
        assert count == inf == 31
        assert _value(families, latency.name, "jaxcluster_closure_latency_seconds_sum") > 0
        per_worker = 0.0
        for index, worker in enumerate(cluster.addresses):
            labels = {"worker": worker, "index": str(index)}
            assert _value(families, "jaxcluster_worker_up", "jaxcluster_worker_up", **labels) == 1
            state = "jaxcluster_worker_state"
            assert _value(families, state, state, state="up", **labels) == 1
            assert _value(families, state, state, state="recovering", **labels) == 0
            per_worker += _value(
                families,
                "jaxcluster_worker_closures",
                "jaxcluster_worker_closures_total",
                outcome="completed",
                **labels,
            )
        assert per_worker == 30
        assert _value(families, "jaxcluster_workers", "jaxcluster_workers", state="up") == 2
    # Shut down: the endpoint is gone and its port free again.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{address}/metrics", timeout=5)


def _spin_configured() -> bool:
    """Whether this process spins at all: ``JAXCLUSTER_SPIN_US``, else 2 cores or more."""
    set_to = os.environ.get("JAXCLUSTER_SPIN_US")
    if set_to is not None and set_to.isdigit():
        return int(set_to) > 0
    return len(os.sched_getaffinity(0)) >= 2


def test_the_spinning_sites_show_the_way_they_keep_and_their_waits(cluster: Any) -> None:
    before = {site.site: site for site in core.spin_sites()}
    assert list(before) == ["fetch", "executor", "runtime"]
    with cluster.coordinator(metrics_port=0) as coordinator:
        for i in range(200):
            assert coordinator.schedule(_square, args=(i,)).fetch() == i * i
        families = _scrape(coordinator.metrics_address or "")
    after = {site.site: site for site in core.spin_sites()}
    assert families["jaxcluster_spin_spinning"].type == "gauge"
    assert families["jaxcluster_spin_waits"].type == "counter"
    for name in ("fetch", "executor", "runtime"):
        kept = _value(families, "jaxcluster_spin_spinning", "jaxcluster_spin_spinning", site=name)
        assert kept in (0, 1)
        waits = "jaxcluster_spin_waits"
        spun = _value(families, waits, waits + "_total", site=name, way="spin")
        parked = _value(families, waits, waits + "_total", site=name, way="park")
        # The scrape read the same counters, between the two snapshots.
        assert before[name].waits_spun <= spun <= after[name].waits_spun
        assert before[name].waits_parked <= parked <= after[name].waits_parked
    fetch_waits = lambda s: s.waits_spun + s.waits_parked  # noqa: E731
    if _spin_configured():
        # Each fetch() right after schedule() waits on its cell, spinning or parked at once
        # (a site resting after spins in vain is not counted: most of 200 are).
        assert fetch_waits(after["fetch"]) > fetch_waits(before["fetch"])
    else:
        assert fetch_waits(after["fetch"]) == fetch_waits(before["fetch"])
        assert not any(site.spinning for site in after.values())
    # The executor's waits are the worker processes', not this one's.
    assert after["executor"].to_dict() == before["executor"].to_dict()
    # Lending (a runtime of one thread run by the thread that waits) shows beside them.
    lending = core.runtime_lending()
    assert families["jaxcluster_runtime_lending"].type == "gauge"
    gauge = _value(families, "jaxcluster_runtime_lending", "jaxcluster_runtime_lending")
    assert gauge == (1 if lending.lending else 0)
    lends = _value(families, "jaxcluster_runtime_lends", "jaxcluster_runtime_lends_total")
    assert lends <= lending.lends
    assert lending.lending or lends == 0


def test_a_lost_worker_shows_in_the_metrics(cluster: Any) -> None:
    with cluster.coordinator(metrics_port=0) as coordinator:
        wait_until(lambda: all(w["state"] == "up" for w in coordinator.workers), "workers up")
        victim = cluster.addresses[1]
        cluster.kill_worker(1)
        try:
            # Closures find out that the worker is gone.
            def lost() -> bool:
                coordinator.fetch([coordinator.schedule(_square, args=(i,)) for i in range(4)])
                families = _scrape(coordinator.metrics_address or "")
                return (
                    _value(
                        families,
                        "jaxcluster_worker_up",
                        "jaxcluster_worker_up",
                        worker=victim,
                    )
                    == 0
                )

            wait_until(lost, "the killed worker to show as not up")
            families = _scrape(coordinator.metrics_address or "")
            failures = "jaxcluster_worker_failures"
            assert _value(families, failures, failures + "_total", worker=victim) >= 1
            assert _value(families, "jaxcluster_workers", "jaxcluster_workers", state="up") == 1
        finally:
            cluster.restart_worker(1)


def test_a_worker_process_serves_its_own_metrics() -> None:
    args = ["--metrics-port", "0", "--log-level", "info"]
    with running_worker(args, env=_WORKER_ENV) as worker:
        address = _endpoint(worker)
        families = _scrape(address)
        info = families["jaxcluster_task_info"].samples[0]
        assert info.labels["job"] == "worker" and info.labels["index"] == "0"
        assert info.labels["version"] == core.__version__
        assert "process_cpu_seconds" in families  # the process's own CPU and memory
        resolver = SimpleClusterResolver(ClusterSpec({"worker": [worker.address]}))
        with ClusterCoordinator(resolver, auth_token=worker.token, error_policy="per_closure") as c:
            values = [c.schedule(_square, args=(i,)) for i in range(5)]
            c.schedule(_fail, args=(2,))
            assert c.join(timeout=120)
            assert [v.fetch() for v in values] == [0, 1, 4, 9, 16]
        families = _scrape(address)
        name = "jaxcluster_executor_closures"
        assert _value(families, name, name + "_total", outcome="completed") == 5
        assert _value(families, name, name + "_total", outcome="failed") == 1
        seconds = "jaxcluster_executor_execution_seconds"
        assert families[seconds].type == "histogram"
        assert _value(families, seconds, seconds + "_count") == 6
        refused = "jaxcluster_refused_requests"
        assert _value(families, refused, refused + "_total", reason="unauthenticated") == 0
        # The worker process's own spinning sites: its executor's waits for the next closure.
        for name in ("fetch", "executor", "runtime"):
            spinning = "jaxcluster_spin_spinning"
            assert _value(families, spinning, spinning, site=name) in (0, 1)
        worker.popen.send_signal(signal.SIGTERM)
        assert worker.finish() == 0


def test_a_ps_process_serves_its_metrics() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXCLUSTER_")}
    env.update({"JAXCLUSTER_AUTH_TOKEN": "tok", "PYTHONUNBUFFERED": "1"})
    ps = subprocess.Popen(
        [sys.executable, "-m", "jaxcluster", "ps", "--metrics-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert ps.stdout is not None and ps.stderr is not None
        ps_address = ps.stdout.readline().split()[-1]
        line = ps.stderr.readline()
        assert "serving Prometheus metrics at http://127.0.0.1:" in line, line
        address = line.rsplit(" at ", 1)[1].strip().removeprefix("http://").removesuffix("/metrics")
        client = core.PsClient(ps_address, "tok")
        client.create_variable("w", np.zeros(4, np.float32))
        client.assign_add("w", np.ones(4, np.float32))
        client.read("w")
        families = _scrape(address)
        assert _value(families, "jaxcluster_ps_variables", "jaxcluster_ps_variables") == 1
        assert _value(families, "jaxcluster_ps_updates", "jaxcluster_ps_updates_total") == 1
        # 16 bytes created + 16 added; 16 read.
        assert (
            _value(families, "jaxcluster_ps_written_bytes", "jaxcluster_ps_written_bytes_total")
            == 32
        )
        assert _value(families, "jaxcluster_ps_read_bytes", "jaxcluster_ps_read_bytes_total") == 16
        info = families["jaxcluster_task_info"].samples[0]
        assert info.labels["job"] == "ps"
    finally:
        ps.send_signal(signal.SIGTERM)
        ps.communicate(timeout=60)
    assert ps.returncode == 0


def test_without_prometheus_client_the_error_names_the_pip_line(
    monkeypatch: pytest.MonkeyPatch, cluster: Any
) -> None:
    from jaxcluster.metrics import MissingMetricsExtraError

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(MissingMetricsExtraError, match=r"pip install 'jaxcluster\[metrics\]'"):
        cluster.coordinator(metrics_port=0)


@pytest.mark.parametrize("bad", [-1, 70000, "9090", 1.5, True])
def test_a_bad_metrics_port_is_refused(cluster: Any, bad: object) -> None:
    with pytest.raises(ValueError, match=rf"metrics_port={bad!r}"):
        cluster.coordinator(metrics_port=bad)
