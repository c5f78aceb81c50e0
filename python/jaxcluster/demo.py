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

__all__ = ["DemoResult", "run_demo"]

_FEATURES, _HIDDEN, _SHARD = 8, 32, 2048


def make_shard(index: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Worker ``index``'s training shard (``index=-1``: the evaluation set)."""
    rng = np.random.default_rng([seed, index + 1])
    truth = np.random.default_rng(seed).normal(size=(_FEATURES,)).astype(np.float32)
    x = rng.normal(size=(_SHARD, _FEATURES)).astype(np.float32)
    y = np.sin(x @ truth)[:, None] + 0.05 * rng.normal(size=(_SHARD, 1)).astype(np.float32)
    return x, y.astype(np.float32)


def shard_batches(seed: int, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Runs on a worker: endless random batches from that worker's shard."""
    from jaxcluster.coordinator import get_current_worker_index

    index = get_current_worker_index()
    x, y = make_shard(index, seed)
    rng = np.random.default_rng([seed, index, 7])
    while True:
        rows = rng.integers(0, len(x), size=batch_size)
        yield x[rows], y[rows]


def init_params(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    return {
        "w1": (rng.normal(size=(_FEATURES, _HIDDEN)) / np.sqrt(_FEATURES)).astype(np.float32),
        "b1": np.zeros(_HIDDEN, np.float32),
        "w2": (rng.normal(size=(_HIDDEN, 1)) / np.sqrt(_HIDDEN)).astype(np.float32),
        "b2": np.zeros(1, np.float32),
    }


def _loss(params: dict[str, Any], x: Any, y: Any) -> Any:
    import jax.numpy as jnp

    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)


_grad_fn: Any = None


def train_step(params: dict[str, np.ndarray], batches: Iterator[Any]) -> tuple[Any, Any]:
    """Runs on a worker: ``(loss, gradients)`` of one batch from its own shard."""
    global _grad_fn
    if _grad_fn is None:  # compiled once per worker process
        import jax

        _grad_fn = jax.jit(jax.value_and_grad(_loss))
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


class _Progress:
    """A plain-text progress bar on one terminal line (or one line per update if piped)."""

    def __init__(self, total: int, out: TextIO) -> None:
        self._total, self._out = total, out
        self._last = 0.0
        self._tty = hasattr(out, "isatty") and out.isatty()

    def show(self, done: int, loss: float, note: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < (0.1 if self._tty else 2.0):
            return
        self._last = now
        width = 30
        filled = int(width * done / self._total)
        bar = "#" * filled + "." * (width - filled)
        line = f"[{bar}] {done:>6}/{self._total} loss {loss:8.4f}  {note}"
        self._out.write(f"\r{line:<100}" if self._tty else f"{line}\n")
        self._out.flush()

    def close(self) -> None:
        if self._tty:
            self._out.write("\n")
            self._out.flush()


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
    initial_loss = float(_loss(params, eval_x, eval_y))
    out.write(f"starting {num_workers} workers...\n")
    with LocalCluster(num_workers) as cluster, cluster.coordinator() as coordinator:
        dataset = coordinator.create_per_worker_dataset(lambda: shard_batches(seed, batch_size))
        batches = iter(dataset)
        progress = _Progress(steps, out)
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
        final_loss=float(_loss(params, eval_x, eval_y)),
        completed=int(metrics["completed"]),
        retried=int(metrics["retried"]),
        worker_failures=int(metrics["worker_failures"]),
    )
