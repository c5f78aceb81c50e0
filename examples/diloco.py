"""DiLoCo (Douillard et al., arXiv 2311.08105) on jaxcluster, against synchronous data
parallelism on the same model, data and number of examples.

- The global parameters are ps variables; each worker keeps its local parameters and its
  inner optimizer's state (optax AdamW) in per-worker device state
  (``create_per_worker_state``).
- A round: every worker shard re-syncs its local parameters from the ps, takes H inner
  AdamW steps on its own data, and sends its pseudo-gradient ``(global - local) / workers``
  with ``Optimizer.apply_gradients``; the ps applies it with the outer optimizer, Nesterov
  SGD, atomically, in Rust. Each worker's pseudo-gradient is one outer update as it
  arrives (nothing waits for the others within a round; rounds are joined), so a round is
  four Nesterov steps: the paper's ``SGD(0.7, momentum=0.9, nesterov=True)``, meant for
  one step of the averaged pseudo-gradient, overshoots here; ``SGD(0.4, momentum=0.75,
  nesterov=True)`` is what this form needs (an in-process simulation of both forms agreed).
- The inner AdamW's rate follows one cosine decay over the global step in every run.
- ``int8`` pseudo-gradients (one scale per tensor) with error feedback: the residual of
  the quantisation stays in the worker's device state and joins its next pseudo-gradient.
- ``--kill-worker-at-round N``: the worker running shard 1 SIGKILLs itself halfway through
  round N's inner steps. The coordinator retries that shard's closure on another worker;
  the example restarts the dead worker, whose state is rebuilt (``init_fn`` again) and
  which re-syncs from the ps at its next round. The run goes on.
- Synchronous data parallelism (the baseline): the coordinator holds the parameters and
  AdamW, and each step every shard's gradient at the same parameters is averaged.

The data (a noisy teacher MLP, one shard per worker) and the model (an MLP) are made here.
It prints the final evaluation loss of each run, the bytes per outer step and per example
(from the ps byte counters and the workers' closure byte counters), wall times, and with
``--json PATH`` writes the same as a JSON summary.

Run it::

    python examples/diloco.py --small                   # ~1 minute: 4 workers, 1 ps
    python examples/diloco.py                           # more rounds, a larger batch
    python examples/diloco.py --small --kill-worker-at-round 2 --json summary.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from _cluster import cluster, parse_args
from jaxcluster.coordinator import ClusterCoordinator, get_current_worker_index
from jaxcluster.strategy import ParameterServerStrategy
from jaxcluster.strategy import optimizers as opt

WORKERS, FEATURES, HIDDEN, TEACHER_HIDDEN, NOISE = 4, 8, 32, 4, 1.0
_TEACHER = np.random.default_rng(42)
TEACHER_W1 = _TEACHER.normal(size=(FEATURES, TEACHER_HIDDEN)).astype(np.float32)
TEACHER_W2 = _TEACHER.normal(size=TEACHER_HIDDEN).astype(np.float32) / 2


def make_batch(shard: int, step: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Shard ``shard``'s batch for inner step ``step``: the same in every run."""
    rng = np.random.default_rng([shard, step])
    x = rng.normal(size=(batch, FEATURES)).astype(np.float32)
    y = np.tanh(x @ TEACHER_W1) @ TEACHER_W2 + NOISE * rng.normal(size=batch)
    return x, y.astype(np.float32)


def initial_params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "w1": (rng.normal(size=(FEATURES, HIDDEN)) / np.sqrt(FEATURES)).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": (rng.normal(size=(HIDDEN,)) / np.sqrt(HIDDEN)).astype(np.float32),
        "b2": np.zeros((), np.float32),
    }


def loss_fn(params: Any, x: Any, y: Any) -> Any:
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)


def inner_optimizer(learning_rate: float) -> optax.GradientTransformation:
    """AdamW whose rate the caller sets per step (``inner_update``), from the global step."""
    return optax.inject_hyperparams(optax.adamw)(learning_rate=learning_rate, weight_decay=0.0)


def inner_update(args: Any, grads: Any, state: Any, params: Any, step: int) -> tuple[Any, Any]:
    """One inner AdamW step at the cosine-decayed rate of global step ``step`` (the same
    schedule for sync DP and for every DiLoCo worker, whatever its history)."""
    total = args.rounds * args.inner_steps
    schedule = optax.cosine_decay_schedule(args.inner_lr, total, alpha=0.05)
    state.hyperparams["learning_rate"] = schedule(step)
    updates, state = inner_optimizer(args.inner_lr).update(grads, state, params)
    return optax.apply_updates(params, updates), state


def eval_loss(params: dict[str, np.ndarray]) -> float:
    x, y = make_batch(shard=10_000, step=0, batch=4096)  # held out: no worker has it
    return float(loss_fn(params, x, y))


