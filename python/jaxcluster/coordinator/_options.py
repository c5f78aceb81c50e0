"""The coordinator's options: where its workers and token come from, and the checks and
defaults of its bounds (one place, so the constructor reads as what it builds).

Example::

    _seconds_bound("heartbeat_timeout", None)   # inf: no bound
    _worker_addresses(SimpleClusterResolver(ClusterSpec({"worker": ["h:1", "h:2"]})))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from jaxcluster._auth import auth_token_from_env
from jaxcluster._tls import ca_from_env, load_ca

_ERROR_POLICIES = ("cancel_all", "per_closure")


def _resolver_and_token(source: Any) -> tuple[Any, str | None]:
    """``(resolver, token)`` from a cluster resolver or a strategy-like object."""
    if callable(getattr(source, "cluster_spec", None)):
        return source, None
    resolver = getattr(source, "cluster_resolver", None)
    if resolver is None:
        resolver = getattr(source, "_cluster_resolver", None)
    if resolver is None or not callable(getattr(resolver, "cluster_spec", None)):
        raise TypeError(
            f"ClusterCoordinator needs a cluster resolver (or a strategy with a "
            f"cluster_resolver), got {type(source).__qualname__}: {source!r}"
        )
    token = getattr(source, "auth_token", None)
    return resolver, token if isinstance(token, str) and token else None


def _worker_addresses(resolver: Any) -> list[str]:
    spec = resolver.cluster_spec()
    jobs = list(spec.jobs)
    if "worker" not in jobs:
        raise ValueError(
            f"the cluster has no 'worker' job (jobs: {', '.join(jobs) or 'none'}); the "
            "coordinator runs closures on the tasks of the 'worker' job"
        )
    tasks = list(spec.job_tasks("worker"))
    if not tasks:
        raise ValueError("the cluster's 'worker' job has no tasks; expected at least one")
    holes = [i for i, address in enumerate(tasks) if address is None]
    if holes:
        raise ValueError(
            f"the 'worker' job is sparse: no address for task(s) {holes}; the coordinator "
            "needs workers 0..n-1"
        )
    return [str(address) for address in tasks]


class _FromEnvironment:
    """The default of a bound that an environment variable can set."""

    def __init__(self, variable: str, default: str) -> None:
        self.variable = variable
        self.default = default

    def __repr__(self) -> str:
        return f"${self.variable} or {self.default}"


#: Defaults of the bounds of issue 16, each read from its variable when not given.
_HEARTBEAT_DEFAULT = _FromEnvironment("JAXCLUSTER_HEARTBEAT_TIMEOUT_SEC", "5.0")
_RETRIES_DEFAULT = _FromEnvironment("JAXCLUSTER_MAX_CLOSURE_RETRIES", "3")
_CONNECT_DEFAULT = _FromEnvironment("JAXCLUSTER_CONNECT_TIMEOUT_SEC", "60.0")


def _seconds_bound(name: str, value: Any) -> float | None:
    """What the dispatcher takes for a bound in seconds: ``None`` (not given: the
    environment or the default), ``inf`` (``None`` given: no bound) or the seconds."""
    if isinstance(value, _FromEnvironment):
        return None
    if value is None:
        return float("inf")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}={value!r}; expected a positive number of seconds, or None")
    return float(value)


def _retries_bound(value: Any) -> int | None:
    """``max_closure_retries`` for the dispatcher: ``None`` from the environment, -1 for
    no bound."""
    if isinstance(value, _FromEnvironment):
        return None
    if value is None:
        return -1
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"max_closure_retries={value!r}; expected a count of at least 0, or None for no "
            "bound (TF's behaviour)"
        )
    return value


def _check_seconds(name: str, value: Any) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
    ):
        raise ValueError(f"{name}={value!r}; expected None or a positive number of seconds")


def _check_metrics_port(port: Any) -> None:
    if port is not None and (
        isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535
    ):
        raise ValueError(
            f"metrics_port={port!r}; expected None (no metrics endpoint) or a TCP port "
            "0-65535 (0 picks a free one; see metrics_address)"
        )


def _check_options(max_queue_size: int, error_policy: str, closure_timeout: Any) -> None:
    if isinstance(max_queue_size, bool) or not isinstance(max_queue_size, int):
        raise TypeError(f"max_queue_size={max_queue_size!r}; expected an int")
    if error_policy not in _ERROR_POLICIES:
        raise ValueError(
            f"error_policy={error_policy!r}; expected one of {', '.join(_ERROR_POLICIES)}"
        )
    _check_seconds("closure_timeout", closure_timeout)


class _Versions(NamedTuple):
    """This process's versions, as the dispatcher compares its workers' with them."""

    python: str
    jax: str
    jaxcluster: str


def _own_versions() -> _Versions:
    """This process's Python (``major.minor.micro``), JAX and jaxcluster versions, which
    each worker link checks its worker's against (``""`` for a JAX that cannot be imported:
    the check then only warns)."""
    import sys

    from jaxcluster import __version__

    try:
        import jax

        jax_version = str(jax.__version__)
    except ImportError:
        jax_version = ""
    python = sys.version_info
    return _Versions(f"{python.major}.{python.minor}.{python.micro}", jax_version, __version__)


def checked_arguments(args: Any, kwargs: Any) -> tuple[tuple[Any, ...] | list[Any], Any]:
    """``schedule``'s ``args``/``kwargs`` with ``None`` as empty; a clear error for others
    than a tuple or list and a mapping."""
    args = () if args is None else args
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(args, (tuple, list)):
        raise TypeError(
            f"schedule(args=...) must be a tuple or list, got {type(args).__qualname__}"
        )
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"schedule(kwargs=...) must be a mapping, got {type(kwargs).__qualname__}")
    return args, kwargs


def checked_options(
    *,
    max_queue_size: int,
    error_policy: str,
    closure_timeout: Any,
    max_closure_retries: Any,
    heartbeat_timeout: Any,
    connect_timeout: Any,
    recovery_timeout: Any,
    refresh_interval: Any,
    metrics_port: Any,
) -> tuple[int | None, float | None, float | None]:
    """``ClusterCoordinator``'s options checked, each bad one a clear error; returns the
    retry bound and the heartbeat and connect timeouts with their environment defaults
    applied."""
    _check_options(max_queue_size, error_policy, closure_timeout)
    retries = _retries_bound(max_closure_retries)
    heartbeat = _seconds_bound("heartbeat_timeout", heartbeat_timeout)
    connect = _seconds_bound("connect_timeout", connect_timeout)
    _check_seconds("recovery_timeout", recovery_timeout)
    _check_seconds("refresh_interval", refresh_interval)
    _check_metrics_port(metrics_port)
    return retries, heartbeat, connect


def credentials(source: Any, auth_token: str | None, tls_ca: Any) -> tuple[Any, str | None, Any]:
    """The resolver behind ``source`` (a resolver or a strategy), the token (given, the
    strategy's, or ``JAXCLUSTER_AUTH_TOKEN``) and the CA (given, the strategy's, or
    ``JAXCLUSTER_TLS_CA``)."""
    resolver, strategy_token = _resolver_and_token(source)
    token = auth_token or strategy_token or auth_token_from_env()
    # A strategy's CA serves its workers too (it has the same cluster's certificates),
    # whether the strategy came positionally (SPEC: ClusterCoordinator(strategy)) or as
    # strategy=.
    strategy_ca = getattr(source, "tls_ca", None) if source is not resolver else None
    ca = load_ca(tls_ca) or (strategy_ca if isinstance(strategy_ca, bytes) else None)
    return resolver, token, ca or ca_from_env()


def make_dispatcher(
    addresses: list[str],
    slice_sizes: list[int],
    token: str | None,
    ca: Any,
    session_id: str,
    *,
    max_queue_size: int,
    error_policy: str,
    closure_timeout: float | None,
    retries: int | None,
    heartbeat: float | None,
    connect: float | None,
    recovery_timeout: float | None,
) -> Any:
    """The Rust dispatcher for the checked options (:func:`checked_options`)."""
    from jaxcluster._native import core

    versions = _own_versions()
    return core.Dispatcher(
        addresses,
        auth_token=token,
        tls_ca=ca,
        max_queue_size=max_queue_size,
        error_policy=error_policy,  # type: ignore[arg-type]  # checked by checked_options
        closure_timeout=None if closure_timeout is None else float(closure_timeout),
        max_closure_retries=retries,
        heartbeat_timeout=heartbeat,
        connect_timeout=connect,
        recovery_timeout=None if recovery_timeout is None else float(recovery_timeout),
        # Each link checks its worker is rank 0 of a slice this size (1: no slice).
        slice_sizes=slice_sizes,
        # Each link checks its worker's versions against these (see versions.rs).
        python_version=versions.python,
        jax_version=versions.jax,
        jaxcluster_version=versions.jaxcluster,
        # Every call carries it: what this coordinator creates on a worker is its own.
        session_id=session_id,
    )
