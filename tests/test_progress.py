"""Progress bars on tqdm: ``jaxcluster.progress`` over RemoteValues in the order their
closures end, and ``join(progress=True)``."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

import jaxcluster
from support.closures import counted_square, gated_square, wait_until


def test_values_come_in_the_order_their_closures_end(coordinator: Any, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    slow = coordinator.schedule(gated_square, args=(str(tmp_path), 3, str(gate)))
    wait_until(lambda: list(tmp_path.glob("started-3.*")), "the slow closure to start")
    fast = [coordinator.schedule(counted_square, args=(str(tmp_path), i)) for i in range(3)]
    bar = io.StringIO()
    order = []
    for value in jaxcluster.progress([slow, *fast], desc="squares", file=bar):
        order.append(value)
        if len(order) == len(fast):
            gate.touch()  # the slow one may end only after the fast ones were yielded
    assert order[-1] is slow and set(map(id, order[:3])) == set(map(id, fast))
    assert [v.fetch() for v in order] == [0, 1, 4, 9]
    text = bar.getvalue()
    assert "squares" in text and "4/4" in text and "closure" in text


def test_a_failed_closure_is_yielded_and_raises_on_fetch(coordinator: Any) -> None:
    def boom() -> None:
        raise ZeroDivisionError("nope")

    with (
        jaxcluster.LocalCluster(1) as cluster,
        cluster.coordinator(error_policy="per_closure") as own,
    ):
        [value] = jaxcluster.progress([own.schedule(boom)], disable=True)
        with pytest.raises(ZeroDivisionError):
            value.fetch()


def test_only_remote_values_are_taken() -> None:
    with pytest.raises(TypeError, match=r"RemoteValues.*got int"):
        list(jaxcluster.progress([1, 2]))


def test_join_with_progress_counts_what_ends(
    coordinator: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = tmp_path / "gate"
    values = [
        coordinator.schedule(gated_square, args=(str(tmp_path), i, str(gate))) for i in range(6)
    ]
    wait_until(lambda: list(tmp_path.glob("started-*")), "a closure to start")
    gate.touch()
    assert coordinator.join(progress=True) is True
    err = capsys.readouterr().err
    assert "join" in err and "6/6" in err, err
    assert [v.fetch() for v in values] == [i * i for i in range(6)]
