"""``jaxcluster demo``: asynchronous JAX training on a local cluster that loses a worker."""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_arguments", "run"]


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
        "--workers", type=_positive, default=2, help="worker processes to start (default 2)"
    )
    parser.add_argument(
        "--steps", type=_positive, default=3000, help="training steps (default 3000)"
    )
    parser.add_argument(
        "--in-flight",
        type=_positive,
        default=4,
        help="steps scheduled ahead of the one being applied (default 4)",
    )
    parser.add_argument(
        "--no-kill",
        action="store_true",
        help="do not kill and restart a worker midway",
    )
    parser.add_argument("--seed", type=int, default=0, help="data and initialisation seed")


def run(args: argparse.Namespace) -> int:
    """Runs the demo; exit status 0 when the loss went down, 1 otherwise."""
    from jaxcluster.demo import run_demo

    result = run_demo(
        num_workers=args.workers,
        steps=args.steps,
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
