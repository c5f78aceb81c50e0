"""Checkpoints: round trip through real ps tasks, atomic replacement (a crash between write
and rename leaves the previous checkpoint), and corrupt or mismatched files refused with
nothing changed."""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from jaxcluster.errors import PSUnavailableError
from jaxcluster.local_cluster import LocalCluster
from jaxcluster.strategy import FixedShardsPartitioner, ParameterServerStrategy, checkpoint
from jaxcluster.strategy.variables import ParameterServerVariable


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(num_workers=1, num_ps=2) as c:
        yield c


class Model:
    """Three variables of different kinds, one of them sharded over both ps tasks."""

    def __init__(self, cluster: LocalCluster, prefix: str, *, shards: int = 2) -> None:
        self.strategy = ParameterServerStrategy(
            cluster.resolver, FixedShardsPartitioner(shards), auth_token=cluster.auth_token
        )
        with self.strategy.scope():
            self.w = self.strategy.Variable(
                np.arange(12, dtype=np.float32).reshape(6, 2), f"{prefix}w"
            )
            self.step = self.strategy.Variable(np.int64(7), name=f"{prefix}step")
            self.h = self.strategy.Variable(np.ones(3), f"{prefix}h", ml_dtypes.bfloat16)

    @property
    def variables(self) -> list[ParameterServerVariable]:
        return [self.w, self.step, self.h]

    def values(self) -> list[np.ndarray]:
        return [v.read_value() for v in self.variables]

    def scramble(self) -> None:
        self.w.assign_add(np.full((6, 2), 100, np.float32))
        self.step.assign(np.int64(-1))
        self.h.assign(np.zeros(3, ml_dtypes.bfloat16))


def assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def test_round_trip_restores_every_variable(cluster: LocalCluster, tmp_path: Path) -> None:
    model = Model(cluster, "rt/")
    saved = model.values()
    path = tmp_path / "model.jaxc"
    model.strategy.save(path)
    model.scramble()
    assert model.step.read_value() == -1
    model.strategy.restore(path)
    assert_same(model.values(), saved)
    # The file holds whole variables by name, whatever the sharding was.
    on_disk = checkpoint.read_checkpoint(path)
    assert list(on_disk) == ["rt/w", "rt/step", "rt/h"]
    np.testing.assert_array_equal(on_disk["rt/w"], saved[0])


