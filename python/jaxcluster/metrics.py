"""Prometheus metrics for a coordinator, a worker or a ps task, in the text exposition format.

An optional part: it needs ``prometheus_client`` (``pip install 'jaxcluster[metrics]'``).
Each endpoint serves one collector that reads the live numbers when scraped (nothing is
counted twice, and nothing costs anything between scrapes) from its own registry, so the
application's own ``prometheus_client`` metrics stay separate. Endpoints bind loopback
unless given another host.

Example::

    coordinator = ClusterCoordinator(resolver, metrics_port=9090)
    # curl -s http://127.0.0.1:9090/metrics | grep jaxcluster_closures_total
    # jaxcluster_closures_total{outcome="completed"} 200.0

    $ jaxcluster worker --metrics-port 9100     # and: jaxcluster ps --metrics-port 9101
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from jaxcluster._native import core as _core

if TYPE_CHECKING:
    from jaxcluster._core import (
        Dispatcher,
        LatencyHistogram,
        Metrics,
        PsServer,
        PsStatus,
        WorkerMetrics,
        WorkerReport,
        WorkerServer,
    )

__all__ = [
    "PIP_LINE",
    "MetricsServer",
    "MissingMetricsExtraError",
    "serve_coordinator",
    "serve_ps",
    "serve_worker",
]

#: What installs the optional dependency.
PIP_LINE = "pip install 'jaxcluster[metrics]'"

_STATES = _core.WorkerState.members()


class MissingMetricsExtraError(ImportError):
    """``prometheus_client`` is not installed; the message gives the pip line."""


def _prometheus() -> Any:
    try:
        import prometheus_client
        import prometheus_client.core
    except ImportError as exc:
        raise MissingMetricsExtraError(
            f"a metrics endpoint (metrics_port= / --metrics-port) needs the "
            f"prometheus_client package, which is not installed: {PIP_LINE}"
        ) from exc
    return prometheus_client


def _histogram(core: Any, name: str, doc: str, latency: LatencyHistogram) -> Any:
    """A histogram family from a jaxcluster latency histogram (bounded buckets, then +Inf)."""
    buckets = []
    cumulative = 0
    for bound, count in zip(latency.bounds, latency.counts, strict=False):
        cumulative += int(count)
        buckets.append((repr(float(bound)), cumulative))
    buckets.append(("+Inf", int(latency.count)))
    return core.HistogramMetricFamily(name, doc, buckets=buckets, sum_value=latency.sum)


def _counter(core: Any, name: str, doc: str, value: float, **labels: str) -> Any:
    family = core.CounterMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def _gauge(core: Any, name: str, doc: str, value: float) -> Any:
    return core.GaugeMetricFamily(name, doc, value=value)


def _refused(core: Any, status: WorkerReport | PsStatus) -> Any:
    family = core.CounterMetricFamily(
        "jaxcluster_refused_requests",
        "Requests refused: reason=unauthenticated (no or wrong token), rejected "
        "(malformed, unknown or oversized).",
        labels=["reason"],
    )
    family.add_metric(["unauthenticated"], status.unauthenticated_requests)
    family.add_metric(["rejected"], status.rejected_requests)
    return family


def _task_info(core: Any, job: str, status: WorkerReport | PsStatus, **extra: str) -> Iterator[Any]:
    info = core.GaugeMetricFamily(
        "jaxcluster_task_info",
        "Always 1; labels say which task this is and what it runs.",
        labels=["job", "version", *extra],
    )
    info.add_metric([job, status.jaxcluster_version, *extra.values()], 1)
    yield info
    yield _gauge(
        core,
        "jaxcluster_task_uptime_seconds",
        "Seconds since the task's server started.",
        status.uptime_seconds,
    )


class _CoordinatorCollector:
    """What ``Dispatcher.metrics()`` says, when scraped."""

    def __init__(self, metrics: Callable[[], Metrics]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Any]:
        core = _prometheus().core
        m = self._metrics()
        closures = core.CounterMetricFamily(
            "jaxcluster_closures",
            "Closures that ended, by outcome (completed: a value; failed: an error; "
            "cancelled: by a raised error under cancel_all, or by shutdown).",
            labels=["outcome"],
        )
        closures.add_metric(["completed"], m.completed)
        closures.add_metric(["failed"], m.failed)
        closures.add_metric(["cancelled"], m.cancelled)
        yield closures
        yield _gauge(core, "jaxcluster_closures_queued", "Closures queued.", m.queued)
        yield _gauge(
            core,
            "jaxcluster_closures_inflight",
            "Closures taken by a worker and not ended.",
            m.inflight,
        )
        yield _counter(
            core,
            "jaxcluster_closure_retries",
            "Executions put back to run again (worker failures, timeouts, infrastructure "
            "errors, transient parameter-server failures).",
            m.retried,
        )
        yield _counter(
            core,
            "jaxcluster_ps_failures",
            "Closure runs that failed on an unreachable or restarted parameter server.",
            m.ps_failures,
        )
        yield _counter(
            core,
            "jaxcluster_functions_registered",
            "Function payloads sent to workers.",
            m.functions_registered,
        )
        yield _counter(
            core,
            "jaxcluster_kept_values_fetched",
            "Kept values (keep_result=True) fetched to the coordinator with ReadValue.",
            m.kept_values_fetched,
        )
        yield _counter(
            core,
            "jaxcluster_kept_bytes_fetched",
            "Encoded bytes of the kept values fetched to the coordinator.",
            m.kept_bytes_fetched,
        )
        preemptions = core.CounterMetricFamily(
            "jaxcluster_preemptions",
            "Preemption notices workers announced (then they got no new closure and their "
            "unstarted ones ran elsewhere, uncharged), by source: gce, aws, signal.",
            labels=["source"],
        )
        for source, count in sorted(m.preemptions.items()):
            preemptions.add_metric([source], count)
        yield preemptions
        yield _histogram(
            core,
            "jaxcluster_closure_latency_seconds",
            "Seconds from schedule() to the closure's result.",
            m.latency,
        )
        yield from self._workers(core, m.workers)
        yield from _spin(core)

    @staticmethod
    def _workers(core: Any, workers: list[WorkerMetrics]) -> Iterator[Any]:
        labels = ["worker", "index"]
        count = core.GaugeMetricFamily(
            "jaxcluster_workers", "Workers in each state.", labels=["state"]
        )
        for state in _STATES:
            count.add_metric([str(state)], sum(w.state == state for w in workers))
        yield count
        up = core.GaugeMetricFamily(
            "jaxcluster_worker_up", "1 while the worker serves.", labels=labels
        )
        state = core.GaugeMetricFamily(
            "jaxcluster_worker_state",
            "1 for the worker's current state (up, recovering, given_up, removed), 0 for the "
            "others.",
            labels=[*labels, "state"],
        )
        closures = core.CounterMetricFamily(
            "jaxcluster_worker_closures",
            "Closures that ended on the worker, by outcome.",
            labels=[*labels, "outcome"],
        )
        retries = core.CounterMetricFamily(
            "jaxcluster_worker_retries",
            "Executions on the worker put back to run again.",
            labels=labels,
        )
        failures = core.CounterMetricFamily(
            "jaxcluster_worker_failures",
            "Times the worker was found failed (lost, restarted, shutting down).",
            labels=labels,
        )
        for w in workers:
            key = [w.address, str(w.index)]
            up.add_metric(key, 1 if w.state == _core.WorkerState.UP else 0)
            for name in _STATES:
                state.add_metric([*key, str(name)], 1 if w.state == name else 0)
            closures.add_metric([*key, "completed"], w.completed)
            closures.add_metric([*key, "failed"], w.failed)
            retries.add_metric(key, w.retried)
            failures.add_metric(key, w.failures)
        yield from (up, state, closures, retries, failures)


#: (kind, name, help, GetStatus attribute) of the plain series a worker and a ps export.
_WORKER_SERIES = (
    ("gauge", "jaxcluster_executor_queued", "Requests waiting.", "queued"),
    ("gauge", "jaxcluster_executor_inflight", "Requests running.", "inflight"),
    ("gauge", "jaxcluster_executor_functions", "Function payloads held.", "functions_registered"),
    (
        "counter",
        "jaxcluster_executor_resources_created",
        "Per-worker resources built.",
        "resources_created",
    ),
    (
        "counter",
        "jaxcluster_executor_resources_released",
        "Per-worker resources released.",
        "resources_released",
    ),
)
_PS_SERIES = (
    ("gauge", "jaxcluster_ps_variables", "Variables held.", "variables"),
    ("gauge", "jaxcluster_ps_variable_bytes", "Bytes of variable data held.", "variable_bytes"),
    ("counter", "jaxcluster_ps_reads", "Variable reads.", "reads"),
    ("counter", "jaxcluster_ps_updates", "Updates applied.", "updates"),
    (
        "counter",
        "jaxcluster_ps_read_bytes",
        "Tensor bytes sent in answers (reads, read_value of updates).",
        "bytes_read",
    ),
    (
        "counter",
        "jaxcluster_ps_written_bytes",
        "Tensor bytes received in updates and new variables.",
        "bytes_written",
    ),
    ("counter", "jaxcluster_ps_variables_created", "Variables created.", "variables_created"),
)


def _spin(core: Any) -> Iterator[Any]:
    """This process's spinning sites (``JAXCLUSTER_SPIN_US``): the way each keeps and how
    its waits went."""
    sites = _core.spin_sites()
    spinning = core.GaugeMetricFamily(
        "jaxcluster_spin_spinning",
        "1 where a site keeps spinning before it parks; 0 where its trials found parking "
        "at once faster, or spinning is off (site: fetch, executor, runtime).",
        labels=["site"],
    )
    waits = core.CounterMetricFamily(
        "jaxcluster_spin_waits",
        "Waits of each site, by the way they went (spin: spun first; park: parked at once).",
        labels=["site", "way"],
    )
    changes = core.CounterMetricFamily(
        "jaxcluster_spin_way_changes",
        "Times a site's trials changed the way it keeps.",
        labels=["site"],
    )
    for site in sites:
        spinning.add_metric([site.site], 1 if site.spinning else 0)
        waits.add_metric([site.site, "spin"], site.waits_spun)
        waits.add_metric([site.site, "park"], site.waits_parked)
        changes.add_metric([site.site], site.way_changes)
    yield spinning
    yield waits
    yield changes
    lending = _core.runtime_lending()
    yield _gauge(
        core,
        "jaxcluster_runtime_lending",
        "1 where the process's runtime of one thread lends its work to the thread that "
        "waits (fetch(), a worker's executor runs its tasks and I/O while it spins); 0 "
        "otherwise (JAXCLUSTER_RUNTIME_LEND).",
        1 if lending.lending else 0,
    )
    yield _counter(
        core,
        "jaxcluster_runtime_lends",
        "Times the runtime's own thread let a waiting thread take the runtime.",
        lending.lends,
    )


def _series(core: Any, table: Any, status: WorkerReport | PsStatus) -> Iterator[Any]:
    """One gauge or counter per row of ``table``, valued from ``status``."""
    for kind, name, text, key in table:
        make = _gauge if kind == "gauge" else _counter
        yield make(core, name, text, getattr(status, key))


class _WorkerCollector:
    """A worker server's own counters (its ``GetStatus``) and execution times."""

    def __init__(self, server: WorkerServer) -> None:
        self._server = server

    def collect(self) -> Iterator[Any]:
        core = _prometheus().core
        s = self._server.status()
        closures = core.CounterMetricFamily(
            "jaxcluster_executor_closures",
            "Closures this worker ran, by outcome (failed: raised or refused).",
            labels=["outcome"],
        )
        closures.add_metric(["completed"], s.closures_run - s.closures_failed)
        closures.add_metric(["failed"], s.closures_failed)
        yield closures
        yield from _series(core, _WORKER_SERIES, s)
        yield _gauge(
            core,
            "jaxcluster_executor_draining",
            "1 once the worker is shutting down (draining, or preempting after a notice).",
            1 if s.state in (_core.ServingState.DRAINING, _core.ServingState.PREEMPTING) else 0,
        )
        yield _histogram(
            core,
            "jaxcluster_executor_execution_seconds",
            "Seconds a closure ran (taken by the executor to answered).",
            self._server.execution_seconds(),
        )
        yield _refused(core, s)
        yield from _task_info(
            core,
            "worker",
            s,
            index=str(s.worker_index),
            jax_version=s.jax_version,
            platform=s.platform,
        )
        yield from _spin(core)


