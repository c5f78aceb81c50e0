"""Progress bars for closures, on ``tqdm``: one over RemoteValues as they end, and one for
``ClusterCoordinator.join(progress=True)``.

Example::

    values = [coordinator.schedule(step, args=(i,)) for i in range(1000)]
    for value in jaxcluster.progress(values, desc="steps"):
        total += value.fetch()          # in the order the closures end

    coordinator.join(progress=True)     # a bar counting the closures that end
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jaxcluster._core import Dispatcher, Metrics

__all__ = ["join_with_progress", "progress"]

# Longest wait on one RemoteValue before looking at the others again: a closure that ends
# out of order shows within this.
_SWEEP_SECONDS = 0.05


def progress(
    remote_values: Iterable[Any], *, desc: str | None = None, **tqdm_args: Any
) -> Iterator[Any]:
    """Yields each of ``remote_values`` once its closure has ended (with a value, an
    error or a cancellation), in the order they end, advancing a ``tqdm`` progress bar.

    ``tqdm_args`` go to ``tqdm.tqdm`` (e.g. ``file=``, ``disable=``, ``leave=``);
    ``unit`` defaults to ``"closure"``. Nothing is fetched: call ``fetch()`` on what is
    yielded (a failed closure raises there, not here). Like ``concurrent.futures
    .as_completed`` for RemoteValues.

    Example::

        done = [v.fetch() for v in jaxcluster.progress(values, desc="eval")]
    """
    from tqdm.auto import tqdm

    from jaxcluster.coordinator.remote_value import RemoteValue

    pending: deque[RemoteValue] = deque()
    for value in remote_values:
        if not isinstance(value, RemoteValue):
            raise TypeError(
                f"progress() takes RemoteValues (what schedule() returns), got "
                f"{type(value).__qualname__}: {value!r}"
            )
        pending.append(value)
    tqdm_args.setdefault("unit", "closure")
    with tqdm(total=len(pending), desc=desc, **tqdm_args) as bar:
        while pending:
            pending[0]._wait(_SWEEP_SECONDS)
            waiting: deque[RemoteValue] = deque()
            ended: list[RemoteValue] = []
            for value in pending:
                (ended if value.done() else waiting).append(value)
            pending = waiting
            if ended:
                bar.update(len(ended))
                yield from ended


def join_with_progress(
    dispatcher: Dispatcher, timeout: float | None = None, **tqdm_args: Any
) -> bool:
    """``dispatcher.join(timeout)`` with a ``tqdm`` bar of the closures ending meanwhile
    (its total grows if more are scheduled while it waits). Raises what ``join`` raises."""
    import time

    from tqdm.auto import tqdm

    def ended(metrics: Metrics) -> int:
        return metrics.completed + metrics.failed + metrics.cancelled

    start = dispatcher.metrics()
    baseline = ended(start)
    deadline = None if timeout is None else time.monotonic() + max(0.0, float(timeout))
    tqdm_args.setdefault("unit", "closure")
    tqdm_args.setdefault("desc", "join")
    with tqdm(total=start.queued + start.inflight, **tqdm_args) as bar:
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            finished = bool(dispatcher.join(_SWEEP_SECONDS * 4 if left is None else min(left, 0.2)))
            metrics = dispatcher.metrics()
            done = ended(metrics) - baseline
            bar.total = max(bar.total or 0, done + metrics.queued + metrics.inflight)
            bar.update(done - bar.n)
            if finished:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
