"""TensorFlow's "Parameter server training" tutorial, ported to jaxcluster (no Keras).

What it shows, step by step as in the tutorial:

1. A cluster of workers and ps tasks (here a ``LocalCluster``; on a real cluster start
   ``jaxcluster worker`` / ``jaxcluster ps`` on every task and set
   ``JAXCLUSTER_ENVIRONMENT``, see ``deploy/``).
2. ``ParameterServerStrategy`` with ``variable_partitioner=MinSizePartitioner(...)``: the
   large first-layer kernel is split along axis 0 over the ps tasks, as TF shards it.
3. A per-worker dataset (``create_per_worker_dataset``; each worker builds its own shard
   from ``get_current_worker_index()``, TF's ``input_context``).
4. A training step scheduled with ``coordinator.schedule`` and waited for with ``join``;
   the step runs plain JAX on the worker and sends its gradients to the tutorial's
   optimizer, ``RMSprop`` (``jaxcluster.strategy.optimizers``, Keras's arguments): each ps
   task applies the update to its variables and their slots (RMSprop's ``velocity``,
   beside each variable and split with the kernel) atomically, as TF's ps does.
5. Evaluation with an inline loop on the coordinator, and a checkpoint with
   ``strategy.save`` / ``strategy.restore`` (TF: ``tf.train.Checkpoint(model=...,
   optimizer=...)``): the optimizer's slots and step counts are saved with the variables.

Run it::

    python examples/ps_tutorial.py --small    # seconds: 2 workers, 2 ps on loopback
    python examples/ps_tutorial.py            # the tutorial's size (more data and epochs)
    JAXCLUSTER_ENVIRONMENT=kubernetes python examples/ps_tutorial.py   # a real cluster
"""

from __future__ import annotations

import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from _cluster import cluster, parse_args
from jaxcluster.coordinator import ClusterCoordinator, get_current_worker_index
from jaxcluster.strategy import MinSizePartitioner, ParameterServerStrategy
from jaxcluster.strategy.optimizers import RMSprop

FEATURES, HIDDEN = 16, 64
LEARNING_RATE = 0.01  # TF's tutorial has 0.1 for its 1-unit model; this one is larger
TRUE_W = np.random.default_rng(42).normal(size=FEATURES).astype(np.float32)


def make_data(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic binary classification set (the tutorial's is a toy table too)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = (x @ TRUE_W > 0).astype(np.float32)
    return x, y


def forward(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    hidden = jax.nn.relu(x @ params["kernel"] + params["bias"])
    return (hidden @ params["out"])[:, 0] + params["out_bias"]


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    logits = forward(params, x)
    return jnp.mean(jnp.logaddexp(0.0, logits) - y * logits)  # binary cross-entropy


def main() -> None:
    args = parse_args(__doc__)
    num_workers, num_ps = 2, 2
    epochs, steps_per_epoch, batch = (3, 10, 64) if args.small else (5, 20, 256)
    with cluster(num_workers, num_ps) as c:
        # 2. The strategy; kernel (16 x 64 float32, 4 KiB) is split in 2 shards of >= 1 KiB.
        strategy = ParameterServerStrategy(
            c.resolver,
            variable_partitioner=MinSizePartitioner(min_shard_bytes=1024, max_shards=num_ps),
            auth_token=c.auth_token,
        )
        strategy.wait_for_ps(timeout=120)
        rng = np.random.default_rng(0)
        init = {
            "kernel": rng.normal(scale=0.3, size=(FEATURES, HIDDEN)).astype(np.float32),
            "bias": np.zeros(HIDDEN, np.float32),
            "out": rng.normal(scale=0.3, size=(HIDDEN, 1)).astype(np.float32),
            "out_bias": np.float32(0.0),
        }
        with strategy.scope():
            params = {k: strategy.Variable(v, name=k) for k, v in init.items()}
        print(f"kernel shards: {len(params['kernel'].shards)} over {strategy.num_ps} ps tasks")
        # TF's tutorial: RMSprop(learning_rate=0.1) on the ps. ``build`` makes its slots now
        # (else the first update does), so the checkpoint below holds them either way.
        optimizer = RMSprop(learning_rate=LEARNING_RATE)
        optimizer.build(params, strategy)
        coordinator = ClusterCoordinator(strategy)

        # 3. The per-worker dataset: each worker reads its own shard, repeated.
        def dataset_fn():
            x, y = make_data(seed=1 + get_current_worker_index(), n=batch * 8)
            while True:
                for start in range(0, len(x), batch):
                    yield x[start : start + batch], y[start : start + batch]

        per_worker_iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

        # 4. The step: read the variables, compute gradients in JAX, send them to RMSprop,
        # which the ps tasks apply (TF: optimizer.apply_gradients(zip(grads, variables))).
        def step_fn(iterator):
            x, y = next(iterator)
            values = {k: jnp.asarray(v.read_value()) for k, v in params.items()}
            loss, grads = jax.value_and_grad(loss_fn)(values, x, y)
            optimizer.apply_gradients(grads, params)
            return loss

        x_eval, y_eval = make_data(seed=999, n=1024)

        def evaluate() -> tuple[float, float]:  # 5. inline evaluation on the coordinator
            values = {k: jnp.asarray(v.read_value()) for k, v in params.items()}
            logits = forward(values, x_eval)
            accuracy = float(jnp.mean((logits > 0) == (y_eval > 0.5)))
            return float(loss_fn(values, x_eval, y_eval)), accuracy

        first_loss, _ = evaluate()
        print(f"initial eval loss {first_loss:.4f}")
        for epoch in range(epochs):
            losses = [
                coordinator.schedule(step_fn, args=(per_worker_iterator,))
                for _ in range(steps_per_epoch)
            ]
            coordinator.join()
            train_loss = float(np.mean([loss.fetch() for loss in losses]))
            eval_loss, accuracy = evaluate()
            print(
                f"epoch {epoch}: train loss {train_loss:.4f}, eval loss {eval_loss:.4f}, "
                f"accuracy {accuracy:.3f}"
            )

        # 5. Checkpoint, clobber, restore: the variables with RMSprop's slots and counts.
        steps = optimizer.iterations(params["kernel"])
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "tutorial.ckpt")
            strategy.save(path)
            saved = params["kernel"].read_value()
            params["kernel"].assign(np.zeros_like(saved))
            optimizer.apply_gradients(
                {k: np.ones(v.shape, np.float32) for k, v in params.items()}, params
            )
            strategy.restore(path)
            restored = np.array_equal(params["kernel"].read_value(), saved)
            restored = restored and optimizer.iterations(params["kernel"]) == steps
        print(f"RMSprop steps on the ps: {steps}")
        print(f"checkpoint restored: {restored}")
        final_loss, accuracy = evaluate()
        print(f"RESULT eval loss {first_loss:.4f} -> {final_loss:.4f}, accuracy {accuracy:.3f}")
        coordinator.shutdown()


if __name__ == "__main__":
    main()
