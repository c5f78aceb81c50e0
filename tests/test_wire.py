"""Value encoding: out-of-band buffers, JAX arrays, resource refs, cloudpickle fallback."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

from jaxcluster import errors, wire


def test_numpy_buffers_travel_out_of_band() -> None:
    big = np.arange(100_000, dtype=np.float64)
    encoded = wire.encode(((big,), {"k": 1}))
    assert len(encoded.buffers) == 1
    assert len(encoded.buffers[0]) == big.nbytes
    assert len(encoded.pickle) < 1_000  # the array's bytes are not in the pickle
    (args, kwargs) = wire.decode(encoded.pickle, encoded.buffers)
    np.testing.assert_array_equal(args[0], big)
    assert kwargs == {"k": 1}


def test_jax_arrays_arrive_as_numpy() -> None:
    jnp = pytest.importorskip("jax.numpy")
    value = {"w": jnp.arange(6.0).reshape(2, 3), "n": [jnp.ones(2)]}
    decoded = wire.decode(*_parts(wire.encode(value)))
    assert type(decoded["w"]) is np.ndarray and decoded["w"].shape == (2, 3)
    np.testing.assert_array_equal(decoded["w"], np.arange(6.0).reshape(2, 3))
    assert type(decoded["n"][0]) is np.ndarray


def _parts(encoded: wire.Encoded) -> tuple[bytes, list[bytes]]:
    return encoded.pickle, encoded.buffers


def test_resource_refs_are_swapped_by_the_resolver() -> None:
    encoded = wire.encode(((wire.ResourceRef(7), [wire.ResourceRef(8)]), {}))
    plain = wire.decode(*_parts(encoded))
    assert plain == ((wire.ResourceRef(7), [wire.ResourceRef(8)]), {})
    swapped = wire.decode(*_parts(encoded), resolve_resource=lambda rid: f"value-{rid}")
    assert swapped == (("value-7", ["value-8"]), {})


def test_lambdas_and_local_classes_fall_back_to_cloudpickle() -> None:
    class Local:
        def __init__(self, x: int) -> None:
            self.x = x

    fn = wire.decode(*_parts(wire.encode(lambda v: v * 3)))
    assert fn(4) == 12
    assert wire.decode(*_parts(wire.encode(Local(5)))).x == 5


def test_unpicklable_values_name_their_type() -> None:
    with pytest.raises(pickle.PicklingError, match="lock"):
        wire.encode(threading.Lock())


def test_function_payloads_are_content_addressed() -> None:
    def add_one(x: int) -> int:
        return x + 1

    def add_two(x: int) -> int:
        return x + 2

    a = wire.function_payload(add_one)
    assert a.kind == "cloudpickle" and len(a.function_hash) == 32
    assert a.function_hash == wire.content_hash(a.payload)
    assert wire.function_payload(add_one).function_hash == a.function_hash
    assert wire.function_payload(add_two).function_hash != a.function_hash
    with pytest.raises(TypeError, match="expected a callable"):
        wire.function_payload(3)  # type: ignore[arg-type]


def test_rebuild_exception_prefers_the_pickled_exception() -> None:
    encoded = wire.encode(KeyError("k"))
    exc = wire.rebuild_exception({"exception": encoded.pickle, "exception_buffers": []})
    assert isinstance(exc, KeyError) and exc.args == ("k",)
    remote = wire.rebuild_exception(
        {
            "exception": None,
            "type_name": "Boom",
            "module": "user_mod",
            "message": "bad",
            "traceback": "Traceback...",
        }
    )
    assert isinstance(remote, errors.RemoteError)
    assert remote.type_name == "user_mod.Boom" and "Traceback..." in str(remote)
