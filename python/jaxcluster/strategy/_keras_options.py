"""Keras's optimizer arguments shared by every ps optimizer, and what each does here.

The gradient ones act on the caller, on the whole gradients of one ``apply_gradients``
call before any is sent, in Keras's order: ``loss_scale_factor`` first (the gradients are
divided by it), then one clip (``clipnorm`` per gradient, ``global_clipnorm`` over all the
call's gradients, or ``clipvalue`` elementwise; Keras allows one of the three).
``weight_decay`` travels in the optimizer's spec and is applied on the ps, before the
rule's step, from the variable as it was (``param -= lr * weight_decay * param``), as
Keras's optimizers decay. ``use_ema`` and ``gradient_accumulation_steps`` are refused with
a ``NotImplementedError`` when set: they need state on the ps that it does not keep yet,
and an optimizer that silently ignored them would train a different model.

Example (unscaled by 2, then clipped to norm 1)::

    >>> import numpy as np
    >>> options = KerasOptions(clipnorm=1.0, loss_scale_factor=2.0)
    >>> [g.tolist() for g in options.process([np.array([6.0, 8.0], np.float32)])]
    [[0.6000000238418579, 0.800000011920929]]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["KerasOptions"]


def _positive(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name}={value!r} is not valid; expected a positive number or None")
    return number


@dataclass(frozen=True)
class KerasOptions:
    """The arguments of Keras's ``Optimizer`` base class, checked as Keras checks them."""

    weight_decay: float | None = None
    clipnorm: float | None = None
    clipvalue: float | None = None
    global_clipnorm: float | None = None
    use_ema: bool = False
    ema_momentum: float = 0.99
    ema_overwrite_frequency: int | None = None
    loss_scale_factor: float | None = None
    gradient_accumulation_steps: int | None = None

    def __post_init__(self) -> None:
        clips = [
            name
            for name in ("clipnorm", "clipvalue", "global_clipnorm")
            if getattr(self, name) is not None
        ]
        if len(clips) > 1:
            raise ValueError(
                f"only one of clipnorm, clipvalue and global_clipnorm can be set; got {clips}"
            )
        for name in ("clipnorm", "clipvalue", "global_clipnorm", "loss_scale_factor"):
            object.__setattr__(self, name, _positive(name, getattr(self, name)))
        if self.use_ema:
            raise NotImplementedError(
                "use_ema=True is not supported by the ps optimizers yet (the ps keeps no "
                "moving average of its variables); keep an average on the caller, e.g. "
                "optax.ema over values read back, or leave use_ema=False"
            )
        if self.gradient_accumulation_steps is not None:
            raise NotImplementedError(
                "gradient_accumulation_steps is not supported by the ps optimizers yet; sum "
                "the gradients on the caller and call apply_gradients every N steps, or "
                "leave it None"
            )

    @property
    def decay(self) -> float:
        """The weight decay the ps applies (0: none); ``core.OptimizerSpec`` checks it, as
        the ps does."""
        return float(self.weight_decay or 0.0)

    def process(self, grads: list[np.ndarray]) -> list[np.ndarray]:
        """The gradients of one ``apply_gradients`` call, unscaled and clipped (the same
        arrays when nothing is set)."""
        if self.loss_scale_factor is not None:
            grads = [(g / self.loss_scale_factor).astype(g.dtype, copy=False) for g in grads]
        if self.clipnorm is not None:
            grads = [_scaled(g, self.clipnorm, _norm(g)) for g in grads]
        elif self.global_clipnorm is not None:
            total = math.sqrt(sum(_norm(g) ** 2 for g in grads))
            grads = [_scaled(g, self.global_clipnorm, total) for g in grads]
        elif self.clipvalue is not None:
            grads = [np.clip(g, -self.clipvalue, self.clipvalue) for g in grads]
        return grads


def _norm(g: np.ndarray) -> float:
    """The L2 norm of ``g``, summed in float64 (a float16 gradient's squares overflow)."""
    return math.sqrt(float(np.sum(np.square(g, dtype=np.float64))))


def _scaled(g: np.ndarray, clip: float, norm: float) -> np.ndarray:
    """``g * clip / max(norm, clip)``: unchanged at or below the clip."""
    if norm <= clip:
        return g
    return (g * (clip / norm)).astype(g.dtype, copy=False)
