"""``ParameterServerStrategy``: variables on the ``ps`` tasks of a cluster, for closures the
``worker`` tasks run.

Example (TF's documentation example, with jaxcluster, on a local cluster; the workers and
ps tasks take only calls that carry their token, which ``auth_token`` gives, or
``JAXCLUSTER_AUTH_TOKEN``)::

    from jaxcluster import ClusterCoordinator, LocalCluster, ParameterServerStrategy

    with LocalCluster(num_workers=2, num_ps=1) as cluster:
        strategy = ParameterServerStrategy(cluster.resolver, auth_token=cluster.auth_token)
        with strategy.scope():
            v1 = strategy.Variable(0.0)
            v2 = strategy.Variable(1.0)
        coordinator = ClusterCoordinator(strategy)

        def step():
            v1.assign_add(0.1)
            v2.assign_sub(0.2)
            return v1.read_value() / v2.read_value()

        coordinator.schedule(step).fetch()     # 0.125
        coordinator.shutdown()
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from jaxcluster._auth import auth_token_from_env
from jaxcluster._tls import ca_from_env, load_ca
from jaxcluster.strategy import _checkpointing, _optimizer_state, _ps_wait, _sessions
from jaxcluster.strategy.checkpoint import read_checkpoint
from jaxcluster.strategy.variables import ParameterServerVariable, Shard

__all__ = ["ParameterServerStrategy"]

_log = logging.getLogger("jaxcluster.strategy")

_SUPPORTED = frozenset(
    {
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        # kept as uint8 0/1 on the ps tasks; assign only, as in TF
        "bool",
    }
)


def _job_addresses(spec: Any, job: str) -> dict[int, str]:
    return {int(i): spec.task_address(job, i) for i in spec.task_indices(job)}


def _pytree_error(value: Any) -> TypeError:
    return TypeError(
        f"strategy.Variable holds one array, and got a {type(value).__name__} of several "
        f"({_preview(value)}); for a pytree of parameters make one Variable per leaf, e.g. "
        "`params = jax.tree.map(strategy.Variable, params)` inside strategy.scope()"
    )


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _initial_array(initial_value: Any, dtype: Any) -> np.ndarray:
    value = initial_value() if callable(initial_value) else initial_value
    if isinstance(value, Mapping):
        raise _pytree_error(value)
    if dtype is not None:
        return np.array(value, dtype=np.dtype(dtype))
    inferred = np.array(value)
    # Python numbers (and lists of them) get TF's and JAX's defaults, float32 and int32;
    # arrays keep their own dtype.
    if not isinstance(value, (np.ndarray, np.generic)) and not hasattr(value, "dtype"):
        if inferred.dtype == np.float64:
            inferred = inferred.astype(np.float32)
        elif inferred.dtype == np.int64:
            inferred = inferred.astype(np.int32)
    return inferred


def _row_splits(rows: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` consecutive row ranges, the first ``rows % shards`` one row longer."""
    base, extra = divmod(rows, shards)
    splits, start = [], 0
    for i in range(shards):
        stop = start + base + (1 if i < extra else 0)
        splits.append((start, stop))
        start = stop
    return splits