def ps_bytes(addresses: list[str], token: str | None) -> tuple[int, int]:
    """(written, read) payload bytes summed over the ps tasks: what arrived and left."""
    from jaxcluster._native import core

    written = read = 0
    for address in addresses:
        status = core.PsClient(address, auth_token=token).get_status()
        written, read = written + int(status["bytes_written"]), read + int(status["bytes_read"])
    return written, read


def closure_bytes(coordinator: ClusterCoordinator) -> list[int]:
    """Per worker: closure arguments and results it received and sent since it started."""
    reports = [w.report for w in coordinator.workers]
    return [r.closure_bytes_received + r.closure_bytes_sent if r else 0 for r in reports]


def closure_bytes_since(coordinator: ClusterCoordinator, before: list[int]) -> int:
    """Closure bytes since ``before``; a worker that restarted counts from zero."""
    now = closure_bytes(coordinator)
    return sum(n - b if n >= b else n for n, b in zip(now, before, strict=True))


def run_sync_dp(coordinator: ClusterCoordinator, args: Any) -> dict[str, Any]:
    """Every step: each shard's gradient at the same parameters, averaged, then AdamW."""
    batch, steps = args.batch, args.rounds * args.inner_steps

    def gradient(params: dict[str, np.ndarray], shard: int, step: int) -> Any:
        x, y = make_batch(shard, step, batch)
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return float(loss), {k: np.asarray(g) for k, g in grads.items()}

    params = initial_params()
    inner = inner_optimizer(args.inner_lr)
    state = inner.init(params)
    before, started = closure_bytes(coordinator), time.perf_counter()
    for step in range(steps):
        results = [
            coordinator.schedule(gradient, args=(params, shard, step)) for shard in range(WORKERS)
        ]
        grads = [r.fetch()[1] for r in results]
        mean = {k: np.mean([g[k] for g in grads], axis=0) for k in params}
        new, state = inner_update(args, mean, state, params, step)
        params = {k: np.asarray(v) for k, v in new.items()}
    wall = time.perf_counter() - started
    sent = closure_bytes_since(coordinator, before)
    return {"loss": eval_loss(params), "wall_s": wall, "bytes": sent}


def run_diloco(
    c: Any,
    strategy: ParameterServerStrategy,
    coordinator: ClusterCoordinator,
    args: Any,
    variant: str,
    kill_at: int | None,
) -> dict[str, Any]:
    """One DiLoCo run; ``variant`` is ``fp32``, ``int8`` or ``int8+ef``."""
    compression = None if variant == "fp32" else "int8"
    feedback = variant.endswith("+ef")
    h, batch, inner_lr = args.inner_steps, args.batch, args.inner_lr
    settings = argparse.Namespace(**vars(args))  # plain data for the closures
    start = initial_params()
    name = variant.replace("+", "_")
    with strategy.scope():
        params = {k: strategy.Variable(v, name=f"{name}_{k}") for k, v in start.items()}
    outer = opt.SGD(
        args.outer_lr, momentum=args.outer_momentum, nesterov=True, name=f"outer_{name}"
    )
    outer.build(params, strategy)
    marker = os.path.join(tempfile.mkdtemp(), "killed")

    def init_state() -> dict[str, Any]:  # on each worker, and again when it restarts
        local = initial_params()
        return {
            "params": local,
            "inner": inner_optimizer(inner_lr).init(local),
            "residual": {k: np.zeros_like(v) for k, v in local.items()},
            "rounds": np.int32(0),
        }

    def inner_round(state: Any, shard: int, rnd: int) -> tuple[int, int, float]:
        """On a worker: re-sync, H inner steps, send the pseudo-gradient."""
        value = state.value
        rounds_before = int(value["rounds"])  # 0: a new (or rebuilt) state
        synced = {k: np.asarray(v.read_value()) for k, v in params.items()}  # from the ps
        local, inner_state, losses = synced, value["inner"], []
        for i in range(h):
            if rnd == kill_at and shard == 1 and i == h // 2 and not os.path.exists(marker):
                open(marker, "w").close()  # once: the retried closure goes on
                os.kill(os.getpid(), signal.SIGKILL)  # mid-round
            x, y = make_batch(shard, rnd * h + i, batch)
            loss, grads = jax.value_and_grad(loss_fn)(local, x, y)
            local, inner_state = inner_update(settings, grads, inner_state, local, rnd * h + i)
            losses.append(float(loss))
        pseudo = {k: (synced[k] - np.asarray(local[k])) / WORKERS for k in synced}
        residual = outer.apply_gradients(
            pseudo,
            params,
            compression=compression,
            error_feedback=value["residual"] if feedback else None,
        )
        state.assign(
            {
                "params": local,
                "inner": inner_state,
                "residual": residual if feedback else value["residual"],
                "rounds": np.int32(rounds_before + 1),
            }
        )
        return get_current_worker_index(), rounds_before, float(np.mean(losses))

    state = coordinator.create_per_worker_state(init_state)
    coordinator.join()
    addresses = list(c.local.ps_addresses) if c.local else []
    written0, read0 = ps_bytes(addresses, c.auth_token)
    started, closure_total = time.perf_counter(), 0
    killed: list[int] = []
    resynced: list[str] = []
    for rnd in range(args.rounds):
        closures0 = closure_bytes(coordinator)
        results = [
            coordinator.schedule(inner_round, args=(state, shard, rnd)) for shard in range(WORKERS)
        ]
        coordinator.join()
        closure_total += closure_bytes_since(coordinator, closures0)
        for worker, rounds_before, _ in (r.fetch() for r in results):
            if worker in killed and rounds_before == 0:
                resynced.append(f"worker {worker} re-synced from the ps at round {rnd}")
                killed.remove(worker)
        if rnd == kill_at and c.local is not None:
            dead = [i for i in range(WORKERS) if c.local.worker_pid(i) is None]
            restarting = time.perf_counter()
            for worker in dead:
                c.local.restart_worker(worker)
                wait_until_up(coordinator, worker)
            killed += dead
            print(
                f"  {variant}: round {rnd}: worker(s) {dead} SIGKILLed mid-round, restarted "
                f"(up again after {time.perf_counter() - restarting:.1f} s)"
            )
    wall = time.perf_counter() - started
    written, read = ps_bytes(addresses, c.auth_token)
    final = {k: np.asarray(v.read_value()) for k, v in params.items()}
    for line in resynced:
        print(f"  {variant}: {line}")
    return {
        "loss": eval_loss(final),
        "wall_s": wall,
        "pseudo_gradient_bytes_per_outer_step": (written - written0) / args.rounds,
        "resync_bytes_per_outer_step": (read - read0) / args.rounds,
        "bytes": (written - written0) + (read - read0) + closure_total,
        "killed_and_resynced": bool(resynced) if kill_at is not None else None,
    }


