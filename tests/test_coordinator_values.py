"""RemoteValue, error rebuilding, argument encoding and fetch structures, without workers.

The result cell here is a small stand-in with the binding's ``ResultCell`` interface, so
decoding and error paths are exercised one by one; the suites with real workers cover the
same classes end to end.
"""

from __future__ import annotations

import collections
import pickle
import threading
from typing import Any, NamedTuple

import numpy as np
import pytest

from jaxcluster import errors, wire
from jaxcluster._native import core
from jaxcluster.coordinator import PerWorkerValues, RemoteValue, RemoteValueStatus
from jaxcluster.coordinator._encoding import encode_args
from jaxcluster.coordinator._errors import build_exception
from jaxcluster.coordinator.structure import map_structure

ClosureError = core.ClosureError


class _Cell:
    """The binding's ResultCell interface, settled by the test."""

    def __init__(self) -> None:
        self._result: Any = None
        self._settled = threading.Event()
        self.result_calls = 0

    def settle(self, result: Any) -> None:
        self._result = result
        self._settled.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._settled.wait(timeout)

    @property
    def status(self) -> int:
        if self._result is None:
            return 0
        cancelled = isinstance(self._result, ClosureError) and self._result.kind == "cancelled"
        return 1 if cancelled else 2

    def result(self) -> Any:
        assert self._result is not None
        self.result_calls += 1
        return self._result


def _ok(value: Any) -> Any:
    encoded = wire.encode(value)
    return core.EncodedValue(encoded.pickle, encoded.buffers)


class _Unrebuildable(Exception):
    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a}/{b}")


def _user_error(
    exc: BaseException, pickled: bool = True, kind: str = "user", exception: bytes | None = None
) -> Any:
    data = wire.encode(exc).pickle if pickled else None
    return ClosureError(
        kind,
        type_name=type(exc).__qualname__,
        module=type(exc).__module__,
        message=str(exc),
        traceback='Traceback (most recent call last):\n  File "job.py", line 3\nboom\n',
        exception=exception or data,
        worker="127.0.0.1:5001",
    )


def test_a_value_is_decoded_once_and_kept() -> None:
    cell = _Cell()
    rv = RemoteValue(cell)
    assert rv.status is RemoteValueStatus.NOT_READY and not rv.done()
    with pytest.raises(errors.DeadlineExceededError, match=r"not ready within timeout=0\.01"):
        rv.fetch(timeout=0.01)
    cell.settle(_ok({"x": np.arange(3)}))
    assert rv.status is RemoteValueStatus.READY and rv.done()
    first = rv.fetch()
    np.testing.assert_array_equal(first["x"], [0, 1, 2])
    assert rv.get() is first
    assert cell.result_calls == 1


def test_an_error_is_ready_and_raised_from_every_fetch() -> None:
    cell = _Cell()
    cell.settle(_user_error(KeyError("missing")))
    rv = RemoteValue(cell)
    assert rv.status is RemoteValueStatus.READY
    for _ in range(2):
        with pytest.raises(KeyError, match="missing") as info:
            rv.fetch()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "127.0.0.1:5001" in notes and 'File "job.py", line 3' in notes


def test_a_cancelled_closure_is_aborted() -> None:
    cell = _Cell()
    cell.settle(
        ClosureError(
            "cancelled",
            code="CANCELLED",
            type_name="CancelledError",
            message="another closure failed first",
        )
    )
    rv = RemoteValue(cell)
    assert rv.status is RemoteValueStatus.ABORTED
    with pytest.raises(errors.CancelledError, match="another closure failed first"):
        rv.fetch()


@pytest.mark.parametrize("timeout", [-1, "1", True])
def test_a_bad_fetch_timeout_is_rejected(timeout: Any) -> None:
    with pytest.raises(ValueError, match="expected None or a number"):
        RemoteValue(_Cell()).fetch(timeout=timeout)


def test_an_exception_that_cannot_be_rebuilt_becomes_remote_error() -> None:
    exc = build_exception(_user_error(_Unrebuildable(1, 2), pickled=False))
    assert isinstance(exc, errors.RemoteError)
    assert exc.type_name == f"{__name__}._Unrebuildable"
    assert "1/2" in str(exc) and "127.0.0.1:5001" in str(exc)
    assert 'File "job.py"' in exc.remote_traceback
    garbage = _user_error(ValueError("x"), exception=b"not a pickle")
    assert isinstance(build_exception(garbage), errors.RemoteError)


