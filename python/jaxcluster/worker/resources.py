"""Per-worker values (e.g. dataset iterators, device state) that closures refer to by id.

Values are keyed by (session, id): every coordinator (and strategy) is a session with a
random id, sent with each call, and its resource ids are its own. One session never sees
or overwrites another's value (SPEC §12). A value may also carry a *name* (named state):
a later session that creates a resource of the same name adopts the live value instead
of building it again; the session that held it loses it, and its closures that still
use it fail with a ``NotFoundError`` that says which session took it.

Example::

    registry = ResourceRegistry()
    registry.put("s1", 7, iter(range(3)))
    next(registry.resolve("s1", 7))  # 0; resolve("s2", 7) raises ResourceInputError
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Any

__all__ = ["FailedResource", "ResourceInputError", "ResourceRegistry", "SessionHeld", "nbytes"]

Key = tuple[str, int]


@dataclass(frozen=True)
class FailedResource:
    """Marks a resource whose creation raised; ``error`` is the captured failure."""

    error: BaseException


@dataclass(frozen=True)
class SessionHeld:
    """What one session holds on this worker: values, bytes of their arrays, any named."""

    values: int
    bytes: int
    named: bool


class ResourceInputError(Exception):
    """A closure argument refers to a resource that is missing or failed to build.

    ``original`` is the creation error (or a ``NotFoundError`` for a missing id) and
    ``resource_id`` the id the closure asked for.
    """

    def __init__(self, resource_id: int, original: BaseException) -> None:
        self.resource_id = resource_id
        self.original = original
        super().__init__(f"resource {resource_id}: {original}")


def nbytes(value: Any) -> int:
    """Bytes of the array leaves of ``value`` (a pytree; 0 for what holds no arrays)."""
    seen = 0
    stack = [value]
    while stack:
        item = stack.pop()
        inner = getattr(item, "value", None) if type(item).__name__ == "DeviceState" else None
        if inner is not None:
            stack.append(inner)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        else:
            size = getattr(item, "nbytes", None)
            if isinstance(size, int):
                seen += size
    return seen


def _session_label(session: str) -> str:
    return f"session {session}" if session else "the anonymous session"


class ResourceRegistry:
    """Values by (session, resource id), as created by ``CreateResource``.

    Example::

        registry = ResourceRegistry()
        registry.put("s1", 7, iter(range(3)))
        next(registry.resolve("s1", 7))  # 0
    """

    def __init__(self, worker_index: int = 0) -> None:
        self._values: dict[Key, Any] = {}
        self._bytes: dict[Key, int] = {}
        # Named state: name -> the key holding it, and back.
        self._names: dict[str, Key] = {}
        self._name_of: dict[Key, str] = {}
        # Keys whose named value another session adopted -> that session.
        self._adopted: dict[Key, str] = {}
        # Kept closure results (dataflow): what ReadValue and KeptRef arguments may read.
        self._kept: set[Key] = set()
        self._worker_index = worker_index

    def put(
        self, session: str, resource_id: int, value: Any, name: str = "", *, kept: bool = False
    ) -> None:
        """Stores ``value``, replacing whatever ``resource_id`` of ``session`` held;
        ``kept``: a kept closure result (readable by :meth:`kept`)."""
        key = (session, resource_id)
        self._forget(key)
        self._values[key] = value
        self._bytes[key] = nbytes(value)
        if kept:
            self._kept.add(key)
        if name:
            self._drop_name(name)
            self._names[name] = key
            self._name_of[key] = name

    def fail(self, session: str, resource_id: int, error: BaseException) -> None:
        """Records that creating ``resource_id`` of ``session`` raised ``error``."""
        key = (session, resource_id)
        self._forget(key)
        self._values[key] = FailedResource(error)

    def adopt(self, session: str, resource_id: int, name: str) -> str | None:
        """Moves the live value named ``name`` to ``resource_id`` of ``session``; returns
        the session it came from, or ``None`` when no live value has that name."""
        old = self._names.get(name)
        if old is None or isinstance(self._values.get(old), FailedResource):
            return None
        value, size = self._values.pop(old), self._bytes.pop(old, 0)
        del self._name_of[old]
        del self._names[name]
        if old[0] != session:
            self._adopted[old] = session
        key = (session, resource_id)
        self._forget(key)
        self._values[key] = value
        self._bytes[key] = size
        self._names[name] = key
        self._name_of[key] = name
        return old[0]

    def kept(self, session: str, value_id: int) -> tuple[bool, Any]:
        """``(True, value)`` for a kept result ``value_id`` of ``session`` held here, else
        ``(False, None)``. Safe from the reader thread: single dict lookups."""
        key = (session, value_id)
        if key not in self._kept:
            return False, None
        try:
            return True, self._values[key]
        except KeyError:  # released between the two lookups
            return False, None

    def resolve(self, session: str, resource_id: int) -> Any:
        """The value of ``resource_id`` of ``session``; raises :class:`ResourceInputError`
        if unusable."""
        from jaxcluster.errors import NotFoundError

        key = (session, resource_id)
        try:
            value = self._values[key]
        except KeyError:
            taker = self._adopted.get(key)
            if taker is not None:
                why = (
                    f"its named state was adopted by {_session_label(taker)} (a newer "
                    "coordinator asked for the same name); this session no longer owns it"
                )
            else:
                why = (
                    "it was never created here by this session, was released, or the "
                    "worker restarted since"
                )
            missing = NotFoundError(
                f"worker {self._worker_index} holds no resource {resource_id} for "
                f"{_session_label(session)}: {why}"
            )
            raise ResourceInputError(resource_id, missing) from None
        if isinstance(value, FailedResource):
            raise ResourceInputError(resource_id, value.error)
        return value

    def release(self, session: str, resource_ids: list[int]) -> int:
        """Drops the given ids of ``session``; returns how many were held."""
        held = 0
        for rid in resource_ids:
            key = (session, rid)
            held += key in self._values
            self._forget(key)
            self._adopted.pop(key, None)
        return held

    def release_session(self, session: str) -> int:
        """Drops every value of ``session`` (named ones too); returns how many."""
        keys = [key for key in self._values if key[0] == session]
        for key in keys:
            self._forget(key)
        for key in [key for key in self._adopted if key[0] == session]:
            del self._adopted[key]
        return len(keys)

    def awaiting_preemption_save(self, live: Container[str] | None = None) -> int:
        """How many values (device state created with ``on_preemption="save"``) no
        preemption save has read yet: a preempted worker stays up for those reads. With
        ``live`` (the sessions the server still tracks), only those of a live session (or
        the anonymous one, never released) count: a session ended, or vanished past its
        ``--state-ttl``, sends no save."""
        return sum(
            1
            for (session, _), value in self._values.items()
            if getattr(value, "awaits_preemption_save", False)
            and (live is None or not session or session in live)
        )

    def held(self, session: str) -> SessionHeld:
        """What ``session`` holds now."""
        keys = [key for key in self._values if key[0] == session]
        return SessionHeld(
            values=len(keys),
            bytes=sum(self._bytes.get(key, 0) for key in keys),
            named=any(key in self._name_of for key in keys),
        )

    def _forget(self, key: Key) -> None:
        self._kept.discard(key)
        self._values.pop(key, None)
        self._bytes.pop(key, None)
        name = self._name_of.pop(key, None)
        if name is not None and self._names.get(name) == key:
            del self._names[name]

    def _drop_name(self, name: str) -> None:
        """A new value takes ``name``: the one that held it keeps its value, unnamed."""
        old = self._names.pop(name, None)
        if old is not None:
            self._name_of.pop(old, None)

    def __len__(self) -> int:
        return len(self._values)
