"""Value encoding: out-of-band buffers, JAX arrays, resource refs, cloudpickle fallback."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

from jaxcluster import errors, wire
from jaxcluster._native import core
from jaxcluster.coordinator import functions
from jaxcluster.coordinator._errors import rebuild_exception

ClosureError = core.ClosureError


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


def _parts(encoded: wire.EncodedValue) -> tuple[bytes, list[bytes]]:
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

    a = functions.pickle_function(add_one)
    assert a.kind == "cloudpickle" and len(a.function_hash) == 32
    assert a.function_hash == wire.content_hash(a.payload)
    assert functions.pickle_function(add_one).function_hash == a.function_hash
    assert functions.pickle_function(add_two).function_hash != a.function_hash
    with pytest.raises(TypeError, match="expected a callable"):
        functions.pickle_function(3)  # type: ignore[arg-type]


def test_rebuild_exception_prefers_the_pickled_exception() -> None:
    encoded = wire.encode(KeyError("k"))
    exc = rebuild_exception(
        ClosureError("user", type_name="KeyError", message="'k'", exception=encoded.pickle)
    )
    assert isinstance(exc, KeyError) and exc.args == ("k",)
    remote = rebuild_exception(
        ClosureError(
            "user", type_name="Boom", module="user_mod", message="bad", traceback="Traceback..."
        )
    )
    assert isinstance(remote, errors.RemoteError)
    assert remote.type_name == "user_mod.Boom" and "Traceback..." in str(remote)


@pytest.mark.parametrize(
    "array",
    [
        np.arange(64, dtype=np.float32),
        np.array(3.5),  # 0-d
        np.zeros((0, 3), dtype=np.int16),  # empty
        np.arange(12, dtype=">i4").reshape(3, 4),  # big-endian
        np.array([True, False]),
        np.arange(6, dtype=np.complex64).reshape(2, 3),
        np.asfortranarray(np.arange(6.0).reshape(2, 3)),  # not C-contiguous: numpy's way
        np.arange(10.0)[::2],  # a strided view: numpy's way
        np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]),  # structured: numpy's way
        np.array(["x", "yz"]),  # strings: numpy's way
    ],
    ids=lambda a: f"{a.dtype.str}{a.shape}",
)
def test_arrays_round_trip_exactly_through_the_fast_encoder(array: np.ndarray) -> None:
    encoded = wire.fast_encode(((array,), {}))
    assert encoded == wire.encode(((array,), {}))  # encode takes the fast path
    (decoded,), _ = wire.decode(*_parts(encoded))
    assert type(decoded) is np.ndarray
    assert decoded.dtype == array.dtype and decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, array)
    # As numpy's own out-of-band pickles: a read-only array over the received bytes.
    buffers: list[pickle.PickleBuffer] = []
    own = pickle.dumps(array, protocol=5, buffer_callback=buffers.append)
    numpy_way = pickle.loads(own, buffers=[b.raw().tobytes() for b in buffers])
    assert decoded.flags.writeable == numpy_way.flags.writeable


def test_contiguous_arrays_are_pickled_without_a_dtype_object() -> None:
    encoded = wire.fast_encode(np.arange(64, dtype=np.float32))
    assert b"rebuild_array" in encoded.pickle and b"<f4" in encoded.pickle
    assert b"numpy" not in encoded.pickle
    assert encoded.buffers == [np.arange(64, dtype=np.float32).tobytes()]


def test_the_fast_encoder_leaves_resource_refs_and_lambdas_to_the_full_one() -> None:
    with pytest.raises(Exception, match="ResourceRef"):
        wire.fast_encode([wire.ResourceRef(3)])
    with pytest.raises((pickle.PicklingError, AttributeError)):
        wire.fast_encode(lambda: 1)
    # encode still handles both.
    refs = wire.decode(*_parts(wire.encode([wire.ResourceRef(3)])), resolve_resource=str)
    assert refs == ["3"]
    assert wire.decode(*_parts(wire.encode(lambda: 1)))() == 1


class _EncodesWhilePickled:
    """An object whose pickling encodes another value (re-entering the encoder)."""

    def __reduce__(self) -> tuple[object, tuple[bytes]]:
        return bytes, (wire.encode({"inner": [1, 2]}).pickle,)


def test_the_encoder_can_be_re_entered_from_a_reduce() -> None:
    encoded = wire.encode([np.arange(4), _EncodesWhilePickled(), np.arange(5)])
    first, inner, last = wire.decode(*_parts(encoded))
    np.testing.assert_array_equal(first, np.arange(4))
    np.testing.assert_array_equal(last, np.arange(5))
    assert wire.decode(inner) == {"inner": [1, 2]}
