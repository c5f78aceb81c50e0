"""The generated references of the documentation site (docs/gen_ref.py) match the code.

The site build fails on drift too; this catches it in the ordinary test run, before anyone
builds the docs: every ``JAXCLUSTER_*`` / ``TF_COORDINATOR_*`` variable the code reads has a
description, and a real coordinator, worker and ps export the families the page lists.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

GEN_REF = Path(__file__).resolve().parent.parent / "docs" / "gen_ref.py"


@pytest.fixture(scope="module")
def gen_ref() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_ref", GEN_REF)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_variable_the_code_reads_is_described(gen_ref: ModuleType) -> None:
    found = gen_ref.env_variables()
    # Names read in Python and in Rust are both found, each with where it is read.
    assert "python/jaxcluster/_auth.py" in " ".join(found["JAXCLUSTER_AUTH_TOKEN"])
    assert any(p.startswith("rust/") for p in found["JAXCLUSTER_WORKER_RECOVERY_SEC"])
    table = gen_ref.env_table()  # raises naming any variable without a description
    assert all(f"`{name}`" in table for name in found)


def test_the_metrics_reference_lists_what_the_endpoints_export(gen_ref: ModuleType) -> None:
    pytest.importorskip("prometheus_client")
    families = gen_ref.metric_families()
    names = {where: {row[0] for row in rows} for where, rows in families.items()}
    assert "jaxcluster_closures_total" in names["coordinator"]
    assert "jaxcluster_worker_up" in names["coordinator"]
    assert "jaxcluster_executor_closures_total" in names["worker"]
    assert "jaxcluster_ps_updates_total" in names["ps"]
    assert all(text for rows in families.values() for _, _, text, _ in rows), "a family lacks help"
    assert "| `jaxcluster_task_info` | gauge |" in gen_ref.metrics_table()
