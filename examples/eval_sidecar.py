"""Evaluation alongside training, both ways TF does it.

1. **Inline, as a closure every N steps.** After every N training steps the coordinator
   waits for them (``join``) and schedules an evaluation closure; a worker reads the ps
   variables and computes the held-out loss while training goes on (TF's "inline
   evaluation" with ``ClusterCoordinator.schedule``). Here the next steps wait for the
   evaluation only so that it sees exactly the N steps; drop that ``join`` to overlap.
2. **A sidecar evaluator** (TF's ``tf.keras.utils.SidecarEvaluator``): a separate process
   that never talks to the cluster. Training writes a checkpoint every N steps with
   ``strategy.save`` (atomic: a reader sees the old file or the new one, never a mix);
   the sidecar polls the file, reads it with ``jaxcluster.strategy.checkpoint.
   read_checkpoint`` and evaluates every new version until training says it is done. It
   needs no token and no cluster access, only the checkpoint directory, so it can run
   anywhere (its own Kubernetes Job, a login node) and fall behind without slowing
   training.

Run it::

    python examples/eval_sidecar.py --small    # seconds: 2 workers, 1 ps
    python examples/eval_sidecar.py            # more steps
    python examples/eval_sidecar.py --sidecar CKPT_PATH   # only the sidecar, for a
                                                          # checkpoint another job writes
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from _cluster import cluster
from jaxcluster.coordinator import ClusterCoordinator
from jaxcluster.strategy import ParameterServerStrategy
from jaxcluster.strategy.checkpoint import read_checkpoint

DIM = 8
TARGET = np.linspace(1.0, -1.0, DIM).astype(np.float32)
RNG = np.random.default_rng(123)
EVAL_X = RNG.normal(size=(512, DIM)).astype(np.float32)
EVAL_Y = EVAL_X @ TARGET


def eval_loss(w: np.ndarray) -> float:
    return float(np.mean((EVAL_X @ w - EVAL_Y) ** 2))


def sidecar(path: str, poll: float = 0.05) -> None:
    """Evaluates every new checkpoint at ``path`` until ``path + '.done'`` appears and the
    last checkpoint was evaluated."""
    seen_step = -1
    print("sidecar: ready", flush=True)
    while True:
        done = os.path.exists(path + ".done")  # read before the checkpoint: no race
        if os.path.exists(path):
            arrays = read_checkpoint(path)
            step = int(arrays["step"])
            if step != seen_step:
                seen_step = step
                print(f"sidecar: step {step} eval loss {eval_loss(arrays['w']):.4f}", flush=True)
        if done:
            return
        time.sleep(poll)  # polling a file, as TF's SidecarEvaluator does


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="a few seconds (what CI runs)")
    parser.add_argument("--sidecar", metavar="CKPT", help="run only the sidecar evaluator")
    args = parser.parse_args()
    if args.sidecar:
        sidecar(args.sidecar)
        return
    small = args.small or os.environ.get("JAXCLUSTER_EXAMPLES_SMALL") == "1"
    steps, every = (60, 20) if small else (1000, 100)
    with cluster(2, num_ps=1) as c, tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model.ckpt")
        # The sidecar: its own process, reading only the checkpoint file.
        evaluator = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--sidecar", path],
            stdout=subprocess.PIPE,
            text=True,
        )
        sidecar_lines: list[str] = []
        ready = threading.Event()

        def read_sidecar() -> None:
            for line in evaluator.stdout or []:
                if line.strip() == "sidecar: ready":
                    ready.set()
                else:
                    sidecar_lines.append(line)

        reader = threading.Thread(target=read_sidecar, daemon=True)
        reader.start()
        if not ready.wait(timeout=60):  # started before training, as a real sidecar is
            raise RuntimeError("the sidecar evaluator did not start within 60 s")
        strategy = ParameterServerStrategy(c.resolver, auth_token=c.auth_token)
        strategy.wait_for_ps(timeout=120)
        with strategy.scope():
            w = strategy.Variable(np.zeros(DIM, np.float32), name="w")
            step = strategy.Variable(0, name="step")
        with ClusterCoordinator(strategy) as coordinator:

            def train_step(seed: int) -> None:
                rng = np.random.default_rng(seed)
                x = rng.normal(size=(32, DIM)).astype(np.float32)
                error = x @ w.read_value() - x @ TARGET
                w.assign_sub(0.05 * 2 * x.T @ error / len(x))
                step.assign_add(1)

            def evaluate() -> tuple[int, float]:  # 1. runs on a worker
                return int(step.read_value()), eval_loss(w.read_value())

            inline = []
            for i in range(steps):
                coordinator.schedule(train_step, args=(i,))
                if (i + 1) % every == 0:
                    coordinator.join()  # the N steps are in; evaluate exactly them
                    inline.append(coordinator.schedule(evaluate))
                    strategy.save(path)  # 2. what the sidecar evaluates, meanwhile
                    coordinator.join()
            coordinator.join()
            for at_step, loss in coordinator.fetch(inline):
                print(f"inline: step {at_step} eval loss {loss:.4f}")
        open(path + ".done", "w").close()
        evaluator.wait(timeout=60)
        reader.join(timeout=60)
        print("".join(sidecar_lines), end="")
        losses = [float(line.rsplit(" ", 1)[1]) for line in sidecar_lines]
        print(
            f"RESULT initial eval loss {eval_loss(np.zeros(DIM, np.float32)):.4f}, "
            f"sidecar evaluated {len(losses)} checkpoints, last {losses[-1]:.4f}"
        )


if __name__ == "__main__":
    main()
