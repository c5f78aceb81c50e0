"""Compressed gradients for ``Optimizer.apply_gradients``, and their error feedback.

Error feedback keeps on the caller what compression dropped, to add it to the next update.
One owner for the wire formats of a compressed gradient (bfloat16; int8 with one scale per
shard, ``max|g| / 127``) and for what the ps makes of them again (``decompressed``, the
same widening as ``rust/ps/optim/compress.rs``), so a residual is exactly the part of the
update the ps did not apply.

Example::

    sent, scale = compress(piece, "int8")
    residual = piece - decompressed(sent, scale, piece.dtype)
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["COMPRESSIONS", "check", "compress", "decompressed", "initial_residuals"]

#: The values of ``apply_gradients(compression=...)``.
COMPRESSIONS = (None, "bf16", "int8")


def check(compression: str | None, error_feedback: Any) -> None:
    """``ValueError`` for an unknown compression, or error feedback without one."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression is None, 'bf16' or 'int8'; got {compression!r}")
    if error_feedback is not None and error_feedback is not False and compression is None:
        raise ValueError(
            "error_feedback keeps what compression drops; pass compression='bf16' or "
            "'int8' with it (without compression nothing is dropped)"
        )


def compress(piece: np.ndarray, compression: str | None) -> tuple[np.ndarray, float]:
    """``piece`` as sent: unchanged, bfloat16, or int8 with its scale (0.0 when unused)."""
    if compression == "bf16":
        import ml_dtypes

        return piece.astype(ml_dtypes.bfloat16), 0.0
    if compression == "int8":
        return _int8(piece)
    return piece, 0.0


#: Elements quantized at a time: the float64 temporaries of a block stay in cache. Whole-
#: array temporaries of a 64 MiB gradient were 128 MiB each, fresh memory the kernel faulted
#: in on every call; the caller spent more time on them than the int8 bytes saved on the wire.
_BLOCK = 1 << 16


def _int8(piece: np.ndarray) -> tuple[np.ndarray, float]:
    """``piece`` as int8 steps of ``max|piece| / 127`` (1.0 if that is 0 or not finite):
    ``clip(rint(float64(x) / scale), -127, 127)``, computed a block at a time (the same
    float64 operations, so the same bytes, as one whole-array expression)."""
    flat = np.ravel(piece)
    tops = [np.max(np.abs(flat[i : i + _BLOCK])) for i in range(0, flat.size, _BLOCK)]
    top = float(np.max(tops)) if tops else 0.0
    scale = top / 127.0 if top > 0 and np.isfinite(top) else 1.0
    out = np.empty(flat.size, np.int8)
    work = np.empty(min(flat.size, _BLOCK), np.float64)
    for i in range(0, flat.size, _BLOCK):
        block = flat[i : i + _BLOCK]
        buf = work[: block.size]
        np.copyto(buf, block)
        np.divide(buf, scale, out=buf)
        np.rint(buf, out=buf)
        np.clip(buf, -127, 127, out=buf)
        np.copyto(out[i : i + _BLOCK], buf, casting="unsafe")
    return out.reshape(piece.shape), scale


def decompressed(sent: np.ndarray, scale: float, dtype: Any) -> np.ndarray:
    """What the ps applies for ``sent``: widened to ``dtype`` (int8 times ``scale`` in
    float64 first, as the ps computes it)."""
    if sent.dtype == np.int8:
        return (sent.astype(np.float64) * scale).astype(dtype)
    return sent.astype(dtype)


def initial_residuals(
    error_feedback: Any, arrays: list[np.ndarray], treedef: Any
) -> list[np.ndarray] | None:
    """The residual to add to each of ``arrays`` (the gradients, in pair order): ``None``
    without error feedback, zeros for ``True``, else the leaves of the residual a previous
    ``apply_gradients`` returned (a list in pair order, or a pytree shaped as the
    variables when ``treedef`` is given), checked against ``arrays``."""
    if error_feedback is None or error_feedback is False:
        return None
    if error_feedback is True:
        return [np.zeros_like(a) for a in arrays]
    if treedef is None:
        leaves = list(error_feedback)
    else:
        import jax

        leaves = jax.tree.leaves(error_feedback)
    if len(leaves) != len(arrays):
        raise ValueError(
            f"error_feedback holds {len(leaves)} residuals for {len(arrays)} gradients; pass "
            "True the first time, then the residual the previous apply_gradients returned"
        )
    out = []
    for leaf, array in zip(leaves, arrays, strict=True):
        residual = np.asarray(leaf, dtype=array.dtype)
        if residual.shape != array.shape:
            raise ValueError(
                f"an error_feedback residual of shape {residual.shape} for a gradient of shape "
                f"{array.shape}; pass the residual the previous apply_gradients returned"
            )
        out.append(residual)
    return out
