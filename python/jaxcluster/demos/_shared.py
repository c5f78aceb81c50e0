"""What the demos share: the small MLP, its synthetic regression data, and a plain-text
progress bar. Every demo trains this model, so their losses compare.

Example::

    x, y = make_shard(-1, seed=0)           # the evaluation set
    mse_loss(init_params(0), x, y)          # the starting loss
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, TextIO

import numpy as np

__all__ = ["Progress", "init_params", "make_shard", "mse_loss", "shard_batches"]

_FEATURES, _HIDDEN, _SHARD = 8, 32, 2048


def make_shard(index: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Worker ``index``'s training shard (``index=-1``: the evaluation set)."""
    rng = np.random.default_rng([seed, index + 1])
    truth = np.random.default_rng(seed).normal(size=(_FEATURES,)).astype(np.float32)
    x = rng.normal(size=(_SHARD, _FEATURES)).astype(np.float32)
    y = np.sin(x @ truth)[:, None] + 0.05 * rng.normal(size=(_SHARD, 1)).astype(np.float32)
    return x, y.astype(np.float32)


def shard_batches(seed: int, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Runs on a worker: endless random batches from that worker's shard."""
    from jaxcluster.coordinator import get_current_worker_index

    index = get_current_worker_index()
    x, y = make_shard(index, seed)
    rng = np.random.default_rng([seed, index, 7])
    while True:
        rows = rng.integers(0, len(x), size=batch_size)
        yield x[rows], y[rows]


def init_params(seed: int) -> dict[str, np.ndarray]:
    """The MLP's starting parameters, the same for every run with ``seed``."""
    rng = np.random.default_rng(seed + 1)
    return {
        "w1": (rng.normal(size=(_FEATURES, _HIDDEN)) / np.sqrt(_FEATURES)).astype(np.float32),
        "b1": np.zeros(_HIDDEN, np.float32),
        "w2": (rng.normal(size=(_HIDDEN, 1)) / np.sqrt(_HIDDEN)).astype(np.float32),
        "b2": np.zeros(1, np.float32),
    }


def mse_loss(params: dict[str, Any], x: Any, y: Any) -> Any:
    """The MLP's mean squared error on ``(x, y)`` (a ``jax`` value; ``jax.jit`` traces it)."""
    import jax.numpy as jnp

    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)


class Progress:
    """A plain-text progress bar on one terminal line (or one line per update if piped)."""

    def __init__(self, total: int, out: TextIO) -> None:
        self._total, self._out = total, out
        self._last = 0.0
        self._tty = hasattr(out, "isatty") and out.isatty()

    def show(self, done: int, loss: float, note: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < (0.1 if self._tty else 2.0):
            return
        self._last = now
        width = 30
        filled = int(width * done / self._total)
        bar = "#" * filled + "." * (width - filled)
        line = f"[{bar}] {done:>6}/{self._total} loss {loss:8.4f}  {note}"
        self._out.write(f"\r{line:<100}" if self._tty else f"{line}\n")
        self._out.flush()

    def close(self) -> None:
        if self._tty:
            self._out.write("\n")
            self._out.flush()
