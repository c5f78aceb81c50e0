"""A TPU topology as TF hands it to ``TPUClusterResolver.set_tpu_topology``: a serialized
``tensorflow.tpu.TopologyProto``, read here without protobuf.

The message is small and stable (five fields, unchanged since TF 2.4): the mesh shape, the
number of tasks and of TPU devices per task, the flattened device coordinates, and a nested
``TPUHardwareFeature`` (embedding feature, embedding devices per chip). Reading it takes a
varint and length-prefix walker of ~50 lines; depending on ``protobuf`` (and TF's generated
code, which jaxcluster does not ship) for that would be a heavier install than the feature.

Example::

    topology = parse_topology(serialized)   # bytes from TF's TPU system initialisation
    topology.mesh_shape, topology.tpu_hardware_feature.embedding_feature
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["TPUHardwareFeature", "TPUTopology", "parse_topology"]

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class EmbeddingFeature(enum.IntEnum):
    """Which embedding-lookup accelerator a TPU has (TF's ``TPUHardwareFeature`` enum)."""

    UNSUPPORTED = 0
    V1 = 1
    V2 = 2


_Embedding = EmbeddingFeature  # for annotations inside TPUHardwareFeature, which nests the name


@dataclass(frozen=True)
class TPUHardwareFeature:
    """TF's ``TPUHardwareFeature``: ``embedding_feature`` and
    ``num_embedding_devices_per_chip``."""

    EmbeddingFeature = EmbeddingFeature

    embedding_feature: _Embedding | int = _Embedding.UNSUPPORTED
    num_embedding_devices_per_chip: int = 0


@dataclass(frozen=True)
class TPUTopology:
    """TF's ``TopologyProto``, field for field."""

    mesh_shape: tuple[int, ...] = ()
    num_tasks: int = 0
    num_tpu_devices_per_task: int = 0
    device_coordinates: tuple[int, ...] = ()
    tpu_hardware_feature: TPUHardwareFeature = field(default_factory=TPUHardwareFeature)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def varint(self) -> int:
        value, shift = 0, 0
        while True:
            if self.pos >= len(self.data):
                raise ValueError("truncated varint")
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ValueError("varint longer than 10 bytes")

    def take(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise ValueError(f"field of {size} bytes runs past the end")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def fields(self) -> Iterator[tuple[int, int, int | bytes]]:
        """``(field number, wire type, value)`` of every field, unknown ones included."""
        while self.pos < len(self.data):
            key = self.varint()
            number, wire = key >> 3, key & 7
            if wire == _VARINT:
                yield number, wire, self.varint()
            elif wire == _LENGTH:
                yield number, wire, self.take(self.varint())
            elif wire == _FIXED64:
                yield number, wire, self.take(8)
            elif wire == _FIXED32:
                yield number, wire, self.take(4)
            else:
                raise ValueError(f"field {number} has unsupported wire type {wire}")


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF  # negative int32s are sign-extended to 64 bits on the wire
    return value - (1 << 32) if value >= 1 << 31 else value


def _ints(wire: int, value: int | bytes) -> list[int]:
    """A repeated int32 field's values, packed (proto3's default) or not."""
    if wire == _VARINT:
        return [_int32(value)]  # type: ignore[arg-type]
    if wire != _LENGTH:
        raise ValueError(f"int32 field with wire type {wire}")
    packed = _Reader(value)  # type: ignore[arg-type]
    values = []
    while packed.pos < len(packed.data):
        values.append(_int32(packed.varint()))
    return values


def _feature(data: bytes) -> TPUHardwareFeature:
    embedding, devices = 0, 0
    for number, wire, value in _Reader(data).fields():
        if number == 1 and wire == _VARINT:
            embedding = _int32(value)  # type: ignore[arg-type]
        elif number == 2 and wire == _VARINT:
            devices = _int32(value)  # type: ignore[arg-type]
    try:
        kind: EmbeddingFeature | int = EmbeddingFeature(embedding)
    except ValueError:
        kind = embedding  # a value newer than this reader: kept, as protobuf keeps it
    return TPUHardwareFeature(kind, devices)


def parse_topology(serialized: bytes) -> TPUTopology:
    """The ``TopologyProto`` in ``serialized``; ``ValueError`` when it is not one."""
    if not isinstance(serialized, (bytes, bytearray, memoryview)):
        raise TypeError(
            "serialized_tpu_topology must be bytes (a serialized tensorflow.tpu.TopologyProto); "
            f"got {type(serialized).__name__}"
        )
    mesh: list[int] = []
    coordinates: list[int] = []
    tasks = devices = 0
    feature = TPUHardwareFeature()
    try:
        for number, wire, value in _Reader(bytes(serialized)).fields():
            if number == 1:
                mesh.extend(_ints(wire, value))
            elif number == 2 and wire == _VARINT:
                tasks = _int32(value)  # type: ignore[arg-type]
            elif number == 3 and wire == _VARINT:
                devices = _int32(value)  # type: ignore[arg-type]
            elif number == 4:
                coordinates.extend(_ints(wire, value))
            elif number == 5 and wire == _LENGTH:
                feature = _feature(value)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ValueError(
            f"serialized_tpu_topology is not a valid tensorflow.tpu.TopologyProto ({exc}); "
            f"got {len(serialized)} bytes starting {bytes(serialized[:16])!r}"
        ) from None
    return TPUTopology(tuple(mesh), tasks, devices, tuple(coordinates), feature)