def wait_until_up(coordinator: ClusterCoordinator, worker: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while coordinator.workers[worker].state != "up":
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker {worker} did not come back in {timeout} s")
        time.sleep(0.2)


def add_arguments(parser: Any) -> None:
    parser.add_argument("--compression", choices=("int8", "none"), default="int8")
    parser.add_argument("--kill-worker-at-round", type=int, default=None, metavar="N")
    parser.add_argument("--json", default=None, metavar="PATH", help="write a summary here")


def main() -> None:
    args = parse_args(__doc__, add_arguments)
    args.rounds, args.inner_steps, args.batch = (20, 10, 32) if args.small else (30, 20, 64)
    args.inner_lr, args.outer_lr, args.outer_momentum = 0.03, 0.4, 0.75
    examples = args.rounds * args.inner_steps * args.batch * WORKERS
    headline = "int8+ef" if args.compression == "int8" else "fp32"
    with cluster(WORKERS, 1) as c:
        strategy = ParameterServerStrategy(c.resolver, auth_token=c.auth_token)
        strategy.wait_for_ps(timeout=120)
        coordinator = ClusterCoordinator(strategy)
        print(
            f"{WORKERS} workers, {args.rounds} rounds x H={args.inner_steps} inner steps, "
            f"batch {args.batch} per worker: {examples} examples per run"
        )
        runs = {"sync_dp": run_sync_dp(coordinator, args)}
        for variant in (headline, *(v for v in ("fp32", "int8", "int8+ef") if v != headline)):
            kill = args.kill_worker_at_round if variant == headline else None
            runs[variant] = run_diloco(c, strategy, coordinator, args, variant, kill)
        coordinator.shutdown()
    for label, run in runs.items():
        run["bytes_per_example"] = run["bytes"] / examples
        print(
            f"{label:<8} final eval loss {run['loss']:.4f}  wall {run['wall_s']:6.1f} s  "
            f"{run['bytes_per_example']:8.1f} bytes/example"
        )
    fp32 = runs["fp32"]["pseudo_gradient_bytes_per_outer_step"]
    int8 = runs["int8+ef"]["pseudo_gradient_bytes_per_outer_step"]
    gap = runs[headline]["loss"] / runs["sync_dp"]["loss"] - 1
    summary = {
        "workers": WORKERS,
        "rounds": args.rounds,
        "inner_steps": args.inner_steps,
        "examples": examples,
        "headline": headline,
        "loss_gap_vs_sync_dp": gap,
        "int8_over_fp32_bytes_per_outer_step": int8 / fp32,
        "runs": runs,
    }
    print(f"bytes per outer step (pseudo-gradients to the ps): fp32 {fp32:.0f}, int8 {int8:.0f}")
    print(
        f"error feedback: int8 loss {runs['int8']['loss']:.4f} without, "
        f"{runs['int8+ef']['loss']:.4f} with"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(summary, out, indent=2)
    print(
        f"RESULT DiLoCo ({headline}) loss {runs[headline]['loss']:.4f} vs sync DP "
        f"{runs['sync_dp']['loss']:.4f} ({100 * gap:+.2f}%), int8 bytes per outer step "
        f"{int8 / fp32:.3f} of fp32"
    )


if __name__ == "__main__":
    main()
