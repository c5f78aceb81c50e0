"""jaxcluster.devices: TPU device maps, core-count checks, and JAX device names."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pytest

from jaxcluster import devices
from jaxcluster._native import core
from jaxcluster.devices import (
    DeviceSpec,
    device_type,
    device_types,
    tf_device_name,
    tf_device_names,
    tpu_device_map,
    verify_same_core_count,
)


@dataclass(frozen=True)
class FakeDevice:
    """The three attributes of ``jax.Device`` the converters read."""

    platform: str
    id: int
    process_index: int = 0


def tpu_slice(hosts: int, cores: int) -> list[FakeDevice]:
    """Devices as JAX numbers them on a multi-host TPU: ids are global, host-major."""
    return [
        FakeDevice("tpu", host * cores + core, process_index=host)
        for host in range(hosts)
        for core in range(cores)
    ]


def test_helpers_are_the_native_ones() -> None:
    assert devices.tpu_device_map is core.tpu_device_map
    assert devices.verify_same_core_count is core.verify_same_core_count
    assert devices.DeviceSpec is core.DeviceSpec


def test_tpu_device_map_groups_sorted_cores_by_host() -> None:
    names = [
        "/job:worker/replica:0/task:1/device:TPU:1",
        "/job:worker/replica:0/task:0/device:TPU:1",
        "/job:worker/replica:0/task:1/device:TPU:0",
        "/job:worker/replica:0/task:0/device:TPU:0",
        "/job:worker/replica:0/task:0/device:CPU:0",
        "/job:worker/replica:0/task:0/device:TPU_SYSTEM:0",
        "/job:worker/replica:0/task:1/device:GPU:0",
    ]
    cores_by_host, total = tpu_device_map(names)
    assert cores_by_host == {0: [0, 1], 1: [0, 1]}
    assert list(cores_by_host) == [0, 1]
    assert total == 4
    assert verify_same_core_count(cores_by_host) == 2


def test_tpu_device_map_of_no_tpus_is_empty() -> None:
    assert tpu_device_map([]) == ({}, 0)
    assert tpu_device_map(iter(["/job:w/task:0/device:CPU:0"])) == ({}, 0)
    assert verify_same_core_count({}) == 0


@pytest.mark.parametrize(
    ("names", "needle"),
    [
        (["/job:w/task:0/device:TPU:0", "/job:w/tsk:1/device:TPU:0"], '"tsk:1"'),
        (["/job:w/device:TPU:0"], "has no task"),
        (["/job:w/task:2/device:TPU:*"], "has no core index"),
        (["/task:0/device:TPU:1", "/job:w/task:0/tpu:1"], "core 1 of host 0 is listed twice"),
    ],
)
def test_tpu_device_map_rejects_bad_names(names: list[str], needle: str) -> None:
    with pytest.raises(ValueError) as info:
        tpu_device_map(names)
    assert needle in str(info.value)


def test_tpu_device_map_wants_names_not_one_string() -> None:
    with pytest.raises(TypeError, match="single str"):
        tpu_device_map("/job:w/task:0/device:TPU:0")
    with pytest.raises(TypeError, match="got int 2"):
        tpu_device_map(["/job:w/task:0/device:TPU:0", 2])  # type: ignore[list-item]


def test_verify_same_core_count_names_the_hosts_that_differ() -> None:
    with pytest.raises(RuntimeError) as info:
        verify_same_core_count({0: [0, 1, 2, 3], 1: [0, 1, 2, 3], 2: [0, 1], 3: [0, 1, 2, 3]})
    message = str(info.value)
    assert "hosts 0, 1, 3: 4 cores" in message
    assert "host 2: 2 cores" in message


def test_verify_same_core_count_takes_any_mapping() -> None:
    class Layout(Mapping[int, list[int]]):
        def __getitem__(self, host: int) -> list[int]:
            return [0, 1, 2]

        def __iter__(self) -> Iterator[int]:
            return iter(range(4))

        def __len__(self) -> int:
            return 4

    assert verify_same_core_count(Layout()) == 3
    with pytest.raises(TypeError, match="mapping of host id"):
        verify_same_core_count([[0, 1]])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="host id 'a'"):
        verify_same_core_count({"a": [0]})  # type: ignore[dict-item]


def test_fake_tpu_slice_to_names_to_layout() -> None:
    names = tf_device_names(tpu_slice(hosts=2, cores=4), job="tpu_worker")
    assert names[0] == "/job:tpu_worker/replica:0/task:0/device:TPU:0"
    assert names[5] == "/job:tpu_worker/replica:0/task:1/device:TPU:5"
    cores_by_host, total = tpu_device_map(names)
    assert cores_by_host == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    assert total == 8
    assert verify_same_core_count(cores_by_host) == 4


def test_uneven_fake_slice_is_reported() -> None:
    uneven = [*tpu_slice(hosts=2, cores=2), FakeDevice("tpu", 9, process_index=1)]
    cores_by_host, _ = tpu_device_map(tf_device_names(uneven))
    with pytest.raises(RuntimeError, match="host 1: 3 cores"):
        verify_same_core_count(cores_by_host)


@pytest.mark.parametrize(
    ("platform", "expected"),
    [("cpu", "CPU"), ("gpu", "GPU"), ("cuda", "GPU"), ("rocm", "GPU"), ("tpu", "TPU"),
     ("neuron", "NEURON")],
)  # fmt: skip
def test_device_type_of_platforms(platform: str, expected: str) -> None:
    device = FakeDevice(platform, 3, process_index=2)
    assert device_type(device) == expected
    name = tf_device_name(device)
    assert name == f"/job:worker/replica:0/task:2/device:{expected}:3"
    assert DeviceSpec.from_string(name).device_type == expected


def test_device_types_pairs_for_a_device_lister() -> None:
    fakes = [FakeDevice("tpu", 0), FakeDevice("cpu", 1)]
    assert device_types(fakes, job="w") == [
        ("/job:w/replica:0/task:0/device:TPU:0", "TPU"),
        ("/job:w/replica:0/task:0/device:CPU:1", "CPU"),
    ]


@pytest.mark.parametrize("job", ["", "a/b", "a:b", 3])
def test_bad_job_names_are_rejected(job: object) -> None:
    with pytest.raises(ValueError, match="cannot appear in a device name"):
        tf_device_names([FakeDevice("cpu", 0)], job=job)  # type: ignore[arg-type]


def test_bad_devices_are_rejected() -> None:
    class NoProcess:
        platform = "cpu"
        id = 0

    with pytest.raises(TypeError, match="has no attribute 'process_index'"):
        tf_device_names([NoProcess()])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="has no attribute 'platform'"):
        tf_device_names([object()])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="has id -1"):
        tf_device_names([FakeDevice("cpu", -1)])
    with pytest.raises(ValueError, match="has platform 'a/b'"):
        tf_device_names([FakeDevice("a/b", 0)])


def test_real_jax_cpu_devices() -> None:
    jax = pytest.importorskip("jax")
    real = jax.devices()
    names = tf_device_names()
    assert len(names) == len(real)
    pattern = re.compile(r"/job:worker/replica:0/task:(\d+)/device:([A-Z]+):(\d+)")
    for name, device in zip(names, real, strict=True):
        match = pattern.fullmatch(name)
        assert match is not None, name
        assert int(match.group(1)) == device.process_index == jax.process_index()
        assert match.group(2) == device.platform.upper()
        assert int(match.group(3)) == device.id
        spec = DeviceSpec.from_string(name)
        assert (spec.task, spec.device_index) == (device.process_index, device.id)
    cpu_names = tf_device_names(jax.devices("cpu"), job="chief")
    assert all(n.startswith("/job:chief/") and "/device:CPU:" in n for n in cpu_names)
    assert [kind for _, kind in device_types(jax.devices("cpu"))] == ["CPU"] * len(cpu_names)


def test_export_platform_names_backends_as_jax_export_does() -> None:
    jax = pytest.importorskip("jax")
    from jax import export

    from jaxcluster.devices import export_platform

    here = export_platform()
    assert here == jax.default_backend() == "cpu"
    assert export_platform("tpu") == "tpu"
    # JAX says "gpu"; jax.export refuses that name and lowers for "cuda" or "rocm".
    assert export_platform("gpu") in ("cuda", "rocm")
    # What this process reports is a name jax.export lowers for.
    exported = export.export(jax.jit(lambda x: x + 1), platforms=(here,))(
        jax.ShapeDtypeStruct((2,), "float32")
    )
    assert exported.platforms == (here,)


def test_a_worker_runs_a_single_device_export_through_jit() -> None:
    jax = pytest.importorskip("jax")
    import numpy as np
    from jax import export

    from jaxcluster.worker.functions import FunctionCache

    exported = export.export(jax.jit(lambda x: x * 2.0 + 1.0))(
        jax.ShapeDtypeStruct((4,), "float32")
    )
    payload = bytes(exported.serialize())
    fn = FunctionCache().get(b"h" * 32, "jax_export", lambda: payload)
    # jit-wrapped: a staged call is cached instead of re-staged on every call.
    assert hasattr(fn, "lower")
    assert np.array_equal(np.asarray(fn(np.arange(4, dtype=np.float32))), [1.0, 3.0, 5.0, 7.0])
