"""Optimizers that run on the parameter servers: a caller sends gradients only, and each
ps applies the update to its variables atomically, with the optimizer's slots (``m``,
``v``, ...) and step count kept beside each variable (its ps, its shards).

Arguments and defaults are Keras's; the math is optax's reference implementation (where
the two differ, e.g. where Adam's ``epsilon`` goes, optax's is used and the class says so).
Keras's shared arguments (``weight_decay``, ``clipnorm``, ``clipvalue``,
``global_clipnorm``, ``loss_scale_factor``, ...) act as in Keras; ``use_ema`` and
``gradient_accumulation_steps`` are refused when set (``_keras_options``).
The step count is kept per variable shard on its ps (``<key>/<name>/iterations``) and
incremented under the variable's lock by each update, so schedules and Adam's bias
correction see exactly the updates that variable had, whatever the concurrency.

Example::

    with strategy.scope():
        w = strategy.Variable(np.zeros(3, np.float32), name="w")
    opt = Adam(learning_rate=ExponentialDecay(1e-3, decay_steps=100, decay_rate=0.9))
    opt.apply_gradients([(np.ones(3, np.float32), w)])      # TF's (grad, var) pairs
    opt.apply_gradients({"w": grad}, {"w": w})               # or two matching pytrees
    residual = opt.apply_gradients({"w": grad}, {"w": w}, compression="int8",
                                   error_feedback=True)     # int8, dropped part kept here
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxcluster import errors
from jaxcluster._native import core
from jaxcluster.strategy import _compression, _optimizer_state
from jaxcluster.strategy._keras_options import KerasOptions
from jaxcluster.strategy.variables import ParameterServerVariable

__all__ = [
    "SGD",
    "Adagrad",
    "Adam",
    "AdamW",
    "CosineDecay",
    "ExponentialDecay",
    "Optimizer",
    "PiecewiseConstantDecay",
    "RMSprop",
]


@dataclass(frozen=True)
class ExponentialDecay:
    """``initial_learning_rate * decay_rate ** (step / decay_steps)`` (floored exponent
    when ``staircase``), evaluated on the ps. Example: ``ExponentialDecay(0.1, 100, 0.5)``."""

    initial_learning_rate: float
    decay_steps: int
    decay_rate: float
    staircase: bool = False

    def _fields(self) -> dict[str, Any]:
        return {
            "schedule": "exponential_decay",
            "initial": float(self.initial_learning_rate),
            "decay_steps": int(self.decay_steps),
            "decay_rate": float(self.decay_rate),
            "staircase": bool(self.staircase),
        }


@dataclass(frozen=True)
class CosineDecay:
    """Cosine decay from ``initial_learning_rate`` to ``alpha`` times it over
    ``decay_steps``, evaluated on the ps. Example: ``CosineDecay(0.1, 1000, alpha=0.01)``."""

    initial_learning_rate: float
    decay_steps: int
    alpha: float = 0.0

    def _fields(self) -> dict[str, Any]:
        return {
            "schedule": "cosine_decay",
            "initial": float(self.initial_learning_rate),
            "decay_steps": int(self.decay_steps),
            "alpha": float(self.alpha),
        }


@dataclass(frozen=True)
class PiecewiseConstantDecay:
    """``values[i]`` while ``boundaries[i-1] < step <= boundaries[i]`` (Keras's rule),
    evaluated on the ps. Example: ``PiecewiseConstantDecay([100, 200], [0.1, 0.01, 0.001])``."""

    boundaries: Sequence[int]
    values: Sequence[float]

    def _fields(self) -> dict[str, Any]:
        return {
            "schedule": "piecewise_constant",
            "boundaries": [int(b) for b in self.boundaries],
            "values": [float(v) for v in self.values],
        }


Schedule = float | ExponentialDecay | CosineDecay | PiecewiseConstantDecay


def _schedule_fields(learning_rate: Schedule) -> dict[str, Any]:
    if isinstance(learning_rate, (ExponentialDecay, CosineDecay, PiecewiseConstantDecay)):
        return learning_rate._fields()
    if callable(learning_rate):
        raise TypeError(
            "a learning-rate schedule runs on the ps, so it must be data: a number, "
            "ExponentialDecay, CosineDecay or PiecewiseConstantDecay; got a callable"
        )
    return {"schedule": "constant", "initial": float(learning_rate)}


def _pairs(grads: Any, variables: Any) -> tuple[list[tuple[Any, ParameterServerVariable]], Any]:
    """The ``(grad, variable)`` pairs, and the variables' treedef for the pytree form (for
    returning a residual shaped like them; ``None`` for TF's list of pairs)."""
    treedef = None
    if variables is None:
        pairs = list(grads)
    else:
        import jax

        is_var = lambda x: isinstance(x, ParameterServerVariable)  # noqa: E731
        paired = jax.tree.map(lambda v, g: (g, v), variables, grads, is_leaf=is_var)
        is_pair = lambda x: isinstance(x, tuple) and len(x) == 2 and is_var(x[1])  # noqa: E731
        pairs = jax.tree.leaves(paired, is_leaf=is_pair)
        treedef = jax.tree.structure(variables, is_leaf=is_var)
    for _, variable in pairs:
        if not isinstance(variable, ParameterServerVariable):
            raise TypeError(
                f"apply_gradients updates ps variables; got a {type(variable).__name__}"
            )
    return pairs, treedef


class Optimizer:
    """Base of the ps optimizers: ``apply_gradients`` sends each gradient to the ps tasks
    holding its variable, one ``ApplyUpdate`` per shard. Picklable: a closure on a worker
    may capture it and call ``apply_gradients`` there.

    Slots and the step count of a variable are ps variables named
    ``<shard key>/<name>/<slot>``; ``name`` keeps two optimizers of one variable apart.
    """

    def __init__(self, spec: core.OptimizerSpec, name: str, options: KerasOptions) -> None:
        if not name or "/" in name:
            raise ValueError(f"an optimizer name must be non-empty without '/'; got {name!r}")
        self._spec = spec
        self._name = name
        self._options = options

    @property
    def name(self) -> str:
        """Names this optimizer's slots on the ps."""
        return self._name

    @property
    def spec(self) -> core.OptimizerSpec:
        """The rule, hyperparameters and schedule the ps applies."""
        return self._spec

    def build(self, variables: Any, strategy: Any) -> None:
        """Creates the slots and step counts of ``variables`` (a list or pytree) on their ps
        tasks, zeroed (Adagrad's accumulator at its initial value; those a re-attaching
        strategy adopted alive keep their values), and has ``strategy``
        save and restore them with its variables (``strategy.save``/``restore``). Optional:
        without it the ps creates them at the first update, and ``strategy.save`` finds
        them there; ``build`` makes them exist (and be saved) before any update.

        Example: ``opt.build([w], strategy); strategy.save(path)``
        """
        import jax

        is_var = lambda x: isinstance(x, ParameterServerVariable)  # noqa: E731
        for variable in jax.tree.leaves(variables, is_leaf=is_var):
            for slot, initial in self._spec.slots():
                made = _optimizer_state.slot_variable(variable, self._name, slot)
                full = np.full(variable.shape, initial, dtype=variable.storage_dtype)
                for shard in made.shards:
                    if variable._adopted(shard.key):
                        continue  # re-attached alive: keep its value
                    piece = made._piece(full, shard)
                    made._call(shard, "create_variable", shard.key, piece, replace=True)
                strategy._adopt(made)
            for shard in variable.shards:
                count = _optimizer_state.count_variable(variable, shard, self._name)
                if not variable._adopted(count.name):
                    count._call(shard, "create_variable", count.name, np.int64(0), replace=True)
                strategy._adopt(count)

    def apply_gradients(
        self,
        grads_and_vars: Any,
        variables: Any = None,
        *,
        compression: str | None = None,
        error_feedback: Any = None,
    ) -> Any:
        """Applies one update per variable on its ps tasks.

        Either TF's ``apply_gradients([(grad, var), ...])`` or JAX's two matching pytrees,
        ``apply_gradients(grads, variables)``. Each shard's update is atomic with its slots
        and step count; shards and variables are updated one after another.
        ``compression="bf16"`` sends gradients as bfloat16, ``"int8"`` as int8 with one
        scale per shard (``max|g| / 127``); the ps widens them back before the update.

        ``error_feedback`` (with a compression) keeps what compression dropped on the
        caller and adds it to the next gradient, so that the updates applied add up to the
        gradients given: pass ``True`` the first time, then the residual the previous call
        returned (state passed explicitly, as optax's). It returns the new residual, shaped
        like ``variables`` (a list in pair order for TF's form); without it, ``None``.
        Keep the residual where the caller lives: e.g. in a worker's per-worker state.

        Example::

            opt.apply_gradients(grads, params, compression="bf16")
            residual = opt.apply_gradients(grads, params, compression="int8", error_feedback=True)
            residual = opt.apply_gradients(grads2, params, compression="int8",
                                           error_feedback=residual)
        """
        _compression.check(compression, error_feedback)
        pairs, treedef = _pairs(grads_and_vars, variables)
        arrays = [variable._coerce(grad, "apply_gradients") for grad, variable in pairs]
        arrays = self._options.process(arrays)
        residuals = _compression.initial_residuals(error_feedback, arrays, treedef)
        left: list[np.ndarray] = []
        for index, (array, (_, variable)) in enumerate(zip(arrays, pairs, strict=True)):
            if residuals is not None:
                array = array + residuals[index]
                left.append(np.empty_like(array))
            for shard in variable.shards:
                piece = variable._piece(array, shard)
                sent, scale = _compression.compress(piece, compression)
                variable._call(
                    shard,
                    "apply_update",
                    shard.key,
                    self._name,
                    self._spec,
                    sent,
                    gradient_scale=scale,
                    # Sent from its own memory, not a copy: the call returns only once
                    # nothing reads it any more (as a blocking send does).
                    borrow=True,
                )
                if residuals is not None:
                    kept = variable._piece(left[index], shard)
                    kept[...] = piece - _compression.decompressed(sent, scale, piece.dtype)
        if residuals is None:
            return None
        if treedef is None:
            return left
        import jax

        return jax.tree.unflatten(treedef, left)

    def iterations(self, variable: ParameterServerVariable) -> int:
        """Updates this optimizer applied to ``variable`` (its first shard)."""
        shard = variable.shards[0]
        key = f"{shard.key}/{self._name}/{_optimizer_state.COUNT}"
        try:
            return int(variable._call(shard, "read", key))
        except errors.PSUnavailableError as exc:
            if isinstance(exc.__cause__, errors.NotFoundError):
                return 0  # never updated (nor built): no count on the ps yet
            raise

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self._kwargs))

    _kwargs: dict[str, Any]


