"""``jaxcluster demo --slices``: asynchronous training over 2 multi-host slices, one of whose
hosts is SIGKILLed midway.

``LocalCluster(num_workers=4, hosts_per_slice=2, devices_per_host=2)`` starts 2 slices of
2 host processes with 2 CPU devices each. Every step runs SPMD on one slice: each host
feeds its own batch (a per-slice dataset: one iterator per host) into a global array
sharded over the slice's 4 devices, and a ``jax.jit`` computes the gradient of the global
batch (XLA's cross-host all-reduce, a ``psum`` over the slice's mesh). The coordinator keeps a
few steps in flight and applies each gradient as it arrives (asynchronous SGD across
slices). At 40% one host of slice 0 is SIGKILLed: its step runs again on slice 1, the
slice's surviving host restarts, the slice re-forms and takes steps again.

Example::

    result = run_slices_demo(steps=200)
    result.final_loss < result.initial_loss   # True
    result.recovered_after                    # seconds from the SIGKILL to slice 0 serving
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from jaxcluster.demos._shared import Progress, init_params, make_shard, mse_loss

__all__ = ["SlicesDemoResult", "run_slices_demo"]

_HOSTS, _DEVICES, _SLICES = 2, 2, 2


def host_batches(seed: int, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Runs on every host of a slice: endless batches from that host's own shard."""
    import jax

    from jaxcluster.coordinator import get_current_worker_index

    shard = get_current_worker_index() * _HOSTS + jax.process_index()
    x, y = make_shard(shard, seed)
    rng = np.random.default_rng([seed, shard, 7])
    while True:
        rows = rng.integers(0, len(x), size=batch_size)
        yield x[rows], y[rows]


_step_fn: Any = None


def slice_step(params: dict[str, np.ndarray], batches: Iterator[Any]) -> tuple[Any, Any]:
    """Runs SPMD on every host of a slice: ``(loss, gradients)`` of the slice's global
    batch, sharded over its devices; the mean over the batch compiles to a cross-host
    all-reduce (a ``psum`` over the mesh), and the replicated results are rank 0's."""
    global _step_fn
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("d",))
    replicated = NamedSharding(mesh, P())
    if _step_fn is None:  # compiled once per host process
        _step_fn = jax.jit(jax.value_and_grad(mse_loss), out_shardings=replicated)
    x, y = next(batches)
    rows = NamedSharding(mesh, P("d"))
    gx = jax.make_array_from_process_local_data(rows, x)
    gy = jax.make_array_from_process_local_data(rows, y)

    def replicate(value: Any) -> Any:
        return jax.make_array_from_callback(value.shape, replicated, lambda idx: value[idx])

    gp = {k: replicate(v) for k, v in params.items()}
    return _step_fn(gp, gx, gy)


@dataclass
class SlicesDemoResult:
    """What a slices demo run measured."""

    steps: int
    seconds: float
    initial_loss: float
    final_loss: float
    completed: int
    slice_failures: int
    steps_per_slice: list[int]
    recovered_after: float | None  # seconds from the SIGKILL to the slice serving again


def run_slices_demo(
    *,
    steps: int = 600,
    batch_size: int = 64,
    learning_rate: float = 0.05,
    in_flight: int = 4,
    kill: bool = True,
    seed: int = 0,
    out: TextIO | None = None,
) -> SlicesDemoResult:
    """Trains on 2 slices x 2 hosts x 2 CPU devices; SIGKILLs host 1 (rank 1 of slice 0)
    when 40% of the steps are done (if ``kill``) and waits, at the end, for that slice to
    serve again."""
    from jaxcluster.coordinator import get_current_worker_index
    from jaxcluster.local_cluster import LocalCluster

    if steps < 1 or in_flight < 1:
        raise ValueError(f"steps={steps}, in_flight={in_flight}; expected each at least 1")
    out = sys.stderr if out is None else out
    eval_x, eval_y = make_shard(-1, seed)
    params = init_params(seed)
    initial_loss = float(mse_loss(params, eval_x, eval_y))
    out.write(f"starting {_SLICES} slices of {_HOSTS} hosts x {_DEVICES} CPU devices...\n")
    with (
        LocalCluster(
            num_workers=_SLICES * _HOSTS,
            hosts_per_slice=_HOSTS,
            devices_per_host=_DEVICES,
            worker_args=["--slice-heartbeat-timeout", "5"],
        ) as cluster,
        cluster.coordinator() as coordinator,
    ):
        dataset = coordinator.create_per_worker_dataset(lambda: host_batches(seed, batch_size))
        batches = iter(dataset)

        def step(p: Any, b: Any) -> tuple[Any, Any, int]:
            loss, grads = slice_step(p, b)
            return loss, grads, get_current_worker_index()

        progress = Progress(steps, out)
        started = time.monotonic()
        pending = [coordinator.schedule(step, args=(params, batches))]
        applied, loss, note = 0, initial_loss, ""
        per_slice = [0] * _SLICES
        killed_at: float | None = None
        before = _incarnation(cluster, 0)
        while applied < steps:
            while len(pending) < in_flight and applied + len(pending) < steps:
                pending.append(coordinator.schedule(step, args=(params, batches)))
            loss_value, grads, ran_on = pending.pop(0).fetch()
            per_slice[ran_on] += 1
            params = {k: params[k] - learning_rate * np.asarray(grads[k]) for k in params}
            loss = 0.9 * loss + 0.1 * float(loss_value) if applied else float(loss_value)
            applied += 1
            if kill and killed_at is None and applied >= 0.4 * steps:
                cluster.kill_worker(1)  # rank 1 of slice 0: the whole slice fails
                killed_at = time.monotonic()
            if applied % 25 == 0:
                note = "slices " + " ".join(str(w.state) for w in coordinator.workers)
            progress.show(applied, loss, note, force=applied == steps)
        seconds = time.monotonic() - started
        progress.close()
        recovered_after = None
        if killed_at is not None:
            recovered_after = wait_serving_again(coordinator, before, killed_at)
        metrics = coordinator.metrics()
    return SlicesDemoResult(
        steps=steps,
        seconds=seconds,
        initial_loss=initial_loss,
        final_loss=float(mse_loss(params, eval_x, eval_y)),
        completed=int(metrics["completed"]),
        slice_failures=int(metrics["worker_failures"]),
        steps_per_slice=per_slice,
        recovered_after=recovered_after,
    )


def wait_serving_again(
    coordinator: Any, before: int, killed_at: float, timeout: float = 120.0
) -> float | None:
    """Seconds from ``killed_at`` (a ``time.monotonic()``) until slice 0 serves with new
    processes (an incarnation other than ``before``), or ``None`` if it does not within
    ``timeout`` seconds. Probe closures keep the coordinator looking at it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        coordinator.fetch([coordinator.schedule(os.getpid) for _ in range(2)])
        worker = coordinator.workers[0]
        report = worker.report
        if worker.state == "up" and report is not None and report.incarnation not in (0, before):
            # Up since in_state_seconds ago: when the re-formed slice answered.
            return time.monotonic() - worker.in_state_seconds - killed_at
        time.sleep(0.05)
    return None


def _incarnation(cluster: Any, index: int) -> int:
    """The incarnation of worker ``index``'s serving process, asked of it directly."""
    from jaxcluster._native import core

    client = core.WorkerClient(cluster.addresses[index], auth_token=cluster.auth_token)
    return client.get_status(timeout=30.0).incarnation
