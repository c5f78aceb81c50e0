"""A hyperparameter sweep over a cluster's workers with ``error_policy="per_closure"``.

Every trial (a learning rate and a batch size) is one closure; the workers run them as
they free up. Some trials fail (a learning rate so large that training diverges raises
``FloatingPointError``): with ``error_policy="per_closure"`` each error stays on its own
``RemoteValue``, so the sweep reports the failed trials and goes on with the others,
where TF's default (``"cancel_all"``) would cancel everything still queued.

Run it::

    python examples/sweep.py --small    # seconds: 12 trials on 2 local workers
    python examples/sweep.py            # 48 trials on 4 local workers
    JAXCLUSTER_ENVIRONMENT=slurm python examples/sweep.py   # on a real cluster's workers
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from _cluster import cluster, parse_args
from jaxcluster.coordinator import ClusterCoordinator


def trial(learning_rate: float, batch_size: int, steps: int) -> dict[str, float]:
    """Trains a linear regression; raises FloatingPointError when it diverges."""
    rng = np.random.default_rng(0)
    target = jnp.asarray(rng.normal(size=8), jnp.float32)
    x = jnp.asarray(rng.normal(size=(1024, 8)), jnp.float32)
    y = x @ target

    @jax.jit
    def step(w, xb, yb):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((xb @ w - yb) ** 2))(w)
        return w - learning_rate * grad, loss

    w = jnp.zeros(8, jnp.float32)
    for i in range(steps):
        start = (i * batch_size) % (len(x) - batch_size)
        w, loss = step(w, x[start : start + batch_size], y[start : start + batch_size])
        if not np.isfinite(float(loss)) or float(loss) > 1e6:
            raise FloatingPointError(
                f"diverged at step {i} with learning_rate={learning_rate} (loss {float(loss):.3g})"
            )
    final = float(jnp.mean((x @ w - y) ** 2))
    return {"learning_rate": learning_rate, "batch_size": batch_size, "loss": final}


def main() -> None:
    args = parse_args(__doc__)
    if args.small:
        num_workers, steps = 2, 50
        rates, batches = [0.01, 0.1, 0.5, 1.5, 3.0, 10.0], [16, 64]
    else:
        num_workers, steps = 4, 500
        rates = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 0.5, 0.9, 1.5, 3.0, 10.0, 30.0]
        batches = [8, 32, 128, 512]
    with (
        cluster(num_workers) as c,
        ClusterCoordinator(
            c.resolver, auth_token=c.auth_token, error_policy="per_closure"
        ) as coordinator,
    ):
        grid = list(itertools.product(rates, batches))
        results = [coordinator.schedule(trial, args=(lr, b, steps)) for lr, b in grid]
        coordinator.join()  # with per_closure, join does not raise a trial's error
        succeeded, failed = [], []
        for (lr, b), result in zip(grid, results, strict=True):
            try:
                succeeded.append(result.fetch())
            except FloatingPointError as exc:
                failed.append((lr, b, str(exc).splitlines()[0]))
        for lr, b, why in failed:
            print(f"failed: learning_rate={lr} batch_size={b}: {why}")
        best = min(succeeded, key=lambda r: r["loss"])
        print(
            f"best: learning_rate={best['learning_rate']} batch_size={best['batch_size']} "
            f"loss {best['loss']:.3g}"
        )
        print(f"RESULT trials {len(grid)} succeeded {len(succeeded)} failed {len(failed)}")


if __name__ == "__main__":
    main()
