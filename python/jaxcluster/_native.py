"""The one import point of the native module ``jaxcluster._core``.

Everything in the package that needs Rust imports it from here, so a missing or stale
build fails once, with an error that says how to fix it.
"""

from __future__ import annotations

try:
    from jaxcluster import _core
except ImportError as exc:  # pragma: no cover - exercised only on broken installs
    raise ImportError(
        "jaxcluster's native module (jaxcluster._core) could not be imported: "
        f"{exc}. Install a built wheel (`pip install jaxcluster` or `pip install .` from a "
        "checkout, which runs maturin) rather than putting the source tree on sys.path."
    ) from exc

_EXPECTED_VERSION = "0.1.0"
if _core.__version__ != _EXPECTED_VERSION:  # pragma: no cover
    raise ImportError(
        f"jaxcluster._core is version {_core.__version__} but the Python package expects "
        f"{_EXPECTED_VERSION}; rebuild the extension (`pip install .` or `maturin develop`)."
    )

core = _core
__version__: str = _core.__version__


def _build_exception(error: _core.ClosureError) -> BaseException:
    """The exception a closure's failure is raised as, for the dispatcher's pending error
    (``jaxcluster.coordinator._errors.build_exception``, imported when first needed: the
    coordinator package imports this module)."""
    from jaxcluster.coordinator._errors import build_exception

    return build_exception(error)


# Registered once, here, because every use of `_core` imports this module first.
_core.set_exception_builder(_build_exception)

__all__ = ["__version__", "core"]
