"""What ``import jaxcluster`` gives: the public names at the top level, loaded on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import jaxcluster
import jaxcluster.coordinator


@pytest.mark.parametrize("name", ["ClusterCoordinator", "RemoteValue"])
def test_coordinator_names_are_exported_at_the_top_level(name: str) -> None:
    assert name in jaxcluster.__all__
    assert name in dir(jaxcluster)
    assert getattr(jaxcluster, name) is getattr(jaxcluster.coordinator, name)


def test_every_name_in_all_resolves() -> None:
    missing = [name for name in jaxcluster.__all__ if not hasattr(jaxcluster, name)]
    assert missing == []


def test_the_coordinator_loads_on_first_use_only() -> None:
    script = (
        "import sys, jaxcluster\n"
        "before = 'jaxcluster.coordinator' in sys.modules\n"
        "jaxcluster.ClusterCoordinator\n"
        "print(before, 'jaxcluster.coordinator' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.split() == ["False", "True"]