def _rebuild(cls: type[Any], kwargs: dict[str, Any]) -> Optimizer:
    return cls(**kwargs)  # type: ignore[no-any-return]


def _arguments(given: dict[str, Any]) -> dict[str, Any]:
    """An ``__init__``'s arguments from its ``locals()``: what pickling rebuilds it from."""
    return {k: v for k, v in given.items() if k not in ("self", "__class__")}


_OPTION_NAMES = frozenset(KerasOptions.__dataclass_fields__)


def _options(arguments: dict[str, Any]) -> KerasOptions:
    """Keras's shared arguments among an optimizer's, checked."""
    return KerasOptions(**{k: v for k, v in arguments.items() if k in _OPTION_NAMES})


class SGD(Optimizer):
    """SGD with optional (Nesterov) momentum; optax's ``sgd`` (for a constant rate the same
    as Keras's velocity form). Slot ``momentum`` when ``momentum > 0``.

    Example: ``SGD(learning_rate=0.1, momentum=0.9).apply_gradients([(g, w)])``
    """

    def __init__(
        self,
        learning_rate: Schedule = 0.01,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float | None = None,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        global_clipnorm: float | None = None,
        use_ema: bool = False,
        ema_momentum: float = 0.99,
        ema_overwrite_frequency: int | None = None,
        loss_scale_factor: float | None = None,
        gradient_accumulation_steps: int | None = None,
        name: str = "SGD",
    ) -> None:
        self._kwargs = _arguments(locals())
        options = _options(self._kwargs)
        spec = core.OptimizerSpec(
            "sgd",
            momentum=momentum,
            nesterov=nesterov,
            weight_decay=options.decay,
            **_schedule_fields(learning_rate),
        )
        super().__init__(spec, name, options)


