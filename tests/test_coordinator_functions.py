"""Serializing scheduled functions: jax.export round trips, cloudpickle, and the caches."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from jaxcluster.coordinator.functions import (
    KIND_CLOUDPICKLE,
    KIND_JAX_EXPORT,
    FunctionSerializer,
    is_jitted,
)

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pytest.importorskip("flatbuffers")  # jax.export's serializer needs it


def _load_export(payload: bytes) -> Any:
    from jax import export

    return export.deserialize(bytearray(payload)).call


@jax.jit
def _mlp(params: dict[str, Any], x: Any, *, scale: Any) -> tuple[Any, Any]:
    hidden = jnp.tanh(x @ params["w"] + params["b"])
    return hidden * scale, jnp.mean(hidden**2)


def _params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "w": rng.normal(size=(4, 3)).astype(np.float32),
        "b": rng.normal(size=(3,)).astype(np.float32),
    }


def test_a_jitted_function_with_arrays_is_exported_and_round_trips() -> None:
    rng = np.random.default_rng(1)
    params, x = _params(rng), rng.normal(size=(5, 4)).astype(np.float32)
    serializer = FunctionSerializer(platforms=lambda: ("cpu",))
    sent = serializer.serialize(_mlp, (params, x), {"scale": 0.5})
    assert sent.kind == KIND_JAX_EXPORT
    assert len(sent.function_hash) == 32
    remote_out, remote_loss = _load_export(sent.payload)(params, x, scale=0.5)
    local_out, local_loss = _mlp(params, x, scale=0.5)
    np.testing.assert_allclose(np.asarray(remote_out), np.asarray(local_out), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(remote_loss), np.asarray(local_loss), rtol=1e-6)


def test_exports_are_cached_per_signature_and_platforms() -> None:
    platforms = ["cpu"]
    serializer = FunctionSerializer(platforms=lambda: tuple(platforms))
    f = jax.jit(lambda a, b: a * b + 1)
    x3, x4 = np.ones(3, np.float32), np.ones(4, np.float32)
    first = serializer.serialize(f, (x3, 2.0), {})
    assert serializer.serialize(f, (x3 * 7, 3.0), {}) is first  # same shapes and dtypes
    assert serializer.exports == 1
    other_shape = serializer.serialize(f, (x4, 2.0), {})
    assert other_shape.function_hash != first.function_hash
    serializer.serialize(f, (x3.astype(np.int32), 2.0), {})
    assert serializer.exports == 3
    platforms.append("cuda")  # a worker on another platform joined
    multi = serializer.serialize(f, (x3, 2.0), {})
    assert serializer.exports == 4
    from jax import export

    assert set(export.deserialize(bytearray(multi.payload)).platforms) == {"cpu", "cuda"}


def test_a_jitted_function_given_non_array_args_is_cloudpickled() -> None:
    serializer = FunctionSerializer(platforms=lambda: ("cpu",))
    f = jax.jit(lambda x, n: x * len(n), static_argnums=1)
    sent = serializer.serialize(f, (np.ones(2, np.float32), "abc"), {})
    assert sent.kind == KIND_CLOUDPICKLE
    assert serializer.exports == 0
    loaded = pickle.loads(sent.payload)
    np.testing.assert_allclose(np.asarray(loaded(np.ones(2, np.float32), "abc")), [3.0, 3.0])


def test_a_plain_function_is_cloudpickled_once_while_its_captures_stay() -> None:
    serializer = FunctionSerializer(platforms=lambda: ("cpu",))
    offset = 10

    def add(x: int) -> int:
        return x + offset

    first = serializer.serialize(add, (1,), {})
    assert first.kind == KIND_CLOUDPICKLE
    assert serializer.serialize(add, (2,), {}) is first
    assert pickle.loads(first.payload)(1) == 11
    offset = 20  # rebinding a captured variable must not send the stale function
    second = serializer.serialize(add, (1,), {})
    assert second.function_hash != first.function_hash
    assert pickle.loads(second.payload)(1) == 21


_GLOBAL_FACTOR = 3


def _times_global(x: int) -> int:
    return x * _GLOBAL_FACTOR


def test_rebinding_a_global_the_function_uses_reserializes_by_value_functions() -> None:
    global _GLOBAL_FACTOR
    serializer = FunctionSerializer(platforms=lambda: ("cpu",))
    # A copy of the function in a fresh namespace is pickled by value, globals included.
    namespace: dict[str, Any] = {"_GLOBAL_FACTOR": 3}
    exec("def times(x):\n    return x * _GLOBAL_FACTOR\n", namespace)
    times = namespace["times"]
    first = serializer.serialize(times, (), {})
    assert pickle.loads(first.payload)(2) == 6
    namespace["_GLOBAL_FACTOR"] = 5
    second = serializer.serialize(times, (), {})
    assert pickle.loads(second.payload)(2) == 10
    # A module-level function is pickled by reference: same payload whatever its globals.
    before = serializer.serialize(_times_global, (), {})
    _GLOBAL_FACTOR = 4
    try:
        assert serializer.serialize(_times_global, (), {}).function_hash == before.function_hash
    finally:
        _GLOBAL_FACTOR = 3


def test_callable_objects_are_pickled_each_time_with_a_content_hash() -> None:
    class Scaler:
        def __init__(self, k: int) -> None:
            self.k = k

        def __call__(self, x: int) -> int:
            return x * self.k

    serializer = FunctionSerializer(platforms=lambda: ("cpu",))
    scaler = Scaler(2)
    a = serializer.serialize(scaler, (), {})
    b = serializer.serialize(scaler, (), {})
    assert a is not b and a.function_hash == b.function_hash
    scaler.k = 3  # state changed in place: the next payload must carry it
    c = serializer.serialize(scaler, (), {})
    assert c.function_hash != a.function_hash
    assert pickle.loads(c.payload)(2) == 6


def test_bad_functions_are_rejected_clearly() -> None:
    serializer = FunctionSerializer(platforms=lambda: ("cpu",))
    with pytest.raises(TypeError, match="callable fn, got int"):
        serializer.serialize(42, (), {})  # type: ignore[arg-type]
    import threading

    lock = threading.Lock()
    with pytest.raises(TypeError, match="cloudpickle failed"):
        serializer.serialize(lambda: lock.locked(), (), {})


def test_is_jitted_tells_jit_functions_apart() -> None:
    assert is_jitted(jax.jit(lambda x: x))
    assert not is_jitted(lambda x: x)
    assert not is_jitted(np.sum)
