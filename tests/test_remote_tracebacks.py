"""A remote traceback names the user's own file and line and quotes the source line,
however the function reached the worker: by value (lambdas, local functions, code whose
file the worker does not have), by reference, or as a ``jax.jit`` function whose export
failed and which the worker traced itself.

These run against whichever cloudpickle is installed; CI runs them with the newest and with
the lowest version ``pyproject.toml`` allows.
"""

from __future__ import annotations

import linecache
import pickle
import sys
import traceback
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from jaxcluster import _source_code
from jaxcluster.coordinator import ClusterCoordinator
from support.closures import local_cluster

HERE = __file__


class StepFailed(Exception):
    """Importable on the workers too (tests/ is on their path)."""


def fails_by_reference(step: int) -> None:
    raise StepFailed(f"reference step {step}")  # the by-reference source line


@pytest.fixture(scope="module")
def coordinator() -> Iterator[ClusterCoordinator]:
    with local_cluster(2) as cluster, cluster.coordinator(error_policy="per_closure") as c:
        yield c


def remote_traceback(exc: BaseException) -> str:
    notes = "\n".join(getattr(exc, "__notes__", []))
    return notes + getattr(exc, "remote_traceback", "")


def line_of(text: str, path: str = HERE) -> int:
    """The 1-based number of the first line of ``path`` containing ``text`` (the code line:
    each marker's code comes before the assertions that name it)."""
    matches = [i for i, line in enumerate(linecache.getlines(path), 1) if text in line]
    assert matches, text
    return matches[0]


def test_a_local_function_names_this_file_line_and_source(coordinator: ClusterCoordinator) -> None:
    def local_failure(n: int) -> None:
        raise StepFailed(f"local step {n}")  # the local source line

    rv = coordinator.schedule(local_failure, args=(3,))
    with pytest.raises(StepFailed, match="local step 3") as info:
        rv.fetch()
    text = remote_traceback(info.value)
    line = line_of("# the local source line")
    assert f'File "{HERE}", line {line}, in local_failure' in text
    assert 'raise StepFailed(f"local step {n}")  # the local source line' in text
    assert "<dynamic-code>" not in text


def test_a_lambda_names_its_line(coordinator: ClusterCoordinator) -> None:
    rv = coordinator.schedule(lambda: 1 / 0)  # the lambda line
    with pytest.raises(ZeroDivisionError) as info:
        rv.fetch()
    text = remote_traceback(info.value)
    assert f'File "{HERE}", line {line_of("# the lambda line")}, in <lambda>' in text
    assert "coordinator.schedule(lambda: 1 / 0)" in text


def test_a_function_the_worker_has_no_file_for_still_shows_its_source(
    coordinator: ClusterCoordinator,
) -> None:
    # As a notebook cell or a script on the coordinator's host only: the code's file does
    # not exist where it runs, its lines are known here (linecache, as IPython does it).
    filename = f"/nonexistent-{uuid.uuid4().hex}/train_cell.py"
    source = (
        "import math\n"
        "\n"
        "def train_step(loss):\n"
        "    scale = 2.0\n"
        "    if math.isnan(loss):\n"
        "        raise FloatingPointError(f'loss is {loss} at scale {scale}')\n"
        "    return loss * scale\n"
    )
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), namespace)
    assert coordinator.schedule(namespace["train_step"], args=(1.5,)).fetch() == 3.0
    rv = coordinator.schedule(namespace["train_step"], args=(float("nan"),))
    with pytest.raises(FloatingPointError) as info:
        rv.fetch()
    text = remote_traceback(info.value)
    assert f'File "{filename}", line 6, in train_step' in text
    assert "raise FloatingPointError(f'loss is {loss} at scale {scale}')" in text


def test_a_function_sent_by_reference_names_its_module_file(
    coordinator: ClusterCoordinator,
) -> None:
    rv = coordinator.schedule(fails_by_reference, args=(9,))
    with pytest.raises(StepFailed, match="reference step 9") as info:
        rv.fetch()
    text = remote_traceback(info.value)
    line = line_of("# the by-reference source line")
    assert f'File "{HERE}", line {line}, in fails_by_reference' in text
    assert 'raise StepFailed(f"reference step {step}")' in text