def test_input_errors_wrap_the_original() -> None:
    result = _user_error(StopIteration("dataset_fn broke"), kind="input")
    exc = build_exception(result)
    assert isinstance(exc, errors.ClosureInputError)
    assert isinstance(exc.original_exception, StopIteration)
    assert "dataset_fn broke" in str(exc)


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        ("DEADLINE_EXCEEDED", errors.DeadlineExceededError),
        ("UNAVAILABLE", errors.UnavailableError),
        ("INVALID_ARGUMENT", errors.InvalidArgumentError),
        ("NOT_FOUND", errors.NotFoundError),
        ("UNAUTHENTICATED", errors.UnauthenticatedError),
        ("RESOURCE_EXHAUSTED", errors.ResourceExhaustedError),
        ("DATA_LOSS", errors.InternalError),
    ],
)
def test_infrastructure_errors_map_to_their_classes(code: str, cls: type) -> None:
    result = ClosureError(
        "infrastructure",
        code=code,
        type_name=cls.__name__,
        module="jaxcluster.errors",
        message="it broke",
        worker="h:7",
    )
    exc = build_exception(result)
    assert type(exc) is cls
    assert "it broke" in str(exc) and "h:7" in str(exc)


def test_malformed_closure_errors_are_rejected() -> None:
    with pytest.raises(ValueError, match='kind "weird" is not known'):
        ClosureError("weird", type_name="T", message="msg")
    with pytest.raises(ValueError, match="not a gRPC status code name"):
        ClosureError("infrastructure", code="infra:NOPE", type_name="T", message="msg")
    with pytest.raises(KeyError, match='no field "nope"'):
        _user_error(ValueError("x"))["nope"]


class _Resource:
    def __init__(self, resource_id: int) -> None:
        self.resource_id = resource_id


def test_per_worker_values_travel_as_placeholders_the_worker_resolves() -> None:
    first, second = PerWorkerValues([1, 2]), PerWorkerValues([3, 4])
    handles = {id(first): _Resource(11), id(second): _Resource(12)}
    args = ({"a": first, "nested": [first, second]}, (lambda: None))  # forces cloudpickle
    encoded, resources = encode_args(args, {"k": second}, lambda v: handles[id(v)])
    assert [r.resource_id for r in resources] == [11, 12]
    elements = {11: "iterator-11", 12: "iterator-12"}
    (a, _fn), kwargs = wire.decode(
        encoded.pickle, encoded.buffers, resolve_resource=elements.__getitem__
    )
    assert a == {"a": "iterator-11", "nested": ["iterator-11", "iterator-12"]}
    assert kwargs == {"k": "iterator-12"}


def test_placeholders_also_work_through_plain_pickle() -> None:
    values = PerWorkerValues([0, 1])
    encoded, resources = encode_args((values, np.arange(3)), {}, lambda v: _Resource(5))
    assert [r.resource_id for r in resources] == [5]
    (element, array), _ = wire.decode(
        encoded.pickle, encoded.buffers, resolve_resource={5: "mine"}.__getitem__
    )
    assert element == "mine"
    np.testing.assert_array_equal(array, [0, 1, 2])


def test_a_remote_value_anywhere_in_the_arguments_is_a_value_error() -> None:
    rv = RemoteValue(_Cell())
    with pytest.raises(ValueError, match="RemoteValue was passed as an argument"):
        encode_args(([{"deep": (rv,)}],), {}, lambda v: None)
    with pytest.raises(ValueError, match="RemoteValue was passed as an argument"):
        encode_args((), {"x": rv}, lambda v: None)


def test_neither_can_be_pickled_on_its_own() -> None:
    with pytest.raises(TypeError, match="fetch\\(\\) it and pass the value"):
        pickle.dumps(RemoteValue(_Cell()))
    with pytest.raises(TypeError, match="only be sent as an argument of"):
        pickle.dumps(PerWorkerValues([1]))


class _Pair(NamedTuple):
    left: Any
    right: Any


def test_map_structure_keeps_containers_and_passes_other_leaves() -> None:
    counts = collections.defaultdict(list, {"a": 1})
    value = {
        "pair": _Pair(1, [2, None]),
        "ordered": collections.OrderedDict([("z", 3), ("y", (4,))]),
        "counts": counts,
        "text": "leaf",
    }
    out = map_structure(lambda x: x * 10 if isinstance(x, int) else x, value)
    assert out["pair"] == _Pair(10, [20, None]) and type(out["pair"]) is _Pair
    assert type(out["ordered"]) is collections.OrderedDict
    assert list(out["ordered"].items()) == [("z", 30), ("y", (40,))]
    assert type(out["counts"]) is collections.defaultdict and out["counts"]["new"] == []
    assert out["text"] == "leaf" and counts["a"] == 1
    assert map_structure(lambda x: x, None) is None
