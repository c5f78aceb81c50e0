"""``DeviceSpec``: TF v2 device specifications, parsed and printed by the Rust core.

Example::

    >>> from jaxcluster import DeviceSpec
    >>> spec = DeviceSpec.from_string("/job:worker/task:3/device:TPU:7")
    >>> spec.replace(task=0).to_string()
    '/job:worker/task:0/device:TPU:7'
"""

from __future__ import annotations

from jaxcluster._native import core

DeviceSpec = core.DeviceSpec

__all__ = ["DeviceSpec"]
