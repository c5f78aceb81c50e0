"""``jaxcluster demo --ps``: parameter-server training that survives losing a ps task.

The parameters of a small MLP (the model of :mod:`jaxcluster.demos.cluster`) and a step counter are
``strategy.Variable``\\ s on two ps tasks. Each closure, on a worker, reads the parameters,
computes the gradient of a batch from that worker's own shard with ``jax``, and applies it
on the ps tasks with ``assign_sub`` (asynchronous SGD, as in TF's parameter-server
training). Halfway the coordinator saves a checkpoint; training goes on and the last ps
task is killed with SIGKILL, so ``join()`` raises ``PSUnavailableError``. As a real job
would, the demo then restarts everything (new processes, strategy and coordinator),
restores the checkpoint and finishes the remaining steps.

Example::

    result = run_ps_demo(steps=200)
    result.final_loss < result.initial_loss   # True
    result.ps_error_task                       # 1
"""

from __future__ import annotations

import functools
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from jaxcluster.demos._shared import Progress, init_params, make_shard, mse_loss, shard_batches

__all__ = ["PsDemoResult", "ps_train_step", "run_ps_demo"]

_grad_fn: Any = None


def ps_train_step(
    variables: dict[str, Any], step: Any, batches: Iterator[Any], learning_rate: float
) -> float:
    """Runs on a worker: one SGD step on the ps variables; returns the batch loss."""
    global _grad_fn
    if _grad_fn is None:  # compiled once per worker process
        import jax

        _grad_fn = jax.jit(jax.value_and_grad(mse_loss))
    params = {name: variable.read_value() for name, variable in variables.items()}
    x, y = next(batches)
    loss, grads = _grad_fn(params, x, y)
    for name, variable in variables.items():
        variable.assign_sub(learning_rate * np.asarray(grads[name]), read_value=False)
    step.assign_add(1, read_value=False)
    return float(loss)


@dataclass
class PsDemoResult:
    """What a ``demo --ps`` run measured. The checkpoint and failure fields are ``None``
    when the run was not asked to kill a ps task."""

    steps: int
    seconds: float
    initial_loss: float
    final_loss: float
    completed: int
    ps_failures: int
    checkpoint_step: int | None = None
    checkpoint_loss: float | None = None
    killed_at_step: int | None = None
    ps_error_task: int | None = None
    ps_error: str | None = None
    restored_step: int | None = None
    restored_loss: float | None = None


class _Session:
    """A strategy, its variables and a coordinator on one LocalCluster."""

    def __init__(self, cluster: Any, seed: int, batch_size: int) -> None:
        from jaxcluster.coordinator import ClusterCoordinator
        from jaxcluster.strategy import ParameterServerStrategy

        self.cluster = cluster
        self.strategy = ParameterServerStrategy(cluster.resolver, auth_token=cluster.auth_token)
        with self.strategy.scope():
            # Placed round-robin: w1, w2 and step on ps 0; b1, b2 on ps 1.
            self.variables = {
                name: self.strategy.Variable(value, name=name)
                for name, value in init_params(seed).items()
            }
            self.step = self.strategy.Variable(0, name="step", dtype=np.int64)
        self.coordinator = ClusterCoordinator(self.strategy)
        dataset = self.coordinator.create_per_worker_dataset(
            functools.partial(shard_batches, seed, batch_size)
        )
        self.batches = iter(dataset)
        self.completed = 0
        self.ps_failures = 0

    def steps_done(self) -> int:
        return int(self.step.read_value())

    def loss(self, eval_x: np.ndarray, eval_y: np.ndarray) -> float:
        params = {name: v.read_value() for name, v in self.variables.items()}
        return float(mse_loss(params, eval_x, eval_y))

    def schedule(self, count: int, learning_rate: float) -> list[Any]:
        args = (self.variables, self.step, self.batches, learning_rate)
        return [self.coordinator.schedule(ps_train_step, args=args) for _ in range(count)]

    def follow(self, values: list[Any], progress: Progress, start: int, loss: float) -> float:
        """Fetches ``values`` in order, showing progress from step ``start``; returns the
        smoothed loss."""
        for done, value in enumerate(values, start + 1):
            loss = 0.9 * loss + 0.1 * float(value.fetch())
            progress.show(done, loss, "")
        return loss

    def close(self) -> None:
        metrics = self.coordinator.metrics()
        self.completed += int(metrics["completed"])
        self.ps_failures += int(metrics["ps_failures"])
        self.coordinator.shutdown()


