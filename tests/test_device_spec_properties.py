"""Property tests of DeviceSpec: round trips, and agreement with TF's grammar restated in
plain Python on strings assembled from the grammar's own tokens."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jaxcluster.devices import DeviceSpec

Fields = tuple[str | None, int | None, int | None, str | None, int | None]

BARE_TYPES = {"CPU", "GPU", "TPU", "CUSTOM", "EPU"}


def reference(spec: str | None) -> Fields | None:
    """TF 2.x's ``DeviceSpecV2`` reading of ``spec`` (``None`` where it raises), restated
    from its documented rules, plus SPEC §3's rejection of negative numbers and our rejection
    of numbers that do not fit in 64 bits (TF would overflow later, in C++)."""

    def number(text: str) -> int:
        value = int(text)
        if not 0 <= value < 2**64:
            raise ValueError(text)
        return value

    job: str | None = None
    replica: str | None = None
    task: str | None = None
    kind: str | None = None
    index: int | None = None
    try:
        for segment in (spec or "").split("/"):
            parts = segment.split(":")
            head = parts[0]
            if len(parts) == 2 and head == "job":
                job = parts[1]
            elif len(parts) == 2 and head == "replica":
                replica = parts[1]
            elif len(parts) == 2 and head == "task":
                task = parts[1]
            elif len(parts) <= 2 and head.upper() in BARE_TYPES:
                if kind is not None:
                    return None
                kind = head.upper()
                if len(parts) == 2 and parts[1] != "*":
                    index = number(parts[1])
            elif len(parts) == 3 and head == "device":
                if kind is not None:
                    return None
                kind = parts[1].upper() if parts[1] in ("cpu", "gpu") else parts[1]
                if parts[2] != "*":
                    index = number(parts[2])
            elif head:
                return None
        return (
            job,
            None if replica is None else number(replica),
            None if task is None else number(task),
            kind,
            index,
        )
    except ValueError:
        return None


TOKENS = [
    "/", "/", ":", ":", "job", "replica", "task", "device", "cpu", "gpu", "GPU", "tPu",
    "custom", "cu\u017ftom", "epu", "TPU_SYSTEM", "Job", "*", "0", "7", "12", "-", "+", "_",
    " ", "\t", "x", "\u00e9", "99999999999999999999",
]  # fmt: skip

token_soup = st.lists(st.sampled_from(TOKENS), max_size=16).map("".join)


@settings(max_examples=3000, deadline=None)
@given(token_soup)
def test_agrees_with_tf_grammar(text: str) -> None:
    expected = reference(text)
    if expected is None:
        try:
            DeviceSpec.from_string(text)
        except ValueError as err:
            assert repr(text)[1:-1] in str(err) or text in str(err)
            return
        raise AssertionError(f"{text!r} should be rejected")
    spec = DeviceSpec.from_string(text)
    assert (spec.job, spec.replica, spec.task, spec.device_type, spec.device_index) == expected


@settings(max_examples=2000, deadline=None)
@given(st.text(max_size=60))
def test_arbitrary_text_parses_or_raises_value_error(text: str) -> None:
    try:
        spec = DeviceSpec.from_string(text)
    except ValueError:
        return
    assert DeviceSpec.from_string(spec.to_string()) == spec


# Lone surrogates are rejected (they cannot cross into Rust as text); see test_device_spec.
names = st.text(
    alphabet=st.characters(exclude_characters="/:", exclude_categories=["Cs"]), max_size=12
)
indices = st.none() | st.integers(min_value=0, max_value=2**64 - 1)
device_types = (st.sampled_from(["CPU", "GPU", "TPU", "TPU_SYSTEM"]) | names).filter(
    lambda kind: kind not in ("cpu", "gpu")
)


@settings(max_examples=1000, deadline=None)
@given(st.none() | names, indices, indices, st.none() | device_types, indices)
def test_constructed_specs_round_trip(
    job: str | None,
    replica: int | None,
    task: int | None,
    kind: str | None,
    index: int | None,
) -> None:
    if kind is None:
        index = None  # an index without a type is not printed
    spec = DeviceSpec(job, replica, task, kind, index)
    parsed = DeviceSpec.from_string(spec.to_string())
    assert parsed == spec
    assert (parsed.job, parsed.replica, parsed.task) == (job, replica, task)
    assert (parsed.device_type, parsed.device_index) == (kind, index)
    assert hash(parsed) == hash(spec)


@settings(max_examples=500, deadline=None)
@given(token_soup, token_soup)
def test_merge_matches_field_by_field_choice(a_text: str, b_text: str) -> None:
    if reference(a_text) is None or reference(b_text) is None:
        return
    a, b = DeviceSpec.from_string(a_text), DeviceSpec.from_string(b_text)
    merged = a.make_merged_spec(b)
    for name in ("job", "replica", "task", "device_type", "device_index"):
        mine, theirs = getattr(a, name), getattr(b, name)
        assert getattr(merged, name) == (theirs if theirs is not None else mine)
