"""DeviceSpec: every form of SPEC §3, TF's edge cases, errors, and immutability."""

from __future__ import annotations

import copy
import pickle
import threading

import pytest

from jaxcluster.devices import DeviceSpec

FULL = "/job:worker/replica:0/task:3/device:TPU:7"


def fields(spec: DeviceSpec) -> tuple[object, ...]:
    return (spec.job, spec.replica, spec.task, spec.device_type, spec.device_index)


@pytest.mark.parametrize(
    ("text", "expected_fields", "canonical"),
    [
        (FULL, ("worker", 0, 3, "TPU", 7), FULL),
        ("/device:GPU:1/task:2/replica:3/job:ps", ("ps", 3, 2, "GPU", 1), None),
        ("job:ps/task:0", ("ps", None, 0, None, None), "/job:ps/task:0"),
        ("/cpu:0", (None, None, None, "CPU", 0), "/device:CPU:0"),
        ("/gpu:*", (None, None, None, "GPU", None), "/device:GPU:*"),
        ("/GPU", (None, None, None, "GPU", None), "/device:GPU:*"),
        ("/tpu:1", (None, None, None, "TPU", 1), "/device:TPU:1"),
        ("/custom:3", (None, None, None, "CUSTOM", 3), "/device:CUSTOM:3"),
        ("/epu:0", (None, None, None, "EPU", 0), "/device:EPU:0"),
        ("/Gpu:2", (None, None, None, "GPU", 2), "/device:GPU:2"),
        # str.upper() maps the long s to "S", so TF reads this as CUSTOM.
        ("/cu\u017ftom:1", (None, None, None, "CUSTOM", 1), "/device:CUSTOM:1"),
        ("/device:cpu:0", (None, None, None, "CPU", 0), "/device:CPU:0"),
        ("/device:gpu:*", (None, None, None, "GPU", None), "/device:GPU:*"),
        ("/device:Gpu:0", (None, None, None, "Gpu", 0), "/device:Gpu:0"),
        ("/device:tpu:0", (None, None, None, "tpu", 0), "/device:tpu:0"),
        ("/device:TPU_SYSTEM:0", (None, None, None, "TPU_SYSTEM", 0), None),
        ("/device::0", (None, None, None, "", 0), "/device::0"),
        ("//job:a///task:1//", ("a", None, 1, None, None), "/job:a/task:1"),
        ("/:0/job:a/:x:y", ("a", None, None, None, None), "/job:a"),
        ("/job:a/job:b/task:1/task:2", ("b", None, 2, None, None), "/job:b/task:2"),
        ("/task:x/task:4", (None, None, 4, None, None), "/task:4"),
        ("/job:", ("", None, None, None, None), "/job:"),
        ("/job: my job ", (" my job ", None, None, None, None), "/job: my job "),
        ("/task: 7 /replica:+1", (None, 1, 7, None, None), "/replica:1/task:7"),
        ("/task:1_000/gpu:007", (None, None, 1000, "GPU", 7), "/task:1000/device:GPU:7"),
        ("/task:-0", (None, None, 0, None, None), "/task:0"),
        ("", (None, None, None, None, None), ""),
        ("/", (None, None, None, None, None), ""),
    ],
)
def test_from_string_forms(
    text: str, expected_fields: tuple[object, ...], canonical: str | None
) -> None:
    spec = DeviceSpec.from_string(text)
    assert fields(spec) == expected_fields
    if canonical is not None:
        assert spec.to_string() == canonical
    assert DeviceSpec.from_string(spec.to_string()) == spec


def test_none_is_the_empty_spec() -> None:
    assert DeviceSpec.from_string(None) == DeviceSpec()
    assert DeviceSpec().to_string() == ""


@pytest.mark.parametrize(
    ("text", "segment", "kind"),
    [
        ("/cpu:0/gpu:1", "gpu:1", "multiple device types"),
        ("/device:CPU:0/device:GPU:0", "device:GPU:0", "multiple device types"),
        ("/job:w/gpu/tpu:0", "tpu:0", "multiple device types"),
        ("/jb:worker", "jb:worker", "unknown attribute"),
        ("/JOB:a", "JOB:a", "unknown attribute"),
        ("/Device:GPU:0", "Device:GPU:0", "unknown attribute"),
        (" /job:a", " ", "unknown attribute"),
        ("/host:1/task:0", "host:1", "unknown attribute"),
        ("/device:CPU", "device:CPU", "malformed segment"),
        ("/device:GPU:0:1", "device:GPU:0:1", "malformed segment"),
        ("/job:a:b", "job:a:b", "malformed segment"),
        ("/task", "task", "malformed segment"),
        ("/cpu:0:1", "cpu:0:1", "malformed segment"),
        ("/job:w/task:-1", "task:-1", "negative"),
        ("/replica:-2", "replica:-2", "negative"),
        ("/gpu:-1", "gpu:-1", "negative"),
        ("/task:one", "task:one", "not an integer"),
        ("/job:a/task:1.5", "task:1.5", "not an integer"),
        ("/device:GPU:x", "device:GPU:x", "not an integer"),
        ("/cpu: *", "cpu: *", "not an integer"),
        ("/gpu:", "gpu:", "empty"),
        ("/task:99999999999999999999", "task:99999999999999999999", "64 bits"),
    ],
)
def test_invalid_strings_name_segment_and_input(text: str, segment: str, kind: str) -> None:
    with pytest.raises(ValueError) as info:
        DeviceSpec.from_string(text)
    message = str(info.value)
    assert kind in message
    assert f'"{segment}"' in message
    assert f'"{text}"' in message