class Adam(Optimizer):
    """Adam as optax's ``adam``: ``epsilon`` is added to ``sqrt(v_hat)`` (the bias-corrected
    second moment), where Keras adds it to ``sqrt(v)``. Slots ``m`` and ``v``; with
    ``amsgrad`` also ``v_max``, the largest ``v_hat`` so far (optax's ``amsgrad``; Keras keeps
    the largest uncorrected ``v``). ``weight_decay`` makes it :class:`AdamW`.

    Example: ``Adam(learning_rate=1e-3).apply_gradients(grads, params)``
    """

    def __init__(
        self,
        learning_rate: Schedule = 0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        amsgrad: bool = False,
        weight_decay: float | None = None,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        global_clipnorm: float | None = None,
        use_ema: bool = False,
        ema_momentum: float = 0.99,
        ema_overwrite_frequency: int | None = None,
        loss_scale_factor: float | None = None,
        gradient_accumulation_steps: int | None = None,
        name: str = "Adam",
    ) -> None:
        self._kwargs = _arguments(locals())
        options = _options(self._kwargs)
        spec = core.OptimizerSpec(
            "adam",
            beta_1=beta_1,
            beta_2=beta_2,
            epsilon=epsilon,
            amsgrad=amsgrad,
            weight_decay=options.decay,
            **_schedule_fields(learning_rate),
        )
        super().__init__(spec, name, options)


