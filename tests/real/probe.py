"""Run in every task of a real srun/mpirun by tests/real: writes ``$PROBE_DIR/<rank>.json``
with what the task saw and what jaxcluster made of it (and prints its start).

    probe.py resolve              resolve() and the spec, task, address, explain() names
    probe.py gpus                 CUDA_VISIBLE_DEVICES before/after the Slurm resolver
    probe.py allgather [DIR N]    jaxcluster.initialize() + a cross-process all-gather; with
                                  DIR and N, first waits until N processes (of any job) have
                                  initialised, so that concurrent jobs overlap
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _rank() -> int:
    for name in ("OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _emit(record: dict[str, Any]) -> None:
    base = {
        "rank": _rank(),
        "node": os.environ.get("SLURMD_NODENAME"),
        "localid": os.environ.get("SLURM_LOCALID"),
        "job_id": os.environ.get("SLURM_JOB_ID"),
    }
    text = json.dumps({**base, **record})
    # Tasks share srun's output, where long lines of different tasks can interleave: each
    # record goes to a file of its own when the test names a directory.
    directory = os.environ.get("PROBE_DIR")
    if directory:
        (Path(directory) / f"{base['rank']}.json").write_text(text)
    print("PROBE " + text[:200], flush=True)


def resolve_mode() -> None:
    from jaxcluster.cluster_resolver import explain, resolve

    try:
        resolver = resolve()
        spec = resolver.cluster_spec().as_dict()
        task = (resolver.task_type, resolver.task_id)
        report = explain()
        _emit(
            {
                "environment": report.environment,
                "spec": spec,
                "task": list(task),
                "address": resolver.cluster_spec().task_address(*task),
                "jax": resolver.jax_distributed_args(),
                "explain": str(report),
            }
        )
    except Exception as exc:  # reported to the test, which decides
        _emit({"error": f"{type(exc).__name__}: {exc}"})


def gpus_mode() -> None:
    from jaxcluster.cluster_resolver import SlurmClusterResolver

    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    resolver = SlurmClusterResolver()
    resolver.cluster_spec()
    _emit(
        {
            "before": before,
            "after": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "step_gpus": os.environ.get("SLURM_STEP_GPUS"),
            "binding": resolver.gpu_binding,
            "accelerators": resolver.num_accelerators(),
        }
    )


def allgather_mode(rendezvous: str | None, expected: int) -> None:
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    import jaxcluster

    args = jaxcluster.initialize()
    if rendezvous:
        # Every process of every job initialised before any gathers: the jobs' coordinators
        # are all alive at once.
        directory = Path(rendezvous)
        (directory / f"{os.environ.get('SLURM_JOB_ID')}-{_rank()}").touch()
        deadline = time.monotonic() + 120
        while len(list(directory.iterdir())) < expected:
            if time.monotonic() > deadline:
                raise SystemExit(f"only {len(list(directory.iterdir()))} of {expected} arrived")
            time.sleep(0.1)
    gathered = multihost_utils.process_allgather(np.array([jax.process_index() * 10 + 7]))
    _emit(
        {
            "args": args,
            "process_index": jax.process_index(),
            "process_count": jax.process_count(),
            "gathered": np.asarray(gathered).ravel().tolist(),
        }
    )
    jax.distributed.shutdown()


def main(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "resolve":
        resolve_mode()
    elif mode == "gpus":
        gpus_mode()
    elif mode == "allgather":
        allgather_mode(argv[1] if len(argv) > 1 else None, int(argv[2]) if len(argv) > 2 else 0)
    else:
        raise SystemExit(f"unknown probe mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
