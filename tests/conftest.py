"""Shared pytest configuration and fixtures. `tests/` is on sys.path, so `support` is
importable.

``cluster`` (two real workers that can import the test modules) and ``coordinator`` (a
``ClusterCoordinator`` on it) are module-scoped: a test module shares one cluster. A module
that needs another shape (ps tasks, its own error policy) defines its own ``cluster`` or
``coordinator``, which overrides these.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from support.closures import local_cluster

NUM_WORKERS = 2


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster(NUM_WORKERS) as c:
        yield c


@pytest.fixture(scope="module")
def coordinator(cluster: Any) -> Iterator[Any]:
    with cluster.coordinator() as c:
        yield c
