"""Type stubs for the native module ``jaxcluster._core`` (Rust, PyO3)."""

__version__: str

# --- Device names (rust/py/device.rs) -------------------------------------------------------

from collections.abc import Iterable, Mapping, Sized
from typing import final

@final
class DeviceSpec:
    """An immutable TF device spec: ``/job:<name>/replica:<int>/task:<int>/device:<TYPE>:<int|*>``.

    Same semantics as TF 2.x's ``tf.DeviceSpec``: every field is optional; ``replica``,
    ``task`` and ``device_index`` accept ints or int-like strings (negative values raise
    ``ValueError``); ``job`` and ``device_type`` become ``str``, with ``"cpu"``/``"gpu"``
    upper-cased. Two specs are equal when their ``to_string()`` is. Setting an attribute
    raises ``AttributeError``; use :meth:`replace` instead.

    Example::

        >>> spec = DeviceSpec.from_string("/task:1/job:worker/gpu:0")
        >>> spec.to_string()
        '/job:worker/task:1/device:GPU:0'
        >>> spec.replace(device_index=3).make_merged_spec(DeviceSpec(replica=0)).to_string()
        '/job:worker/replica:0/task:1/device:GPU:3'
    """

    def __new__(
        cls,
        job: object = None,
        replica: int | str | None = None,
        task: int | str | None = None,
        device_type: object = None,
        device_index: int | str | None = None,
    ) -> DeviceSpec: ...
    @staticmethod
    def from_string(spec: str | None) -> DeviceSpec:
        """Parses ``/job:<name>``, ``/replica:<int>``, ``/task:<int>``,
        ``/device:<TYPE>:<int|*>`` and legacy ``/cpu:0``, ``/gpu:*``, ``/tpu:1`` segments in
        any order (leading ``/`` optional; ``None`` and ``""`` give the empty spec).

        Raises ``ValueError`` naming the bad segment and the input for an unknown attribute,
        a non-integer or negative number, a malformed segment, or two device components.
        """

    def parse_from_string(self, spec: str | None) -> DeviceSpec:
        """Returns ``DeviceSpec.from_string(spec)``; ``self`` is not changed (TF 2.x)."""

    def to_string(self) -> str:
        """The present parts in the order job, replica, task, device (``*`` for no index)."""

    def make_merged_spec(self, dev: DeviceSpec) -> DeviceSpec:
        """A new spec taking each field from ``dev`` when it is set there, else from ``self``."""

    def replace(
        self,
        *,
        job: object = ...,
        replica: int | str | None = ...,
        task: int | str | None = ...,
        device_type: object = ...,
        device_index: int | str | None = ...,
    ) -> DeviceSpec:
        """A new spec with the given fields replaced (``None`` clears a field)."""

    @property
    def job(self) -> str | None: ...
    @property
    def replica(self) -> int | None: ...
    @property
    def task(self) -> int | None: ...
    @property
    def device_type(self) -> str | None: ...
    @property
    def device_index(self) -> int | None: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(
        self,
    ) -> tuple[
        type[DeviceSpec], tuple[str | None, int | None, int | None, str | None, int | None]
    ]: ...

def tpu_device_map(names: Iterable[str]) -> tuple[dict[int, list[int]], int]:
    """Groups TPU device names by host: ``({task: sorted core indices}, total_cores)``.

    ``/job:worker/replica:0/task:3/device:TPU:7`` is core 7 of host 3; CPU, GPU and
    TPU_SYSTEM devices are ignored. Raises ``ValueError`` for a name that does not parse, a
    TPU device without a task or core index, or a core listed twice.

    Example::

        >>> tpu_device_map(["/job:w/task:0/device:TPU:1", "/job:w/task:0/device:TPU:0"])
        ({0: [0, 1]}, 2)
    """

def verify_same_core_count(device_map: Mapping[int, Sized]) -> int:
    """The number of cores every host has (0 for an empty map).

    Raises ``RuntimeError`` naming the hosts and their counts when hosts disagree.

    Example::

        >>> verify_same_core_count({0: [0, 1], 1: [0, 1]})
        2
    """