class _PsCollector:
    """A ps server's counters (its ``GetStatus``)."""

    def __init__(self, server: PsServer) -> None:
        self._server = server

    def collect(self) -> Iterator[Any]:
        core = _prometheus().core
        s = self._server.status()
        yield from _series(core, _PS_SERIES, s)
        yield _refused(core, s)
        yield from _task_info(core, "ps", s, index=str(s.ps_index))


class MetricsServer:
    """An HTTP endpoint serving one collector's metrics at ``/metrics`` (any path works).

    ``address`` is the ``HOST:PORT`` actually bound (port 0 picks a free one); ``close()``
    stops it and frees the port.
    """

    def __init__(self, collector: Any, host: str, port: int, *, process: bool = False) -> None:
        prometheus = _prometheus()
        registry = prometheus.CollectorRegistry(auto_describe=False)
        registry.register(collector)
        if process:
            # CPU, memory and open files of this process (Linux), as exporters conventionally
            # report; only for task processes, not inside the user's application.
            prometheus.ProcessCollector(registry=registry)
        try:
            self._server, self._thread = prometheus.start_http_server(
                port, addr=host, registry=registry
            )
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
            ) from exc
        bound_host, bound_port = self._server.server_address[:2]
        self.address = f"{bound_host}:{bound_port}"

    @property
    def url(self) -> str:
        """``http://HOST:PORT/metrics``."""
        host, port = self.address.rsplit(":", 1)
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def close(self) -> None:
        """Stops serving and closes the socket. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            self._thread.join(timeout=5.0)


def serve_coordinator(dispatcher: Dispatcher, host: str, port: int) -> MetricsServer:
    """Serves a dispatcher's metrics (``jaxcluster_closures_total`` and the rest)."""
    return MetricsServer(_CoordinatorCollector(dispatcher.metrics), host, port)


def serve_worker(server: WorkerServer, host: str, port: int) -> MetricsServer:
    """Serves a worker server's metrics (``jaxcluster_executor_*`` and task info)."""
    return MetricsServer(_WorkerCollector(server), host, port, process=True)


def serve_ps(server: PsServer, host: str, port: int) -> MetricsServer:
    """Serves a ps server's metrics (``jaxcluster_ps_*`` and task info)."""
    return MetricsServer(_PsCollector(server), host, port, process=True)
