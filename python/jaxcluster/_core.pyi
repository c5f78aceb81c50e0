"""Type stubs for the native module ``jaxcluster._core`` (Rust, PyO3)."""

__version__: str
