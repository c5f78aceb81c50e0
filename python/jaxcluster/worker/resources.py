"""Per-worker values (e.g. dataset iterators) that closures refer to by id."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FailedResource", "ResourceInputError", "ResourceRegistry"]


@dataclass(frozen=True)
class FailedResource:
    """Marks a resource whose creation raised; ``error`` is the captured failure."""

    error: BaseException


class ResourceInputError(Exception):
    """A closure argument refers to a resource that is missing or failed to build.

    ``original`` is the creation error (or a ``NotFoundError`` for a missing id) and
    ``resource_id`` the id the closure asked for.
    """

    def __init__(self, resource_id: int, original: BaseException) -> None:
        self.resource_id = resource_id
        self.original = original
        super().__init__(f"resource {resource_id}: {original}")


class ResourceRegistry:
    """Values by resource id, as created by ``CreateResource``.

    Example::

        registry = ResourceRegistry()
        registry.put(7, iter(range(3)))
        next(registry.resolve(7))  # 0
    """

    def __init__(self, worker_index: int = 0) -> None:
        self._values: dict[int, Any] = {}
        self._worker_index = worker_index

    def put(self, resource_id: int, value: Any) -> None:
        """Stores ``value``, replacing whatever ``resource_id`` held."""
        self._values[resource_id] = value

    def fail(self, resource_id: int, error: BaseException) -> None:
        """Records that creating ``resource_id`` raised ``error``."""
        self._values[resource_id] = FailedResource(error)

    def resolve(self, resource_id: int) -> Any:
        """The value of ``resource_id``; raises :class:`ResourceInputError` if unusable."""
        from jaxcluster.errors import NotFoundError

        try:
            value = self._values[resource_id]
        except KeyError:
            missing = NotFoundError(
                f"worker {self._worker_index} holds no resource {resource_id}: it was never "
                "created here, was released, or the worker restarted since"
            )
            raise ResourceInputError(resource_id, missing) from None
        if isinstance(value, FailedResource):
            raise ResourceInputError(resource_id, value.error)
        return value

    def release(self, resource_ids: list[int]) -> int:
        """Drops the given ids; returns how many were held."""
        missing = object()
        return sum(self._values.pop(rid, missing) is not missing for rid in resource_ids)

    def __len__(self) -> int:
        return len(self._values)
