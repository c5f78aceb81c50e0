"""TF 2.21 ``framework/device_spec_test.py``: every behaviour it asserts of ``DeviceSpecV2``
(``tf.DeviceSpec``), asserted against ``jaxcluster.DeviceSpec``. The ``DeviceSpecV1`` cases
(attribute assignment, in-place ``parse_from_string``, ``merge_from``) test TF 1's mutable
class, which ``tf.DeviceSpec`` is not; its immutability is asserted instead."""

from __future__ import annotations

import re

import pytest

from jaxcluster import DeviceSpec


def test_empty() -> None:
    d = DeviceSpec()
    assert d.to_string() == ""
    d.parse_from_string("")
    assert d.to_string() == ""
    assert DeviceSpec.from_string("").to_string() == ""


def test_constructor() -> None:
    d = DeviceSpec(job="j", replica=0, task=1, device_type="CPU", device_index=2)
    assert (d.job, d.replica, d.task, d.device_type, d.device_index) == ("j", 0, 1, "CPU", 2)
    assert d.to_string() == "/job:j/replica:0/task:1/device:CPU:2"
    assert DeviceSpec(device_type="GPU", device_index=0).to_string() == "/device:GPU:0"


def test_replace() -> None:
    d = DeviceSpec().replace(job="foo")
    assert d.to_string() == "/job:foo"
    d = d.replace(task=3)
    assert d.to_string() == "/job:foo/task:3"
    d = d.replace(device_type="CPU", device_index=0)
    assert d.to_string() == "/job:foo/task:3/device:CPU:0"
    d = d.replace(task=None, replica=12)
    assert d.to_string() == "/job:foo/replica:12/device:CPU:0"
    d = d.replace(device_type="GPU", device_index=2)
    assert d.to_string() == "/job:foo/replica:12/device:GPU:2"
    d = d.replace(device_type="CPU", device_index=1)
    assert d.to_string() == "/job:foo/replica:12/device:CPU:1"
    d = d.replace(device_type=None, device_index=None)
    assert d.to_string() == "/job:foo/replica:12"


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"job": "foo"}, "/job:foo"),
        ({"job": "foo", "task": 3}, "/job:foo/task:3"),
        (
            {"job": "foo", "task": 3, "device_type": "cpu", "device_index": 0},
            "/job:foo/task:3/device:CPU:0",
        ),
        (
            {"job": "foo", "replica": 12, "device_type": "cpu", "device_index": 0},
            "/job:foo/replica:12/device:CPU:0",
        ),
        (
            {"job": "foo", "replica": 12, "device_type": "gpu", "device_index": 2},
            "/job:foo/replica:12/device:GPU:2",
        ),
        ({"job": "foo", "replica": 12}, "/job:foo/replica:12"),
        (
            {"job": "foo", "replica": 12, "task": 3, "device_type": "GPU"},
            "/job:foo/replica:12/task:3/device:GPU:*",
        ),
    ],
)
def test_to_string(fields: dict, text: str) -> None:
    assert DeviceSpec(**fields).to_string() == text


def test_to_from_string() -> None:
    d = DeviceSpec.from_string("/job:foo/replica:0")
    assert d.to_string() == "/job:foo/replica:0"
    assert d.replica == 0

    d = DeviceSpec.from_string("/replica:1/task:0/cpu:0")
    assert d.to_string() == "/replica:1/task:0/device:CPU:0"
    assert [d.replica, d.task, d.device_type, d.device_index] == [1, 0, "CPU", 0]

    d = DeviceSpec.from_string("/replica:1/task:0/device:CPU:0")
    assert d.to_string() == "/replica:1/task:0/device:CPU:0"
    assert [d.replica, d.task, d.device_type, d.device_index] == [1, 0, "CPU", 0]

    d = DeviceSpec.from_string("/job:muu/device:GPU:2")
    assert d.to_string() == "/job:muu/device:GPU:2"
    assert [d.job, d.device_type, d.device_index] == ["muu", "GPU", 2]

    # TF's message says "Multiple device types are not allowed"; ours says the same in our words.
    with pytest.raises(ValueError, match=re.compile("multiple device types", re.IGNORECASE)):
        d.parse_from_string("/job:muu/device:GPU:2/cpu:0")


def test_v2_has_no_in_place_merge_and_is_immutable() -> None:
    d = DeviceSpec()
    with pytest.raises(AttributeError):
        d.merge_from(DeviceSpec.from_string("/task:1/cpu:0"))  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        d.job = "foo"  # type: ignore[misc]


def test_combine() -> None:
    d = DeviceSpec.from_string("/job:foo/replica:0")
    d = d.make_merged_spec(DeviceSpec.from_string("/task:1/device:GPU:2"))
    assert d.to_string() == "/job:foo/replica:0/task:1/device:GPU:2"

    d = DeviceSpec().make_merged_spec(DeviceSpec.from_string("/task:1/cpu:0"))
    assert d.to_string() == "/task:1/device:CPU:0"
    d = d.make_merged_spec(DeviceSpec.from_string("/job:boo/device:GPU:0"))
    assert d.to_string() == "/job:boo/task:1/device:GPU:0"
    d = d.make_merged_spec(DeviceSpec.from_string("/job:muu/cpu:2"))
    assert d.to_string() == "/job:muu/task:1/device:CPU:2"
    d = d.make_merged_spec(DeviceSpec.from_string("/job:muu/device:MyFunnyDevice:2"))
    assert d.to_string() == "/job:muu/task:1/device:MyFunnyDevice:2"
