"""Sharded ``jax.jit`` functions on workers with several devices (forced CPU devices).

The coordinator here is the test process, whose JAX has one CPU device: functions are
lowered against an ``AbstractMesh`` of the workers' size, as a CPU-only coordinator would
ship them to an 8-chip TPU host. One test runs the issue's own script, whose coordinator
has four devices and a concrete ``Mesh``, in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from jaxcluster import errors
from jaxcluster.coordinator import ClusterCoordinator
from jaxcluster.coordinator.functions import SerializedFunction
from jaxcluster.coordinator.placement import WorkerFacts
from support.closures import local_cluster

jax = pytest.importorskip("jax")
jnp = jax.numpy
from jax.sharding import AbstractMesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

try:
    from jax import shard_map
except ImportError:  # JAX before 0.7
    from jax.experimental.shard_map import shard_map  # type: ignore[no-redef]

DEVICES = 4
FORCE = f"--xla_force_host_platform_device_count={DEVICES}"


@pytest.fixture(scope="module")
def coordinator() -> Iterator[ClusterCoordinator]:
    with local_cluster(2, XLA_FLAGS=FORCE) as cluster, cluster.coordinator() as c:
        yield c


def on(mesh: AbstractMesh, *spec: Any) -> NamedSharding:
    return NamedSharding(mesh, P(*spec))


def test_the_workers_report_their_devices(coordinator: ClusterCoordinator) -> None:
    from support.closures import wait_until

    statuses = wait_until(
        lambda: [w for w in coordinator.workers if w.get("device_count")], "worker statuses"
    )
    assert {w["device_count"] for w in statuses} == {DEVICES}
    assert {w["device_kind"] for w in statuses} == {"cpu"}


def test_a_1d_sharded_function_matches_local_results(coordinator: ClusterCoordinator) -> None:
    mesh = AbstractMesh((DEVICES,), ("d",))
    f = jax.jit(lambda x: jnp.sum(jnp.sin(x) ** 2, axis=0), in_shardings=on(mesh, "d"))
    x = np.arange(128, dtype=np.float32).reshape(16, 8)
    remote = coordinator.schedule(f, args=(x,)).fetch()
    np.testing.assert_allclose(remote, np.sum(np.sin(x) ** 2, axis=0), rtol=1e-5)


def test_every_device_of_the_worker_runs_a_shard(coordinator: ClusterCoordinator) -> None:
    mesh = AbstractMesh((DEVICES,), ("d",))

    def shard_index(x: Any) -> Any:
        return jnp.full((1,), jax.lax.axis_index("d"), jnp.int32) + 0 * x[:1, 0].astype(jnp.int32)

    f = jax.jit(
        shard_map(shard_index, mesh=mesh, in_specs=P("d"), out_specs=P("d")),
        in_shardings=on(mesh, "d"),
        out_shardings=on(mesh, "d"),
    )
    out = coordinator.schedule(f, args=(np.ones((8, 2), np.float32),)).fetch()
    np.testing.assert_array_equal(out, np.arange(DEVICES))


def test_a_2d_mesh_with_pytrees_and_sharded_outputs(coordinator: ClusterCoordinator) -> None:
    mesh = AbstractMesh((2, 2), ("x", "y"))

    def step(params: dict[str, Any], batch: Any) -> dict[str, Any]:
        hidden = jnp.tanh(batch @ params["w"] + params["b"])
        return {"hidden": hidden, "mean": jnp.mean(hidden), "w2": params["w"] * 2}

    f = jax.jit(
        step,
        in_shardings=({"w": on(mesh, None, "y"), "b": on(mesh, "y")}, on(mesh, "x", None)),
        out_shardings={"hidden": on(mesh, "x", "y"), "mean": on(mesh), "w2": on(mesh, "x", "y")},
    )
    rng = np.random.default_rng(0)
    params = {
        "w": rng.normal(size=(6, 4)).astype(np.float32),
        "b": rng.normal(size=(4,)).astype(np.float32),
    }
    batch = rng.normal(size=(8, 6)).astype(np.float32)
    remote = coordinator.schedule(f, args=(params, batch)).fetch()
    hidden = np.tanh(batch @ params["w"] + params["b"])
    assert set(remote) == {"hidden", "mean", "w2"}
    np.testing.assert_allclose(remote["hidden"], hidden, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(remote["mean"], hidden.mean(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(remote["w2"], params["w"] * 2)
    assert all(type(v) is np.ndarray for v in remote.values())


def test_a_replicated_output_of_a_sharded_input(coordinator: ClusterCoordinator) -> None:
    mesh = AbstractMesh((DEVICES,), ("d",))
    f = jax.jit(
        lambda x, scale: (x * scale).sum(),
        in_shardings=(on(mesh, "d"), on(mesh)),
        out_shardings=on(mesh),
    )
    x = np.arange(16, dtype=np.float32)
    assert coordinator.schedule(f, args=(x, np.float32(3))).fetch() == 360.0


def test_a_mesh_larger_than_the_workers_is_refused_at_schedule(
    coordinator: ClusterCoordinator,
) -> None:
    mesh = AbstractMesh((2 * DEVICES,), ("d",))
    f = jax.jit(lambda x: x * 2, in_shardings=on(mesh, "d"))
    before = coordinator.metrics()["completed"]
    with pytest.raises(errors.InvalidArgumentError) as info:
        coordinator.schedule(f, args=(np.ones(16, np.float32),))
    message = str(info.value)
    assert f"needs {2 * DEVICES} devices" in message
    assert f"has {DEVICES} cpu device(s)" in message and "127.0.0.1:" in message
    assert isinstance(info.value, ValueError)
    assert coordinator.metrics()["completed"] == before  # nothing ran


class _Dispatcher:
    """Worker statuses shaped like ``_core.WorkerStatus`` (its ``report`` once a platform is
    known), from the fields given."""

    def __init__(self, statuses: list[dict[str, Any]]) -> None:
        self.statuses = [
            SimpleNamespace(
                index=s["index"],
                address=s.get("address", "?"),
                state="up",
                report=SimpleNamespace(
                    platform=s["platform"], device_count=s.get("device_count", 0), device_kind=""
                )
                if "platform" in s
                else None,
            )
            for s in statuses
        ]

    def worker_statuses(self) -> list[Any]:
        return self.statuses

    def wait_reported(self, timeout: float) -> bool:
        """Whether a worker has reported (the table is fixed: no waiting)."""
        return any(status.report is not None for status in self.statuses)


def _export(devices: int, platforms: tuple[str, ...]) -> SerializedFunction:
    return SerializedFunction(
        b"h" * 32, "jax_export", b"", devices=devices, platforms=platforms, name="step"
    )


def test_a_function_for_another_platform_is_refused_naming_both() -> None:
    tpu_worker = {"index": 1, "address": "w1:8470", "platform": "tpu", "device_count": 8}
    facts = WorkerFacts(_Dispatcher([tpu_worker]))
    with pytest.raises(errors.InvalidArgumentError, match=r"step was exported for .*cpu.*'tpu'"):
        facts.check(_export(1, ("cpu",)))
    facts.check(_export(8, ("tpu",)))  # fits: no error
    with pytest.raises(errors.InvalidArgumentError, match=r"needs 16 devices.*has 8"):
        facts.check(_export(16, ("tpu",)))
    # A cloudpickled function carries no device needs, and a silent worker proves nothing.
    facts.check(SerializedFunction(b"h" * 32, "cloudpickle", b""))
    assert WorkerFacts(_Dispatcher([{"index": 0}])).platforms() != ()


def test_the_issue_script_with_a_concrete_mesh_on_the_coordinator(tmp_path: Any) -> None:
    script = tmp_path / "sharded.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os; os.environ["XLA_FLAGS"] = "{FORCE}"
            import jax, jax.numpy as jnp, numpy as np, jaxcluster
            from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
            mesh = Mesh(np.array(jax.devices()), ("d",))
            f = jax.jit(lambda x: jnp.sum(jnp.sin(x) ** 2, axis=0),
                        in_shardings=NamedSharding(mesh, P("d")))
            x = np.arange(128, dtype=np.float32).reshape(16, 8)
            env = {{"XLA_FLAGS": "{FORCE}"}}
            with jaxcluster.LocalCluster(2, env=env) as c, c.coordinator() as co:
                remote = co.schedule(f, args=(x,)).fetch()
            np.testing.assert_allclose(remote, np.asarray(f(x)), rtol=1e-5)
            print("ok", remote.shape)
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", "(8,)"]