def _lose_a_ps(
    session: _Session, values: list[Any], progress: Progress, start: int, loss: float, victim: int
) -> tuple[int, Any]:
    """Lets a few of ``values`` finish, kills ps ``victim`` and returns the step it was
    killed at and the error ``join()`` raised (``None`` if it raised nothing)."""
    from jaxcluster import errors

    session.follow(values[: max(1, len(values) // 5)], progress, start, loss)
    killed_at = session.steps_done()
    session.cluster.kill_ps(victim)
    try:
        session.coordinator.join()
    except errors.PSUnavailableError as error:
        return killed_at, error
    return killed_at, None


def run_ps_demo(
    *,
    num_workers: int = 2,
    num_ps: int = 2,
    steps: int = 1000,
    batch_size: int = 64,
    learning_rate: float = 0.05,
    kill: bool = True,
    seed: int = 0,
    checkpoint: str | Path | None = None,
    out: TextIO | None = None,
) -> PsDemoResult:
    """Trains on ``LocalCluster(num_workers, num_ps=num_ps)``; with ``kill``, checkpoints
    at half the steps (to ``checkpoint``, else a temporary file), kills ps task
    ``num_ps - 1``, restarts every process and finishes from the checkpoint."""
    from jaxcluster.local_cluster import LocalCluster

    if steps < 2 or num_workers < 1 or num_ps < 1:
        raise ValueError(
            f"steps={steps}, num_workers={num_workers}, num_ps={num_ps}; expected at least "
            "2 steps, 1 worker and 1 ps task"
        )
    out = sys.stderr if out is None else out
    eval_x, eval_y = make_shard(-1, seed)
    initial_loss = float(mse_loss(init_params(seed), eval_x, eval_y))
    progress = Progress(steps, out)
    started = time.monotonic()
    result = PsDemoResult(steps, 0.0, initial_loss, initial_loss, 0, 0)
    with tempfile.TemporaryDirectory(prefix="jaxcluster-demo-") as scratch:
        path = Path(checkpoint) if checkpoint is not None else Path(scratch) / "model.ckpt"
        out.write(f"starting {num_ps} ps tasks and {num_workers} workers...\n")
        with LocalCluster(num_workers, num_ps=num_ps) as cluster:
            session = _Session(cluster, seed, batch_size)
            try:
                first = steps // 2 if kill else steps
                values = session.schedule(first, learning_rate)
                loss = session.follow(values, progress, 0, initial_loss)
                if kill:
                    session.strategy.save(path)
                    result.checkpoint_step = session.steps_done()
                    result.checkpoint_loss = session.loss(eval_x, eval_y)
                    rest = session.schedule(steps - result.checkpoint_step, learning_rate)
                    result.killed_at_step, error = _lose_a_ps(
                        session, rest, progress, result.checkpoint_step, loss, num_ps - 1
                    )
                    if error is not None:
                        result.ps_error_task = getattr(error, "task_id", None)
                        result.ps_error = f"{type(error).__name__}: {error}"
                else:
                    result.final_loss = session.loss(eval_x, eval_y)
            finally:
                session.close()
        result.completed, result.ps_failures = session.completed, session.ps_failures
        if kill:
            progress.close()
            out.write(
                f"ps {num_ps - 1} killed at step {result.killed_at_step}: "
                f"{result.ps_error or 'no error was raised'}\n"
                "restarting every process and restoring the checkpoint...\n"
            )
            with LocalCluster(num_workers, num_ps=num_ps) as cluster:
                session = _Session(cluster, seed, batch_size)
                try:
                    session.strategy.restore(path)
                    result.restored_step = session.steps_done()
                    result.restored_loss = session.loss(eval_x, eval_y)
                    remaining = max(0, steps - result.restored_step)
                    values = session.schedule(remaining, learning_rate)
                    session.follow(values, progress, result.restored_step, result.restored_loss)
                    session.coordinator.join()
                    result.final_loss = session.loss(eval_x, eval_y)
                finally:
                    session.close()
            result.completed += session.completed
            result.ps_failures += session.ps_failures
    progress.show(steps, result.final_loss, "", force=True)
    progress.close()
    result.seconds = time.monotonic() - started
    return result
