"""Where the examples get their cluster: a real one when ``JAXCLUSTER_ENVIRONMENT`` is set
(e.g. ``kubernetes``, ``slurm``, ``explicit`` with ``JAXCLUSTER_WORKERS``/``JAXCLUSTER_PS``;
the token from ``JAXCLUSTER_AUTH_TOKEN``), else a ``LocalCluster`` of processes on loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple


class Cluster(NamedTuple):
    """A resolver and the token its tasks accept; ``local`` is the LocalCluster, if any."""

    resolver: Any
    auth_token: str | None
    local: Any


@contextlib.contextmanager
def cluster(
    num_workers: int, num_ps: int = 0, env: Mapping[str, str] | None = None, **local: Any
) -> Iterator[Cluster]:
    """A real cluster from ``resolve()`` when ``JAXCLUSTER_ENVIRONMENT`` is set, else a
    ``LocalCluster(num_workers, num_ps=num_ps, env=env, **local)`` stopped on exit."""
    if os.environ.get("JAXCLUSTER_ENVIRONMENT"):
        from jaxcluster.cluster_resolver import resolve

        yield Cluster(resolve(), None, None)
        return
    from jaxcluster import LocalCluster

    with LocalCluster(num_workers, num_ps=num_ps, env=env, **local) as c:
        yield Cluster(c.resolver, c.auth_token, c)


def parse_args(
    doc: str | None, add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
) -> argparse.Namespace:
    """``--small``: the size CI runs in seconds (also ``JAXCLUSTER_EXAMPLES_SMALL=1``);
    ``add_arguments(parser)`` adds an example's own flags."""
    parser = argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--small", action="store_true", help="a few seconds on a LocalCluster (what CI runs)"
    )
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args()
    args.small = args.small or os.environ.get("JAXCLUSTER_EXAMPLES_SMALL") == "1"
    return args