class AdamW(Optimizer):
    """AdamW as optax's ``adamw``: Adam's direction plus ``weight_decay * param``, scaled by
    the rate (``epsilon`` placed as in :class:`Adam`). Slots ``m`` and ``v``.

    Example: ``AdamW(learning_rate=1e-3, weight_decay=0.004).apply_gradients([(g, w)])``
    """

    def __init__(
        self,
        learning_rate: Schedule = 0.001,
        weight_decay: float = 0.004,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        amsgrad: bool = False,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        global_clipnorm: float | None = None,
        use_ema: bool = False,
        ema_momentum: float = 0.99,
        ema_overwrite_frequency: int | None = None,
        loss_scale_factor: float | None = None,
        gradient_accumulation_steps: int | None = None,
        name: str = "AdamW",
    ) -> None:
        self._kwargs = _arguments(locals())
        options = _options(self._kwargs)
        spec = core.OptimizerSpec(
            "adamw",
            beta_1=beta_1,
            beta_2=beta_2,
            epsilon=epsilon,
            amsgrad=amsgrad,
            weight_decay=options.decay,
            **_schedule_fields(learning_rate),
        )
        super().__init__(spec, name, options)


class RMSprop(Optimizer):
    """RMSprop as optax's ``rmsprop`` (and Keras's): ``epsilon`` inside the root; centered
    subtracts the squared mean gradient; momentum traces the scaled update. Slots
    ``velocity``, ``average_gradient`` (centered), ``momentum`` (momentum > 0).

    Example: ``RMSprop(learning_rate=1e-3, centered=True).apply_gradients([(g, w)])``
    """

    def __init__(
        self,
        learning_rate: Schedule = 0.001,
        rho: float = 0.9,
        momentum: float = 0.0,
        epsilon: float = 1e-7,
        centered: bool = False,
        weight_decay: float | None = None,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        global_clipnorm: float | None = None,
        use_ema: bool = False,
        ema_momentum: float = 0.99,
        ema_overwrite_frequency: int | None = None,
        loss_scale_factor: float | None = None,
        gradient_accumulation_steps: int | None = None,
        name: str = "RMSprop",
    ) -> None:
        self._kwargs = _arguments(locals())
        options = _options(self._kwargs)
        spec = core.OptimizerSpec(
            "rmsprop",
            rho=rho,
            momentum=momentum,
            epsilon=epsilon,
            centered=centered,
            weight_decay=options.decay,
            **_schedule_fields(learning_rate),
        )
        super().__init__(spec, name, options)


class Adagrad(Optimizer):
    """Adagrad as optax's ``adagrad`` (and Keras's). Slot ``accumulator``, starting at
    ``initial_accumulator_value``.

    Example: ``Adagrad(learning_rate=0.01).apply_gradients([(g, w)])``
    """

    def __init__(
        self,
        learning_rate: Schedule = 0.001,
        initial_accumulator_value: float = 0.1,
        epsilon: float = 1e-7,
        weight_decay: float | None = None,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        global_clipnorm: float | None = None,
        use_ema: bool = False,
        ema_momentum: float = 0.99,
        ema_overwrite_frequency: int | None = None,
        loss_scale_factor: float | None = None,
        gradient_accumulation_steps: int | None = None,
        name: str = "Adagrad",
    ) -> None:
        self._kwargs = _arguments(locals())
        options = _options(self._kwargs)
        spec = core.OptimizerSpec(
            "adagrad",
            initial_accumulator_value=initial_accumulator_value,
            epsilon=epsilon,
            weight_decay=options.decay,
            **_schedule_fields(learning_rate),
        )
        super().__init__(spec, name, options)


def slot_keys(optimizer: Optimizer, variable: ParameterServerVariable) -> Iterable[str]:
    """The ps keys of ``variable``'s slots and step counts for ``optimizer``."""
    names = [s for s, _ in optimizer.spec.slots()] + [_optimizer_state.COUNT]
    for shard in variable.shards:
        for slot in names:
            yield f"{shard.key}/{optimizer.name}/{slot}"