def test_join_raises_with_the_same_traceback() -> None:
    def joined_failure() -> None:
        raise StepFailed("seen by join")  # the joined source line

    with local_cluster(1) as cluster, cluster.coordinator() as coordinator:
        coordinator.schedule(joined_failure)
        with pytest.raises(StepFailed, match="seen by join") as info:
            coordinator.join()
    text = remote_traceback(info.value)
    assert f'File "{HERE}", line {line_of("# the joined source line")}' in text
    assert 'raise StepFailed("seen by join")' in text


def test_a_jit_function_the_coordinator_could_not_export_names_the_users_line(
    coordinator: ClusterCoordinator,
) -> None:
    import jax
    import jax.numpy as jnp

    @jax.jit
    def needs_small_batches(x: Any) -> Any:
        if x.shape[0] > 4:  # a trace-time check: export fails, the worker traces it
            raise ValueError(f"batch of {x.shape[0]} is too large")  # the jit source line
        return jnp.sum(x)

    assert coordinator.schedule(needs_small_batches, args=(np.ones(2, np.float32),)).fetch() == 2
    rv = coordinator.schedule(needs_small_batches, args=(np.ones(8, np.float32),))
    with pytest.raises(ValueError, match="batch of 8 is too large") as info:
        rv.fetch()
    text = remote_traceback(info.value)
    assert f'File "{HERE}", line {line_of("# the jit source line")}, in needs_small_batches' in text
    assert 'raise ValueError(f"batch of {x.shape[0]} is too large")' in text


def test_an_exported_function_that_fails_on_the_worker_names_its_definition() -> None:
    import jax
    import jax.numpy as jnp

    @jax.jit
    def log_of(x: Any) -> Any:  # the exported definition
        return jnp.log(x)

    # With JAX_DEBUG_NANS a NaN raises on the worker, inside the exported computation,
    # whose traceback has none of the user's frames.
    with (
        local_cluster(1, JAX_DEBUG_NANS="true") as cluster,
        cluster.coordinator(error_policy="per_closure") as coordinator,
    ):
        assert coordinator.metrics()["functions_registered"] == 0
        ok = coordinator.schedule(log_of, args=(np.ones(2, np.float32),)).fetch()
        np.testing.assert_array_equal(ok, [0.0, 0.0])
        rv = coordinator.schedule(log_of, args=(-np.ones(2, np.float32),))
        with pytest.raises(FloatingPointError) as info:
            rv.fetch()
    text = remote_traceback(info.value)
    line = line_of("# the exported definition")
    assert "as a jax.export of:" in text
    assert f'File "{HERE}", line {line}, in log_of' in text
    assert "def log_of(x: Any) -> Any:  # the exported definition" in text


# --- the pickling itself, in one process ------------------------------------------------


def test_code_round_trips_with_its_file_name_and_lines() -> None:
    filename = f"/nonexistent-{uuid.uuid4().hex}/helpers.py"
    source = "def helper(a):\n    def inner(b):\n        return b / 0\n    return inner(a)\n"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), namespace)
    payload = _source_code.dumps(namespace["helper"])
    del linecache.cache[filename]  # as on a worker that never saw the file
    helper = pickle.loads(payload)
    assert helper.__code__.co_filename == filename
    with pytest.raises(ZeroDivisionError) as info:
        helper(1)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert (filename, 3, "inner", "return b / 0") in [
        (f.filename, f.lineno, f.name, f.line) for f in frames
    ]


def test_code_from_another_python_version_is_refused_by_name() -> None:
    def f() -> int:
        return 1

    reducer, args = _source_code.reduce_code(f.__code__)
    other = (sys.version_info[0], sys.version_info[1] + 1)
    with pytest.raises(pickle.UnpicklingError, match=r"pickled by value under Python 3\.\d+"):
        reducer(args[0], other, *args[2:])