def test_unknown_attribute_suggests_the_keyword() -> None:
    with pytest.raises(ValueError, match='did you mean "task"'):
        DeviceSpec.from_string("/job:a/taks:1")


def test_non_string_and_lone_surrogate_inputs() -> None:
    with pytest.raises(TypeError, match="expects a str"):
        DeviceSpec.from_string(b"/job:a")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="surrogate"):
        DeviceSpec.from_string("/job:\ud800")


def test_constructor_converts_like_tf() -> None:
    spec = DeviceSpec(job="worker", replica="1", task=" 2 ", device_type="gpu", device_index=3)
    assert fields(spec) == ("worker", 1, 2, "GPU", 3)
    assert DeviceSpec(device_type="cpu").device_type == "CPU"
    assert DeviceSpec(device_type="tpu").device_type == "tpu"
    assert DeviceSpec(device_type="Gpu").device_type == "Gpu"
    assert DeviceSpec(job=7).job == "7"
    assert DeviceSpec("ps", 0, 1, "CPU", 0).to_string() == "/job:ps/replica:0/task:1/device:CPU:0"
    assert DeviceSpec(task=2.0).task == 2  # type: ignore[arg-type]
    assert DeviceSpec(task=True).task == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        ({"task": -1}, ValueError, "negative"),
        ({"replica": "-3"}, ValueError, "negative"),
        ({"device_index": "x"}, ValueError, "'x' is not an integer"),
        ({"task": 1.5}, ValueError, "1.5 is not an integer"),
        ({"task": 2**70}, ValueError, "64 bits"),
        ({"replica": [1]}, TypeError, "got list [1]"),
        ({"job": "\ud800"}, ValueError, "lone surrogate"),
        ({"device_type": "\udfff"}, ValueError, "lone surrogate"),
    ],
)
def test_constructor_rejects_bad_values(
    kwargs: dict[str, object], error: type[Exception], needle: str
) -> None:
    with pytest.raises(error) as info:
        DeviceSpec(**kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    field = next(iter(kwargs))
    assert needle in message
    assert field in message or field.replace("_", " ") in message


def test_to_string_prints_star_for_missing_index_and_ignores_lone_index() -> None:
    assert DeviceSpec(device_type="GPU").to_string() == "/device:GPU:*"
    # As in TF, an index without a type is not printed, so such specs compare equal.
    assert DeviceSpec(device_index=3).to_string() == ""
    assert DeviceSpec(device_index=3) == DeviceSpec()


def test_merge_takes_each_set_field_from_other() -> None:
    base = DeviceSpec.from_string("/job:worker/replica:0/task:1/device:GPU:0")
    merged = base.make_merged_spec(DeviceSpec.from_string("/task:4/device:CPU:*"))
    assert merged.to_string() == "/job:worker/replica:0/task:4/device:CPU:0"
    assert base.make_merged_spec(DeviceSpec()) == base
    assert base.to_string() == "/job:worker/replica:0/task:1/device:GPU:0"
    with pytest.raises(TypeError):
        base.make_merged_spec("/task:1")  # type: ignore[arg-type]


def test_replace_and_parse_from_string_return_new_specs() -> None:
    base = DeviceSpec.from_string(FULL)
    assert base.replace(task="5", device_type="gpu").to_string() == (
        "/job:worker/replica:0/task:5/device:GPU:7"
    )
    assert base.replace(job=None, device_index=None).to_string() == "/replica:0/task:3/device:TPU:*"
    assert base.replace() == base
    with pytest.raises(TypeError, match="unknown field"):
        base.replace(jobs="x")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="negative"):
        base.replace(replica=-1)
    parsed = base.parse_from_string("/job:ps")
    assert parsed.to_string() == "/job:ps"
    assert base.to_string() == FULL


def test_equality_hash_repr_and_pickle() -> None:
    a = DeviceSpec.from_string("/task:3/job:worker/replica:0/tpu:7")
    b = DeviceSpec.from_string(FULL)
    assert a == b
    assert (a != b) is False
    assert hash(a) == hash(b) == hash(FULL)
    assert a != DeviceSpec.from_string("/job:worker/replica:0/task:3/device:TPU:6")
    assert a != FULL
    assert len({a, b, DeviceSpec()}) == 2
    assert repr(a) == (
        "DeviceSpec(job='worker', replica=0, task=3, device_type='TPU', device_index=7)"
    )
    assert eval(repr(a), {"DeviceSpec": DeviceSpec}) == a
    assert repr(DeviceSpec()) == "DeviceSpec()"
    assert pickle.loads(pickle.dumps(a)) == a
    assert copy.deepcopy(a) == a


@pytest.mark.parametrize("name", ["job", "replica", "task", "device_type", "device_index"])
def test_attributes_are_read_only(name: str) -> None:
    spec = DeviceSpec.from_string(FULL)
    with pytest.raises(AttributeError):
        setattr(spec, name, None)
    with pytest.raises(AttributeError):
        spec.extra = 1  # type: ignore[attr-defined]
    assert spec.to_string() == FULL


def test_shared_specs_from_many_threads() -> None:
    names = [f"/job:worker/replica:0/task:{i}/device:GPU:{i % 8}" for i in range(400)]
    shared = [DeviceSpec.from_string(n) for n in names]
    barrier = threading.Barrier(8)
    failures: list[str] = []

    def work() -> None:
        barrier.wait()
        for _ in range(20):
            for name, spec in zip(names, shared, strict=True):
                parsed = DeviceSpec.from_string(name)
                if parsed != spec or hash(parsed) != hash(spec) or spec.to_string() != name:
                    failures.append(name)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
