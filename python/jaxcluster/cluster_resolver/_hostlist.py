"""Slurm's compressed host lists (``n[01-03,7],m5``) and task counts (``3(x2),2,1``).

Both parsers accept any string and either return a list or raise ``ValueError``: the input
comes from the environment, and a typo there must not surface as an ``IndexError`` or an
hour spent expanding ``n[0-99999999999]``. Sizes are computed before anything is built.
"""

from __future__ import annotations

import re

__all__ = ["MAX_EXPANDED_CHARS", "MAX_EXPANDED_ENTRIES", "expand_hostlist", "expand_tasks_per_node"]

MAX_EXPANDED_ENTRIES = 1_000_000
"""Largest number of hosts or task counts an expansion may produce."""

MAX_EXPANDED_CHARS = 64 * 1024 * 1024
"""Largest total length of the host names an expansion may produce (long prefixes x many)."""

# A number is at most this many significant digits; more cannot be a real node index.
_MAX_DIGITS = 18
_RANGE_ITEM = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_TASKS_ITEM = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")
_HOSTLIST_EXAMPLE = (
    "expected comma-separated host names with optional [ranges], e.g. 'n[01-03,7],m5'"
)


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 120 else repr(text[:120]) + f"... ({len(text)} chars)"


def _number(digits: str, fail: type[Exception], context: str) -> int:
    if len(digits.lstrip("0")) > _MAX_DIGITS:
        raise fail(f"number {_shown(digits)} in {context} is too large")
    return int(digits)


class _HostlistError(Exception):
    """Internal: a problem in one part, re-raised as ValueError with the whole input."""


def _split_parts(hostlist: str) -> list[str]:
    """Splits at commas outside brackets; brackets must pair up and not nest."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for position, char in enumerate(hostlist):
        if char.isspace() or not char.isprintable():
            raise _HostlistError(f"character {char!r} at position {position} is not allowed")
        if char == "[":
            if depth:
                raise _HostlistError(f"nested '[' at position {position}")
            depth = 1
        elif char == "]":
            if not depth:
                raise _HostlistError(f"']' at position {position} has no matching '['")
            depth = 0
        elif char == "," and not depth:
            if not current:
                raise _HostlistError(f"empty host name before the comma at position {position}")
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    if depth:
        raise _HostlistError("'[' is never closed")
    if current:
        parts.append("".join(current))
    elif parts:
        raise _HostlistError("trailing comma")
    return parts


# One part is a sequence of literal text and bracket groups; a group is a list of ranges
# (first, last, zero-padded width).
_Segment = str | list[tuple[int, int, int]]


def _parse_part(part: str) -> list[_Segment]:
    segments: list[_Segment] = []
    for index, piece in enumerate(re.split(r"[\[\]]", part)):
        if index % 2 == 0:
            if piece:
                segments.append(piece)
            continue
        if not piece:
            raise _HostlistError(f"empty brackets '[]' in {part!r}")
        ranges: list[tuple[int, int, int]] = []
        for item in piece.split(","):
            match = _RANGE_ITEM.fullmatch(item)
            if match is None:
                raise _HostlistError(
                    f"range item {item!r} in {part!r} is not N or N-M with decimal digits"
                )
            low_digits, high_digits = match.group(1), match.group(2) or match.group(1)
            low = _number(low_digits, _HostlistError, repr(part))
            high = _number(high_digits, _HostlistError, repr(part))
            if high < low:
                raise _HostlistError(f"range {item!r} in {part!r} runs backwards")
            ranges.append((low, high, len(low_digits)))
        segments.append(ranges)
    return segments


def _expand_part(segments: list[_Segment]) -> list[str]:
    names = [""]
    for segment in segments:
        if isinstance(segment, str):
            names = [name + segment for name in names]
        else:
            values = [
                str(i).zfill(width) for low, high, width in segment for i in range(low, high + 1)
            ]
            names = [name + value for name in names for value in values]
    return names


def expand_hostlist(hostlist: str) -> list[str]:
    """Expands a Slurm host list, keeping its order.

    Zero padding follows the first number of a range; text may follow a bracket group
    (``n[1-2].cluster.local``), and several groups in one name expand left to right.
    ``ValueError`` for any malformed string or an expansion over 1,000,000 names.

    Example::

        >>> expand_hostlist("n[01-03,7],m5")
        ['n01', 'n02', 'n03', 'n7', 'm5']
        >>> expand_hostlist("n[1-2].cluster.local")
        ['n1.cluster.local', 'n2.cluster.local']
    """
    if not isinstance(hostlist, str):
        raise TypeError(f"hostlist must be a string; got {type(hostlist).__name__} {hostlist!r}")
    try:
        parsed = [_parse_part(part) for part in _split_parts(hostlist)]
        total_names = 0
        total_chars = 0
        for segments in parsed:
            count = 1
            width = 0
            for segment in segments:
                if isinstance(segment, str):
                    width += len(segment)
                else:
                    count *= sum(high - low + 1 for low, high, _ in segment)
                    width += max(max(pad, len(str(high))) for _, high, pad in segment)
                    if count > MAX_EXPANDED_ENTRIES:
                        break
            total_names += count
            total_chars += count * width
            if total_names > MAX_EXPANDED_ENTRIES:
                raise _HostlistError(f"it expands to more than {MAX_EXPANDED_ENTRIES:,} host names")
            if total_chars > MAX_EXPANDED_CHARS:
                raise _HostlistError(
                    f"its host names add up to more than {MAX_EXPANDED_CHARS:,} characters"
                )
    except _HostlistError as exc:
        raise ValueError(
            f"invalid Slurm hostlist {_shown(hostlist)}: {exc}; {_HOSTLIST_EXAMPLE}"
        ) from None
    hosts: list[str] = []
    for segments in parsed:
        hosts.extend(_expand_part(segments))
    return hosts


def expand_tasks_per_node(tasks_per_node: str) -> list[int]:
    """Expands Slurm's tasks-per-node list: ``"3(x2),2,1"`` -> ``[3, 3, 2, 1]``.

    ``ValueError`` for any malformed string or more than 1,000,000 entries.

    Example::

        >>> expand_tasks_per_node("2(x3),1")
        [2, 2, 2, 1]
    """
    if not isinstance(tasks_per_node, str):
        raise TypeError(
            f"tasks_per_node must be a string; got {type(tasks_per_node).__name__} "
            f"{tasks_per_node!r}"
        )
    context = f"Slurm tasks-per-node list {_shown(tasks_per_node)}"
    expected = "expected comma-separated counts with optional repeats, e.g. '3(x2),2,1'"
    items: list[tuple[int, int]] = []
    total = 0
    for item in tasks_per_node.split(","):
        match = _TASKS_ITEM.fullmatch(item)
        if match is None:
            raise ValueError(f"invalid {context}: item {_shown(item)} is malformed; {expected}")
        count = _number(match.group(1), ValueError, context)
        repeat = _number(match.group(2), ValueError, context) if match.group(2) else 1
        if repeat == 0:
            raise ValueError(f"invalid {context}: item {item!r} repeats zero times; {expected}")
        total += repeat
        if total > MAX_EXPANDED_ENTRIES:
            raise ValueError(
                f"invalid {context}: it expands to more than {MAX_EXPANDED_ENTRIES:,} entries"
            )
        items.append((count, repeat))
    result: list[int] = []
    for count, repeat in items:
        result.extend([count] * repeat)
    return result