class ParameterServerStrategy:
    """Places variables on a cluster's ``ps`` tasks for closures run by its ``worker`` tasks.

    ``cluster_resolver`` must describe a ``worker`` and a ``ps`` job. Variables are created
    with :meth:`Variable` inside :meth:`scope`, placed on ps tasks round-robin in creation
    order; with ``variable_partitioner`` (see :mod:`jaxcluster.strategy.partitioners`) a
    large variable is split along axis 0 into shards placed the same way. The token for the
    ps tasks is ``auth_token`` or ``JAXCLUSTER_AUTH_TOKEN``; workers use their own. With
    ``tls_ca`` (a CA path or PEM, else ``JAXCLUSTER_TLS_CA``) ps tasks are reached over TLS;
    workers read the CA from their own ``JAXCLUSTER_TLS_CA`` (it is never pickled).
    ``ClusterCoordinator(strategy)`` takes the resolver and token from here.

    Each strategy is a session (:attr:`session_id`): its variables are its own on the ps
    tasks, even when another program (a sidecar evaluator, a second job) names its
    variables the same. They are released at once by :meth:`shutdown` or when this process
    exits normally, and ``--state-ttl`` seconds after a process killed outright. With
    ``reattach=True``, :meth:`Variable` adopts a live variable of the same name, dtype and
    shape instead of creating it: a restarted trainer continues from the values (and
    optimizer slots) its killed predecessor left on the ps.
    """

    def __init__(
        self,
        cluster_resolver: Any,
        variable_partitioner: Callable[..., Sequence[int]] | None = None,
        *,
        auth_token: str | None = None,
        tls_ca: str | bytes | os.PathLike[str] | None = None,
        reattach: bool = False,
    ) -> None:
        spec = cluster_resolver.cluster_spec()
        jobs = list(spec.jobs)
        for job in ("worker", "ps"):
            if job not in jobs or not spec.task_indices(job):
                raise ValueError(
                    f"ParameterServerStrategy needs a cluster with a non-empty {job!r} job; "
                    f"the resolver's cluster has jobs {jobs} "
                    f"({', '.join(f'{j}: {spec.num_tasks(j)} tasks' for j in jobs) or 'none'})"
                )
        if variable_partitioner is not None and not callable(variable_partitioner):
            raise TypeError(
                f"variable_partitioner must be callable (shape, dtype) -> shards per axis, "
                f"e.g. FixedShardsPartitioner(2); got {variable_partitioner!r}"
            )
        self._resolver = cluster_resolver
        self._partitioner = variable_partitioner
        self._ps = _job_addresses(spec, "ps")
        self._token = auth_token if auth_token is not None else auth_token_from_env()
        self._tls_ca = load_ca(tls_ca) or ca_from_env()
        self._lock = threading.Lock()
        self._variables: dict[str, ParameterServerVariable] = {}
        self._placements = 0
        self._scope_depth = 0
        self._reattach = bool(reattach)
        self._session = _sessions.new_session_id()
        _sessions.register(self._session, self._addresses(), self._token, self._tls_ca)

    @property
    def cluster_resolver(self) -> Any:
        """The resolver this strategy was made with."""
        return self._resolver

    @property
    def auth_token(self) -> str | None:
        """The token for ps tasks (and, through ``ClusterCoordinator``, workers)."""
        return self._token

    @property
    def tls_ca(self) -> bytes | None:
        """PEM of the CA ps tasks (and, through ``ClusterCoordinator``, workers) are
        verified against; ``None`` for plaintext."""
        return self._tls_ca

    @property
    def session_id(self) -> str:
        """This strategy's session on the ps tasks: 32 random hex digits, sent with every
        ps call its variables, optimizers and checkpoints make (on workers too)."""
        return self._session

    @property
    def reattach(self) -> bool:
        """Whether :meth:`Variable` adopts live ps variables of the same name."""
        return self._reattach

    def _addresses(self) -> list[str]:
        return [self._ps[i] for i in sorted(self._ps)]

    def shutdown(self) -> None:
        """Ends this strategy's session: its variables (with their optimizer slots and
        step counts) are released on every ps task at once. Idempotent; also done when the
        process exits normally. ``ClusterCoordinator.shutdown()`` does not do it, so
        ``strategy.save()`` still works after the coordinator is gone. A ps task that
        cannot be reached is logged and keeps the variables until its ``--state-ttl``.

        Example::

            strategy.save("/ckpt/final")
            strategy.shutdown()
        """
        if _sessions.unregister(self._session):
            released = _sessions.end(self._session, self._addresses(), self._token, self._tls_ca)
            _log.info("session %s ended: %d ps variables released", self._session, released)

    @property
    def num_ps(self) -> int:
        """How many ps tasks the cluster has."""
        return len(self._ps)

    @property
    def variables(self) -> list[ParameterServerVariable]:
        """Every variable made by this strategy, in creation order."""
        with self._lock:
            return list(self._variables.values())

    def wait_for_ps(self, timeout: float | None = None) -> None:
        """Returns once every ps task answers; call it before creating variables when the
        ps tasks may still be starting (a new Kubernetes or Slurm job).

        Raises ``DeadlineExceededError`` naming the ps tasks that did not answer within
        ``timeout`` seconds (``None``: wait until they do). A ps task that answers but
        rejects this strategy's token or CA raises at once (e.g. ``UnauthenticatedError``).
        The wait is interruptible (Ctrl-C).

        Example::

            strategy = ParameterServerStrategy(resolve())
            strategy.wait_for_ps(timeout=300)
            with strategy.scope():
                weights = strategy.Variable(np.zeros(4, np.float32))
        """
        _ps_wait.wait_for_ps(self._ps, self._token, self._tls_ca, timeout)

    @contextlib.contextmanager
    def scope(self) -> Iterator[ParameterServerStrategy]:
        """The context in which :meth:`Variable` may be called."""
        with self._lock:
            self._scope_depth += 1
        try:
            yield self
        finally:
            with self._lock:
                self._scope_depth -= 1

    def _unique_name(self, name: str | None) -> str:
        base = "Variable" if name is None else str(name)
        if not base:
            raise ValueError("a variable name is empty; expected a non-empty string or None")
        candidate, n = base, 0
        while candidate in self._variables:
            n += 1
            candidate = f"{base}_{n}"
        return candidate

    def _num_shards(self, array: np.ndarray) -> int:
        if self._partitioner is None or array.ndim == 0 or array.shape[0] <= 1:
            return 1
        parts = list(self._partitioner(array.shape, array.dtype))
        if len(parts) != array.ndim or any(int(p) != 1 for p in parts[1:]) or int(parts[0]) < 1:
            raise ValueError(
                f"variable_partitioner returned {parts} for shape {array.shape}; expected one "
                f"positive count per axis with only axis 0 above 1, e.g. [2] + [1] * "
                f"{array.ndim - 1}"
            )
        return min(int(parts[0]), array.shape[0])

    def Variable(
        self, initial_value: Any, name: str | None = None, dtype: Any = None
    ) -> ParameterServerVariable:
        """Creates a variable on the ps tasks, initialised to ``initial_value`` (an array,
        a number, or a callable returning one). Must be called inside :meth:`scope`.

        ``dtype`` converts the value; without it arrays keep their dtype and Python
        numbers become float32 or int32. A name already used by this strategy gets a
        suffix (``v``, ``v_1``...), as in TF. Another strategy's variable of the same name
        (another program's session) is never read or replaced.

        With ``reattach=True`` on the strategy, a live ps variable of this name, dtype and
        shape held by another session of the same token (typically a killed predecessor's,
        kept for the ps's ``--state-ttl``) is adopted with its value and its optimizer
        slots and step counts; ``initial_value`` is then unused and
        :attr:`~ParameterServerVariable.reattached` is ``True``. One of another dtype or
        shape raises ``FailedPreconditionError`` naming both.

        Example::

            strategy = ParameterServerStrategy(resolver, reattach=True)
            with strategy.scope():
                w = strategy.Variable(np.zeros(4, np.float32), name="w")
            w.reattached            # True when a previous run's "w" was still on the ps
        """
        if self._scope_depth <= 0:
            raise RuntimeError(
                "strategy.Variable() was called outside `with strategy.scope():`; create "
                "parameter-server variables inside the strategy's scope"
            )
        try:
            array = _initial_array(initial_value, dtype)
        except ValueError as exc:  # numpy: "inhomogeneous shape", a list of unequal arrays
            raise _pytree_error(initial_value) from exc
        if array.dtype == object:
            raise _pytree_error(initial_value)
        if array.dtype.name not in _SUPPORTED:
            raise TypeError(
                f"a ps variable cannot hold dtype {array.dtype.name}; expected one of "
                f"{', '.join(sorted(_SUPPORTED))}"
            )
        with self._lock:
            unique = self._unique_name(name)
            count = self._num_shards(array)
            rows = _row_splits(array.shape[0], count) if array.ndim else [(0, 0)]
            shards = []
            for i, (start, stop) in enumerate(rows):
                task = sorted(self._ps)[(self._placements + i) % len(self._ps)]
                key = unique if count == 1 else f"{unique}/part_{i}"
                shards.append(Shard(task, self._ps[task], key, start, stop))
            self._placements += count
            variable = ParameterServerVariable(
                unique,
                array.dtype,
                array.shape,
                shards,
                auth_token=self._token,
                tls_ca=self._tls_ca,
                session=self._session,
            )
            # Reserve the name before the RPCs so concurrent creators never share it.
            self._variables[unique] = variable
        try:
            adopted = _sessions.reattach(variable) if self._reattach else frozenset()
            for shard in shards:
                if shard.key in adopted:
                    continue
                piece = array if count == 1 else array[shard.start : shard.stop]
                piece = piece.astype(variable.storage_dtype, copy=False)
                variable._call(shard, "create_variable", shard.key, piece, replace=True)
        except BaseException:
            with self._lock:
                self._variables.pop(unique, None)
            raise
        return variable

    def _adopt(self, variable: ParameterServerVariable) -> None:
        """Saves and restores ``variable`` (made elsewhere, e.g. an optimizer's slot) with
        this strategy's own; a name already held is kept."""
        with self._lock:
            self._variables.setdefault(variable.name, variable)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes every variable to the file ``path``, replacing an earlier checkpoint
        atomically (temporary file, fsync, rename, directory fsync).

        The optimizers' slots and step counts of these variables are saved with them,
        whether ``optimizer.build`` made them or the ps did at a first update (each ps
        task is asked which it holds), and are restored with them from then on.
        """
        for found in _optimizer_state.on_ps(self.variables):
            self._adopt(found)
        _checkpointing.save(self.variables, path)

    def restore(self, path: str | os.PathLike[str]) -> None:
        """Sets every variable from the checkpoint at ``path``, matched by name.

        Raises ``ValueError`` (changing nothing) if the file is corrupt, or if its names,
        dtypes or shapes do not match this strategy's variables. A ps task that restarted
        and lost its variables gets them back.

        Optimizer slots and step counts in the checkpoint are recreated on the ps beside
        their variables (partitioned as they are) even if no optimizer was built in this
        strategy: a restored Adam resumes with its moments and step counts. Step counts
        are per shard, so they restore only into the partitioning they were saved from
        (a different one raises ``ValueError`` naming them).
        """
        arrays = read_checkpoint(path)
        current = self.variables
        made = _optimizer_state.from_checkpoint(current, arrays)
        _checkpointing.restore([*current, *made], path, arrays)
        for variable in made:
            self._adopt(variable)

    def __repr__(self) -> str:
        return (
            f"ParameterServerStrategy(ps={[self._ps[i] for i in sorted(self._ps)]}, "
            f"variables={len(self._variables)})"
        )
