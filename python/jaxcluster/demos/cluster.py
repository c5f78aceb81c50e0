"""``jaxcluster demo``: asynchronous JAX training on a local cluster that loses a worker.

A small MLP learns a synthetic regression. Each worker holds its own shard of the data (a
per-worker dataset) and computes gradients with a ``jax.jit`` function from the parameters
it is sent; the coordinator keeps a few steps in flight and applies each gradient as it
arrives (asynchronous SGD, as with TF's parameter-server training). Midway a worker is
killed with SIGKILL and restarted: its steps are retried on the other worker and it
rejoins when it answers again.

Example::

    result = run_demo(steps=300)
    result.final_loss < result.initial_loss   # True
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from jaxcluster.demos._shared import Progress, init_params, make_shard, mse_loss, shard_batches

__all__ = ["DemoResult", "run_demo"]

_grad_fn: Any = None


def train_step(params: dict[str, np.ndarray], batches: Iterator[Any]) -> tuple[Any, Any]:
    """Runs on a worker: ``(loss, gradients)`` of one batch from its own shard."""
    global _grad_fn
    if _grad_fn is None:  # compiled once per worker process
        import jax

        _grad_fn = jax.jit(jax.value_and_grad(mse_loss))
    x, y = next(batches)
    return _grad_fn(params, x, y)


@dataclass
class DemoResult:
    """What a demo run measured."""

    steps: int
    seconds: float
    initial_loss: float
    final_loss: float
    completed: int
    retried: int
    worker_failures: int

    @property
    def closures_per_second(self) -> float:
        return self.completed / self.seconds if self.seconds > 0 else 0.0


def run_demo(
    *,
    num_workers: int = 2,
    steps: int = 3000,
    batch_size: int = 64,
    learning_rate: float = 0.05,
    in_flight: int = 4,
    kill: bool = True,
    seed: int = 0,
    out: TextIO | None = None,
) -> DemoResult:
    """Trains on a fresh ``LocalCluster(num_workers)``; kills and restarts worker
    ``num_workers - 1`` when 40% of the steps are done (if ``kill``)."""
    from jaxcluster.local_cluster import LocalCluster

    if steps < 1 or num_workers < 1 or in_flight < 1:
        raise ValueError(
            f"steps={steps}, num_workers={num_workers}, in_flight={in_flight}; expected each "
            "to be at least 1"
        )
    out = sys.stderr if out is None else out
    eval_x, eval_y = make_shard(-1, seed)
    params = init_params(seed)
    initial_loss = float(mse_loss(params, eval_x, eval_y))
    out.write(f"starting {num_workers} workers...\n")
    with LocalCluster(num_workers) as cluster, cluster.coordinator() as coordinator:
        dataset = coordinator.create_per_worker_dataset(lambda: shard_batches(seed, batch_size))
        batches = iter(dataset)
        progress = Progress(steps, out)
        victim = num_workers - 1
        restarter: threading.Thread | None = None
        started = time.monotonic()
        pending = [coordinator.schedule(train_step, args=(params, batches))]
        applied, loss, note = 0, initial_loss, ""
        while applied < steps:
            while len(pending) < in_flight and applied + len(pending) < steps:
                pending.append(coordinator.schedule(train_step, args=(params, batches)))
            loss_value, grads = pending.pop(0).fetch()
            params = {k: params[k] - learning_rate * np.asarray(grads[k]) for k in params}
            loss = 0.9 * loss + 0.1 * float(loss_value) if applied else float(loss_value)
            applied += 1
            if kill and restarter is None and num_workers > 1 and applied >= 0.4 * steps:
                cluster.kill_worker(victim)
                restarter = threading.Thread(target=cluster.restart_worker, args=(victim,))
                restarter.start()
            if applied % 50 == 0:
                note = "workers " + " ".join(str(w.state) for w in coordinator.workers)
            progress.show(applied, loss, note, force=applied == steps)
        seconds = time.monotonic() - started
        progress.close()
        if restarter is not None:
            restarter.join()
        metrics = coordinator.metrics()
    return DemoResult(
        steps=steps,
        seconds=seconds,
        initial_loss=initial_loss,
        final_loss=float(mse_loss(params, eval_x, eval_y)),
        completed=int(metrics["completed"]),
        retried=int(metrics["retried"]),
        worker_failures=int(metrics["worker_failures"]),
    )
