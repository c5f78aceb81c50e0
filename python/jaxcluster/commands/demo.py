""" "``jaxcluster demo``: asynchronous JAX training on a local cluster that loses a worker;
``jaxcluster demo --ps``: parameter-server training that loses a ps task and resumes from
a checkpoint; ``jaxcluster demo --slices``: SPMD steps over 2 multi-host slices, one of
which loses a host and re-forms."""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_arguments", "run"]

_DEFAULT_STEPS = 3000
_DEFAULT_PS_STEPS = 1000
_DEFAULT_SLICES_STEPS = 600


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the demo's flags to ``parser``."""
    parser.add_argument(
        "--ps",
        action="store_true",
        help="parameter-server training: variables on 2 ps tasks, a checkpoint, a killed "
        "ps and a restart from the checkpoint",
    )
    parser.add_argument(
        "--slices",
        action="store_true",
        help="training over 2 slices of 2 hosts x 2 CPU devices (each step SPMD with a "
        "cross-host psum); one host is SIGKILLed and its slice re-forms",
    )
    parser.add_argument(
        "--workers", type=_positive, default=2, help="worker processes to start (default 2)"
    )
    parser.add_argument(
        "--steps",
        type=_positive,
        default=None,
        help=f"training steps (default {_DEFAULT_STEPS}, with --ps {_DEFAULT_PS_STEPS})",
    )
    parser.add_argument(
        "--in-flight",
        type=_positive,
        default=4,
        help="steps scheduled ahead of the one being applied (default 4; not with --ps)",
    )
    parser.add_argument(
        "--no-kill",
        action="store_true",
        help="do not kill and restart a worker (with --ps: a ps task) midway",
    )
    parser.add_argument("--seed", type=int, default=0, help="data and initialisation seed")


def run(args: argparse.Namespace) -> int:
    """Runs the demo; exit status 0 when the loss went down (and, with ``--ps``, the run
    recovered from the lost ps task), 1 otherwise."""
    if args.ps and args.slices:
        print("jaxcluster demo: error: choose one of --ps and --slices", file=sys.stderr)
        return 2
    if args.ps:
        return _run_ps(args)
    if args.slices:
        return _run_slices(args)
    from jaxcluster.demos.cluster import run_demo

    steps = _DEFAULT_STEPS if args.steps is None else args.steps
    result = run_demo(
        num_workers=args.workers,
        steps=steps,
        in_flight=args.in_flight,
        kill=not args.no_kill,
        seed=args.seed,
    )
    improved = result.final_loss < result.initial_loss
    print(
        f"jaxcluster demo: {args.workers} workers, {result.steps} steps in "
        f"{result.seconds:.1f} s\n"
        f"  loss {result.initial_loss:.4f} -> {result.final_loss:.4f}"
        f"{'' if improved else '  (did not decrease)'}\n"
        f"  closures run {result.completed}, retries seen {result.retried}, worker failures "
        f"{result.worker_failures}\n"
        f"  {result.closures_per_second:.0f} closures/s"
    )
    sys.stdout.flush()
    return 0 if improved else 1


def _run_ps(args: argparse.Namespace) -> int:
    from jaxcluster.demos.ps import run_ps_demo

    steps = _DEFAULT_PS_STEPS if args.steps is None else args.steps
    if steps < 2:
        print("jaxcluster demo: error: --ps needs --steps 2 or more", file=sys.stderr)
        return 2
    result = run_ps_demo(
        num_workers=args.workers, steps=steps, kill=not args.no_kill, seed=args.seed
    )
    improved = result.final_loss < result.initial_loss
    lines = [
        f"jaxcluster demo --ps: 2 ps tasks, {args.workers} workers, {result.steps} steps in "
        f"{result.seconds:.1f} s",
        f"  loss {result.initial_loss:.4f} -> {result.final_loss:.4f}"
        + ("" if improved else "  (did not decrease)"),
    ]
    recovered = True
    if not args.no_kill:
        recovered = result.ps_error is not None
        lines += [
            f"  checkpoint at step {result.checkpoint_step} (loss {result.checkpoint_loss:.4f});"
            f" ps task 1 killed at step {result.killed_at_step}",
            f"  join() raised {result.ps_error or 'nothing (the ps failure went unnoticed)'}",
            f"  restarted every process and restored step {result.restored_step} "
            f"(loss {result.restored_loss:.4f}), then finished",
        ]
    lines.append(f"  closures run {result.completed}, ps failures seen {result.ps_failures}")
    print("\n".join(lines))
    sys.stdout.flush()
    return 0 if improved and recovered else 1


def _run_slices(args: argparse.Namespace) -> int:
    from jaxcluster.demos.slices import run_slices_demo

    steps = _DEFAULT_SLICES_STEPS if args.steps is None else args.steps
    result = run_slices_demo(
        steps=steps, in_flight=args.in_flight, kill=not args.no_kill, seed=args.seed
    )
    improved = result.final_loss < result.initial_loss
    lines = [
        f"jaxcluster demo --slices: 2 slices x 2 hosts x 2 CPU devices, {result.steps} steps "
        f"in {result.seconds:.1f} s",
        f"  loss {result.initial_loss:.4f} -> {result.final_loss:.4f}"
        + ("" if improved else "  (did not decrease)"),
        f"  steps per slice {result.steps_per_slice}, closures run {result.completed}",
    ]
    recovered = True
    if not args.no_kill:
        recovered = result.recovered_after is not None
        lines.append(
            f"  slice failures {result.slice_failures}; slice 0 "
            + (
                f"re-formed and served again {result.recovered_after:.1f} s after its host "
                "was killed"
                if result.recovered_after is not None
                else "did not serve again within 2 minutes"
            )
        )
    print("\n".join(lines))
    sys.stdout.flush()
    return 0 if improved and recovered else 1
