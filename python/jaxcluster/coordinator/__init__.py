"""Asynchronous closure coordination: TF's ``tf.distribute.experimental.coordinator``.

``ClosureQueue`` is TF's ``_CoordinatedClosureQueue`` implemented in Rust (see the class
documentation in ``jaxcluster/_core.pyi``).
"""

from __future__ import annotations

from jaxcluster._native import core as _core

ClosureQueue = _core.ClosureQueue

__all__ = ["ClosureQueue"]
