"""Optional dependencies: the Kubernetes and Google clients are extras, imported on first use.

``pip install jaxcluster`` brings what every user needs; ``jaxcluster[k8s]`` adds the official
Kubernetes client, ``jaxcluster[gcp]`` google-auth and requests, ``jaxcluster[all]`` both. A
feature whose extra is missing raises :class:`jaxcluster.errors.MissingExtraError` (an
``ImportError``) naming the exact ``pip install`` line, at the first call that needs it.

Example::

    from jaxcluster._extras import require

    kubernetes = require("k8s", "kubernetes", "KubernetesClusterResolver")
"""

from __future__ import annotations

import importlib
from types import ModuleType

from jaxcluster.errors import MissingExtraError

__all__ = ["EXTRAS", "require"]

#: extra -> (what it brings, in words; the distributions it installs)
EXTRAS: dict[str, tuple[str, str]] = {
    "k8s": ("the official Kubernetes client", "kubernetes"),
    "gcp": ("the Google client libraries", "google-auth, requests"),
}


def require(extra: str, module: str, feature: str) -> ModuleType:
    """Imports ``module``, which the extra ``extra`` installs; ``MissingExtraError`` naming
    ``feature`` and the ``pip install`` line when it cannot be imported."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        what, packages = EXTRAS[extra]
        raise MissingExtraError(
            f"{feature} needs {what} ({packages}), missing here "
            f"(import {module!r} failed: {exc}). Install it with: "
            f"pip install 'jaxcluster[{extra}]'",
            extra=extra,
            name=module,
        ) from exc
