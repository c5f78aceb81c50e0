"""Asynchronous parameter-server training: the coordinator's program.

Fits a linear model whose weights live on the ps tasks; workers run the training steps
and update the weights in place. Every epoch ends with a checkpoint, and a restarted run
(or one whose ps task restarted) resumes from it.

The cluster comes from ``jaxcluster.cluster_resolver.resolve()``: set
``JAXCLUSTER_ENVIRONMENT`` (``kubernetes`` in the pod of ``coordinator.yaml``, ``explicit``
with ``JAXCLUSTER_WORKERS``/``JAXCLUSTER_PS`` in the Slurm script) and
``JAXCLUSTER_AUTH_TOKEN`` (and ``JAXCLUSTER_TLS_CA`` when the tasks serve TLS, as in the
Slurm script). ``CHECKPOINT`` names the checkpoint file, ``EPOCHS`` the number
of epochs, ``PS_WAIT_TIMEOUT`` how long to wait for the ps tasks to start (seconds).
"""

from __future__ import annotations

import os

import numpy as np

from jaxcluster import ParameterServerStrategy
from jaxcluster.cluster_resolver import resolve

TARGET = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
STEPS_PER_EPOCH = 100


def main() -> None:
    from jaxcluster.coordinator import ClusterCoordinator

    checkpoint = os.environ.get("CHECKPOINT", "/tmp/jaxcluster-example.ckpt")
    epochs = int(os.environ.get("EPOCHS", "5"))
    strategy = ParameterServerStrategy(resolve())
    # Creating variables needs every ps task up; in a new job they may still be starting.
    strategy.wait_for_ps(timeout=float(os.environ.get("PS_WAIT_TIMEOUT", "300")))
    with strategy.scope():
        weights = strategy.Variable(np.zeros(4, np.float32), name="weights")
        step = strategy.Variable(0, name="step")
    if os.path.exists(checkpoint):
        strategy.restore(checkpoint)
        print(f"resumed from {checkpoint} at step {int(step.read_value())}", flush=True)

    def train_step(seed: int) -> float:
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(32, 4)).astype(np.float32)
        error = x @ weights.read_value() - x @ TARGET
        weights.assign_sub(0.05 * 2 * x.T @ error / len(x))
        step.assign_add(1)
        return float(np.mean(error**2))

    coordinator = ClusterCoordinator(strategy)
    first_epoch = int(step.read_value()) // STEPS_PER_EPOCH
    for epoch in range(first_epoch, epochs):
        losses = [
            coordinator.schedule(train_step, args=(epoch * STEPS_PER_EPOCH + i,))
            for i in range(STEPS_PER_EPOCH)
        ]
        coordinator.join()
        strategy.save(checkpoint)
        mean_loss = np.mean([loss.fetch() for loss in losses])
        print(f"epoch {epoch}: loss {mean_loss:.5f}, checkpoint {checkpoint}", flush=True)
    print("weights", weights.read_value(), "target", TARGET, flush=True)


if __name__ == "__main__":
    main()