def test_restore_into_another_layout_and_after_a_ps_restart(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    first = Model(cluster, "moved/", shards=2)
    first.w.assign_add(np.ones((6, 2), np.float32))
    saved = first.values()
    path = tmp_path / "moved.jaxc"
    first.strategy.save(path)

    second = Model(cluster, "moved/", shards=3)  # re-created by "a restarted coordinator"
    second.scramble()
    second.strategy.restore(path)
    assert_same(second.values(), saved)

    cluster.restart_ps(1)  # loses its half of every variable
    with pytest.raises(PSUnavailableError, match="lost its variables"):
        second.values()
    second.strategy.restore(path)
    assert_same(second.values(), saved)


def test_corrupt_checkpoints_are_refused_and_nothing_changes(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    model = Model(cluster, "corrupt/")
    good = tmp_path / "good.jaxc"
    model.strategy.save(good)
    model.scramble()
    scrambled = model.values()
    blob = good.read_bytes()
    cases = {
        "truncated": blob[: len(blob) // 2],
        "flipped": blob[:40] + bytes([blob[40] ^ 1]) + blob[41:],
        "garbage": b"not a checkpoint at all, just some bytes" * 3,
        "empty": b"",
    }
    for label, content in cases.items():
        bad = tmp_path / f"{label}.jaxc"
        bad.write_bytes(content)
        with pytest.raises(ValueError, match="corrupt") as info:
            model.strategy.restore(bad)
        assert str(bad) in str(info.value), label
        assert_same(model.values(), scrambled)
    newer = bytearray(blob)
    newer[16:20] = (2).to_bytes(4, "little")
    (tmp_path / "newer.jaxc").write_bytes(bytes(newer))
    with pytest.raises(ValueError, match="format version 2"):
        model.strategy.restore(tmp_path / "newer.jaxc")
    with pytest.raises(FileNotFoundError):
        model.strategy.restore(tmp_path / "missing.jaxc")
    assert_same(model.values(), scrambled)


def test_mismatched_checkpoints_are_refused_and_nothing_changes(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    model = Model(cluster, "mm/")
    model.scramble()
    before = model.values()
    reshaped = tmp_path / "reshaped.jaxc"
    checkpoint.write_checkpoint(
        reshaped,
        {
            "mm/w": np.zeros((6, 3), np.float32),
            "mm/step": np.int32(0),
            "mm/h": np.ones(3, ml_dtypes.bfloat16),
        },
    )
    with pytest.raises(ValueError) as info:
        model.strategy.restore(reshaped)
    message = str(info.value)
    assert "nothing was restored" in message
    assert "'mm/w' is float32[6, 2] but the checkpoint holds float32[6, 3]" in message
    assert "'mm/step' is int64[] but the checkpoint holds int32[]" in message
    assert "'mm/h'" not in message
    other = tmp_path / "other.jaxc"
    checkpoint.write_checkpoint(other, {"mm/w": np.zeros((6, 2), np.float32), "zz": np.int8(1)})
    with pytest.raises(ValueError, match=r"'mm/step' is not in the checkpoint.*lacks: \['zz'\]"):
        model.strategy.restore(other)
    assert_same(model.values(), before)


def test_a_failure_between_write_and_rename_keeps_the_previous_checkpoint(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Model(cluster, "crash/")
    path = tmp_path / "ckpt.jaxc"
    model.strategy.save(path)
    saved = model.values()
    model.scramble()
    seen: list[str] = []

    def fail(tmp: str) -> None:
        seen.append(tmp)
        assert Path(tmp).exists() and Path(tmp).parent == tmp_path
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(checkpoint, "_before_rename", fail)
    with pytest.raises(OSError, match="simulated crash"):
        model.strategy.save(path)
    monkeypatch.setattr(checkpoint, "_before_rename", None)
    assert seen and not Path(seen[0]).exists(), "the temporary file is cleaned up"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.jaxc"]
    model.strategy.restore(path)
    assert_same(model.values(), saved)


def test_a_process_killed_between_write_and_rename_leaves_the_previous_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ckpt.jaxc"
    previous = {"a": np.arange(5, dtype=np.float64), "b": np.int16(3)}
    checkpoint.write_checkpoint(path, previous)
    script = textwrap.dedent(
        f"""
        import os, signal, numpy as np
        from jaxcluster.strategy import checkpoint
        def die(tmp):
            print(tmp, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        checkpoint._before_rename = die
        checkpoint.write_checkpoint({str(path)!r}, {{"a": np.zeros(5), "b": np.int16(9)}})
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == -9, child.stderr
    leftover = Path(child.stdout.strip())
    assert leftover.exists() and leftover.stat().st_size > 0, "the new data was fully written"
    restored = checkpoint.read_checkpoint(path)
    np.testing.assert_array_equal(restored["a"], previous["a"])
    assert restored["b"] == 3
    # The stray temporary file does not confuse the next save, which removes it.
    checkpoint.write_checkpoint(path, {"a": np.ones(5)})
    np.testing.assert_array_equal(checkpoint.read_checkpoint(path)["a"], np.ones(5))
    assert not leftover.exists(), "the abandoned temporary file was left behind"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.jaxc"]


def test_a_temporary_file_a_live_writer_holds_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.jaxc"
    busy = tmp_path / ".ckpt.jaxc.live.tmp"
    busy.write_bytes(b"partial")
    with busy.open("rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        checkpoint.write_checkpoint(path, {"a": np.ones(2)})
        assert busy.exists(), "a save removed another writer's file"
    checkpoint.write_checkpoint(path, {"a": np.ones(2)})
    assert not busy.exists()


def _crafted(path: Path, header: bytes) -> None:
    body = checkpoint._PREFIX.pack(checkpoint.MAGIC, checkpoint.FORMAT_VERSION, len(header))
    body += header
    path.write_bytes(body + hashlib.sha256(body).digest())


@pytest.mark.parametrize("depth", [200, 100_000])
def test_deeply_nested_json_is_a_value_error(tmp_path: Path, depth: int) -> None:
    path = tmp_path / "deep.jaxc"
    nested = b"[" * depth + b"]" * depth
    _crafted(path, b'{"variables": [{"name": ' + nested + b"}]}")
    with pytest.raises(ValueError, match="corrupt"):
        checkpoint.read_checkpoint(path)


def test_saving_over_a_directory_is_refused(cluster: LocalCluster, tmp_path: Path) -> None:
    model = Model(cluster, "dir/")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        model.strategy.save(tmp_path)
