"""The worker's resource store keys values by (session, id) and moves named state between
sessions (python/jaxcluster/worker/resources.py)."""

from __future__ import annotations

import numpy as np
import pytest

from jaxcluster.errors import NotFoundError
from jaxcluster.worker.resources import ResourceInputError, ResourceRegistry, nbytes


def test_sessions_never_see_or_overwrite_each_others_values() -> None:
    registry = ResourceRegistry()
    registry.put("a", 1, "a's")
    registry.put("b", 1, "b's")
    assert registry.resolve("a", 1) == "a's"
    assert registry.resolve("b", 1) == "b's"
    with pytest.raises(ResourceInputError) as raised:
        registry.resolve("c", 1)
    assert isinstance(raised.value.original, NotFoundError)
    assert registry.release("b", [1]) == 1
    assert registry.resolve("a", 1) == "a's"


def test_releasing_a_session_drops_only_its_values_and_counts_bytes() -> None:
    registry = ResourceRegistry()
    registry.put("a", 1, {"w": np.zeros(256, np.float32)}, name="params")
    registry.put("a", 2, iter(range(3)))
    registry.put("b", 1, np.zeros(10, np.int8))
    held = registry.held("a")
    assert (held.values, held.bytes, held.named) == (2, 1024, True)
    assert registry.release_session("a") == 2
    assert registry.held("a").values == 0
    assert registry.held("b").bytes == 10


def test_named_state_is_adopted_by_a_new_session_and_lost_by_the_old() -> None:
    registry = ResourceRegistry(worker_index=3)
    registry.put("old", 5, {"step": 100}, name="trainer")
    assert registry.adopt("new", 1, "missing") is None
    assert registry.adopt("new", 1, "trainer") == "old"
    assert registry.resolve("new", 1) == {"step": 100}
    assert registry.held("new").named
    with pytest.raises(ResourceInputError) as raised:
        registry.resolve("old", 5)
    assert "adopted by session new" in str(raised.value.original)


def test_nbytes_counts_array_leaves_only() -> None:
    assert nbytes({"a": np.zeros(4, np.float64), "b": [np.zeros(2, np.int8), "text", 3]}) == 34
    assert nbytes(iter([1, 2])) == 0
