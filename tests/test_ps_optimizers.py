"""Optimizers applied on the ps (ApplyUpdate) on a real LocalCluster: each against optax
over 50 steps of random gradients, concurrent writers, sharded variables, pickling."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import cloudpickle
import numpy as np
import optax
import pytest

from jaxcluster.local_cluster import LocalCluster
from jaxcluster.strategy import FixedShardsPartitioner, ParameterServerStrategy
from jaxcluster.strategy import optimizers as opt

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(num_workers=1, num_ps=2) as c:
        yield c


def strategy_for(cluster: LocalCluster, partitioner: Any = None) -> ParameterServerStrategy:
    return ParameterServerStrategy(cluster.resolver, partitioner, auth_token=cluster.auth_token)


def _keras_piecewise(boundaries: list[int], values: list[float]) -> Any:
    def schedule(step: Any) -> Any:
        import jax.numpy as jnp

        index = jnp.sum(jnp.asarray(boundaries) < step)
        return jnp.asarray(values, jnp.float32)[index]

    return schedule


CASES = [
    ("sgd", opt.SGD(learning_rate=0.1), optax.sgd(0.1)),
    ("momentum", opt.SGD(0.1, momentum=0.9), optax.sgd(0.1, momentum=0.9)),
    ("nesterov", opt.SGD(0.1, momentum=0.9, nesterov=True), optax.sgd(0.1, 0.9, nesterov=True)),
    ("adam", opt.Adam(0.01), optax.adam(0.01, b1=0.9, b2=0.999, eps=1e-7)),
    ("adamw", opt.AdamW(0.01, weight_decay=0.1), optax.adamw(0.01, eps=1e-7, weight_decay=0.1)),
    ("rmsprop", opt.RMSprop(0.01), optax.rmsprop(0.01, decay=0.9, eps=1e-7)),
    (
        "rmsprop_centered_momentum",
        opt.RMSprop(0.01, momentum=0.5, centered=True),
        optax.rmsprop(0.01, decay=0.9, eps=1e-7, centered=True, momentum=0.5),
    ),
    (
        "adagrad",
        opt.Adagrad(0.1),
        optax.adagrad(0.1, initial_accumulator_value=0.1, eps=1e-7),
    ),
    # Keras's shared arguments: Adam with a weight decay is AdamW; SGD's decay comes
    # before the step; clipping and loss scaling act on the gradient before it is sent.
    (
        "adam_weight_decay",
        opt.Adam(0.01, weight_decay=0.1),
        optax.adamw(0.01, eps=1e-7, weight_decay=0.1),
    ),
    ("amsgrad", opt.Adam(0.01, amsgrad=True), optax.amsgrad(0.01, b1=0.9, b2=0.999, eps=1e-7)),
    (
        "adamw_amsgrad",
        opt.AdamW(0.01, weight_decay=0.1, amsgrad=True),
        optax.chain(
            optax.scale_by_amsgrad(b1=0.9, b2=0.999, eps=1e-7),
            optax.add_decayed_weights(0.1),
            optax.scale(-0.01),
        ),
    ),
    (
        "sgd_weight_decay",
        opt.SGD(0.1, weight_decay=0.01),
        optax.chain(optax.add_decayed_weights(0.01), optax.sgd(0.1)),
    ),
    (
        "sgd_clipnorm",
        opt.SGD(0.1, clipnorm=0.5),
        optax.chain(optax.clip_by_global_norm(0.5), optax.sgd(0.1)),
    ),
    ("sgd_clipvalue", opt.SGD(0.1, clipvalue=0.5), optax.chain(optax.clip(0.5), optax.sgd(0.1))),
    (
        "adagrad_loss_scale",
        opt.Adagrad(0.1, loss_scale_factor=4.0),
        optax.chain(optax.scale(0.25), optax.adagrad(0.1, initial_accumulator_value=0.1, eps=1e-7)),
    ),
    (
        "adam_exponential_decay",
        opt.Adam(opt.ExponentialDecay(0.01, 10, 0.5)),
        optax.adam(optax.exponential_decay(0.01, 10, 0.5), eps=1e-7),
    ),
    (
        "sgd_cosine_decay",
        opt.SGD(opt.CosineDecay(0.1, 30, alpha=0.1)),
        optax.sgd(optax.cosine_decay_schedule(0.1, 30, alpha=0.1)),
    ),
    (
        "sgd_piecewise",
        opt.SGD(opt.PiecewiseConstantDecay([10, 20], [0.1, 0.05, 0.01])),
        optax.sgd(_keras_piecewise([10, 20], [0.1, 0.05, 0.01])),
    ),
]


@pytest.mark.parametrize(("label", "ps_opt", "reference"), CASES, ids=[c[0] for c in CASES])
def test_each_optimizer_matches_optax_over_50_steps(
    cluster: LocalCluster, label: str, ps_opt: opt.Optimizer, reference: Any
) -> None:
    rng = np.random.default_rng(len(label))
    start = rng.normal(size=(4, 3)).astype(np.float32)
    with strategy_for(cluster).scope() as strategy:
        w = strategy.Variable(start, name=f"w_{label}")
    params = start.copy()
    state = reference.init(params)
    for _ in range(50):
        grad = rng.normal(size=(4, 3)).astype(np.float32)
        ps_opt.apply_gradients([(grad, w)])
        updates, state = reference.update(grad, state, params)
        params = np.asarray(optax.apply_updates(params, updates))
    np.testing.assert_allclose(w.read_value(), params, rtol=1e-6, atol=1e-6)
    assert ps_opt.iterations(w) == 50


def test_pytrees_sharded_variables_and_worker_closures(cluster: LocalCluster) -> None:
    strategy = strategy_for(cluster, FixedShardsPartitioner(2))
    with strategy.scope():
        params = {"a": strategy.Variable(np.ones((4, 2), np.float32), name="tree_a")}
    assert len(params["a"].shards) == 2
    sgd = opt.SGD(0.5, momentum=0.5, name="tree")
    sgd.apply_gradients({"a": np.ones((4, 2), np.float32)}, params)
    np.testing.assert_allclose(params["a"].read_value(), 0.5)
    # A pickled optimizer (as a closure on a worker captures it) applies the same rule.
    clone = cloudpickle.loads(cloudpickle.dumps(sgd))
    clone.apply_gradients([(np.ones((4, 2), np.float32), params["a"])])
    # trace 1.5 on the second step: 0.5 - 0.75.
    np.testing.assert_allclose(params["a"].read_value(), -0.25)
    assert sgd.iterations(params["a"]) == 2


def test_concurrent_writers_lose_no_update(cluster: LocalCluster) -> None:
    """8 threads x 25 Adam steps of the same gradient: every step lands (count 200), and the
    moments equal the sequential ones (identical gradients make the order irrelevant); a
    non-atomic read-modify-write would lose counts and moment updates."""
    with strategy_for(cluster).scope() as strategy:
        w = strategy.Variable(np.zeros(16, np.float32), name="contended")
    adam = opt.Adam(0.001, name="contended_adam")
    grad = np.linspace(-1, 1, 16).astype(np.float32)

    def worker() -> None:
        for _ in range(25):
            adam.apply_gradients([(grad, w)])

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reference = optax.adam(0.001, eps=1e-7)
    params = np.zeros(16, np.float32)
    state = reference.init(params)
    for _ in range(200):
        updates, state = reference.update(grad, state, params)
        params = np.asarray(optax.apply_updates(params, updates))
    assert adam.iterations(w) == 200
    np.testing.assert_allclose(w.read_value(), params, rtol=1e-5, atol=1e-6)


def test_schedules_must_be_data_and_specs_are_checked() -> None:
    with pytest.raises(TypeError, match="must be data"):
        opt.SGD(lambda step: 0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="momentum"):
        opt.SGD(0.1, momentum=1.5)
    with pytest.raises(ValueError, match="one value more"):
        opt.SGD(opt.PiecewiseConstantDecay([1, 2], [0.1]))


def test_slots_are_saved_and_restored_with_their_variable(
    cluster: LocalCluster, tmp_path: Any
) -> None:
    strategy = strategy_for(cluster, FixedShardsPartitioner(2))
    with strategy.scope():
        w = strategy.Variable(np.ones((4, 2), np.float32), name="saved")
    adam = opt.Adam(0.1, name="saved_adam")
    adam.build([w], strategy)
    names = {v.name for v in strategy.variables}
    assert {"saved/saved_adam/m", "saved/saved_adam/v"} <= names
    adam.apply_gradients([(np.ones((4, 2), np.float32), w)])
    before = {v.name: v.read_value() for v in strategy.variables}
    strategy.save(tmp_path / "ckpt")
    adam.apply_gradients([(np.full((4, 2), 3.0, np.float32), w)])
    assert adam.iterations(w) == 2
    strategy.restore(tmp_path / "ckpt")
    for variable in strategy.variables:
        np.testing.assert_array_equal(variable.read_value(), before[variable.name])
    assert adam.iterations(w) == 1
    # The restored optimizer continues as an uninterrupted one would.
    adam.apply_gradients([(np.full((4, 2), 3.0, np.float32), w)])
    reference = optax.adam(0.1, eps=1e-7)
    params = np.ones((4, 2), np.float32)
    state = reference.init(params)
    for g in (1.0, 3.0):
        grad = np.full((4, 2), g, np.float32)
        updates, state = reference.update(grad, state, params)
        params = np.asarray(optax.apply_updates(params, updates))
    np.testing.assert_allclose(w.read_value(), params, rtol=1e-6, atol=1e-6)


def _bytes_written(cluster: LocalCluster) -> int:
    from jaxcluster._native import core

    total = 0
    for address in cluster.ps_addresses:
        client = core.PsClient(address, auth_token=cluster.auth_token)
        total += int(client.get_status()["bytes_written"])
    return total


@pytest.mark.parametrize("compression", ["bf16", "int8"])
def test_compressed_gradients_are_widened_on_the_ps(
    cluster: LocalCluster, compression: str
) -> None:
    import ml_dtypes

    with strategy_for(cluster).scope() as strategy:
        w = strategy.Variable(np.zeros(1024, np.float32), name=f"compressed_{compression}")
    sgd = opt.SGD(1.0, name=f"c_{compression}")
    grad = np.random.default_rng(7).normal(size=1024).astype(np.float32)
    before = _bytes_written(cluster)
    sgd.apply_gradients([(grad, w)], compression=compression)
    sent = _bytes_written(cluster) - before
    if compression == "bf16":
        expected = -grad.astype(ml_dtypes.bfloat16).astype(np.float32)
        assert sent == 2 * 1024
    else:
        scale = np.abs(grad).max() / 127.0
        expected = -(np.clip(np.rint(grad / scale), -127, 127) * scale).astype(np.float32)
        assert sent == 1024
    np.testing.assert_allclose(w.read_value(), expected, rtol=1e-6, atol=1e-7)
    # Close to the uncompressed update, within the format's precision.
    np.testing.assert_allclose(w.read_value(), -grad, atol=np.abs(grad).max() / 100)
    with pytest.raises(ValueError, match="compression"):
        sgd.apply_gradients([(grad, w)], compression="fp8")


def test_a_closure_on_a_worker_applies_gradients(cluster: LocalCluster) -> None:
    from jaxcluster import wire
    from jaxcluster._native import core
    from jaxcluster.coordinator import functions

    with strategy_for(cluster).scope() as strategy:
        w = strategy.Variable(np.zeros(3, np.float32), name="from_worker")
    sgd = opt.SGD(0.5, momentum=0.5, name="worker_sgd")

    def step() -> int:
        sgd.apply_gradients([(np.ones(3, np.float32), w)])
        return sgd.iterations(w)

    client = core.WorkerClient(cluster.addresses[0], auth_token=cluster.auth_token)
    payload = functions.pickle_function(step)
    client.register_function(payload.function_hash, payload.kind, payload.payload)
    encoded = wire.encode(((), {}))
    reply = client.run_closure(payload.function_hash, encoded.pickle, encoded.buffers, timeout=120)
    assert reply["error"] is None
    assert wire.decode(reply["value"], reply["buffers"]) == 1
    sgd.apply_gradients([(np.ones(3, np.float32), w)])  # and the coordinator continues it
    np.testing.assert_allclose(w.read_value(), -0.5 - 0.75)


def test_gradients_of_every_kind_update_alike(cluster: LocalCluster) -> None:
    """numpy gradients (lent to the call, not copied), jax.Arrays, casts and lists update
    their variables alike, sharded or not, and a lent gradient is left as it was."""
    import jax.numpy as jnp

    rng = np.random.default_rng(7)
    grads = [rng.normal(size=(4, 3)).astype(np.float32) for _ in range(5)]
    kept = [g.copy() for g in grads]
    kinds = {
        "numpy": lambda g: g,
        "jax": jnp.asarray,
        "float64": lambda g: g.astype(np.float64),
        "list": lambda g: g.tolist(),
    }
    strategy = strategy_for(cluster, FixedShardsPartitioner(2))
    with strategy.scope():
        ws = {k: strategy.Variable(np.zeros((4, 3), np.float32), name=f"kinds_{k}") for k in kinds}
    adam = opt.Adam(0.01, name="kinds")
    for g in grads:
        for kind, make in kinds.items():
            adam.apply_gradients([(make(g), ws[kind])])
    for kind in kinds:
        np.testing.assert_array_equal(ws[kind].read_value(), ws["numpy"].read_value(), kind)
    assert np.abs(ws["numpy"].read_value()).min() > 0  # updated at all
    for g, before in zip(grads, kept, strict=True):
        np.testing.assert_array_equal(g, before)


def test_weight_decay_is_decoupled_and_comes_before_the_step(cluster: LocalCluster) -> None:
    """Keras's order for every rule: ``param -= lr * weight_decay * param`` from the
    parameter as it was, then the rule's step on the gradient alone (SGD's momentum trace
    and RMSprop's averages never see the decay)."""
    rng = np.random.default_rng(7)
    start = rng.normal(size=6).astype(np.float32)
    with strategy_for(cluster).scope() as strategy:
        w = strategy.Variable(start, name="decayed")
        r = strategy.Variable(start, name="decayed_rms")
    sgd = opt.SGD(0.1, momentum=0.9, weight_decay=0.05, name="decayed")
    rms = opt.RMSprop(0.01, weight_decay=0.2, name="decayed_rms")
    params, trace = start.astype(np.float64), np.zeros(6)
    rms_params, nu = start.astype(np.float64), np.zeros(6)
    for _ in range(20):
        grad = rng.normal(size=6).astype(np.float32)
        sgd.apply_gradients([(grad, w)])
        rms.apply_gradients([(grad, r)])
        params -= 0.1 * 0.05 * params
        trace = grad + 0.9 * trace
        params -= 0.1 * trace
        rms_params -= 0.01 * 0.2 * rms_params
        nu = 0.9 * nu + 0.1 * grad.astype(np.float64) ** 2
        rms_params -= 0.01 * grad / np.sqrt(nu + 1e-7)
    np.testing.assert_allclose(w.read_value(), params, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(r.read_value(), rms_params, rtol=1e-5, atol=1e-5)


def test_global_clipnorm_spans_every_gradient_of_one_call(cluster: LocalCluster) -> None:
    with strategy_for(cluster).scope() as strategy:
        a = strategy.Variable(np.zeros(2, np.float32), name="clip_a")
        b = strategy.Variable(np.zeros(2, np.float32), name="clip_b")
    sgd = opt.SGD(1.0, global_clipnorm=1.0, name="clipped")
    # The global norm is 5 (3-4-0-0): both gradients shrink by 5, neither alone is clipped
    # to 1.
    sgd.apply_gradients(
        {"a": np.array([3, 0], np.float32), "b": np.array([0, 4], np.float32)}, {"a": a, "b": b}
    )
    np.testing.assert_allclose(a.read_value(), [-0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(b.read_value(), [0.0, -0.8], rtol=1e-6)
    # A pickled optimizer (a closure on a worker) keeps its clipping.
    clone = cloudpickle.loads(cloudpickle.dumps(sgd))
    clone.apply_gradients([(np.array([30, 0], np.float32), a)])
    np.testing.assert_allclose(a.read_value(), [-1.6, 0.0], rtol=1e-6)


def test_kerass_arguments_are_checked_and_what_the_ps_cannot_do_is_refused() -> None:
    with pytest.raises(ValueError, match="only one of clipnorm, clipvalue and global_clipnorm"):
        opt.SGD(clipnorm=1.0, clipvalue=0.5)
    with pytest.raises(ValueError, match="clipnorm=-1"):
        opt.Adam(clipnorm=-1)
    with pytest.raises(ValueError, match="weight_decay"):
        opt.RMSprop(weight_decay=float("nan"))
    with pytest.raises(NotImplementedError, match="use_ema=True"):
        opt.Adam(use_ema=True)
    with pytest.raises(NotImplementedError, match="gradient_accumulation_steps"):
        opt.AdamW(gradient_accumulation_steps=4)
    # Keras's defaults are accepted as they are.
    adam = opt.Adam(amsgrad=False, use_ema=False, ema_momentum=0.99, loss_scale_factor=None)
    assert [slot for slot, _ in adam.spec.slots()] == ["m", "v"]
    assert [slot for slot, _ in opt.Adam(amsgrad=True).spec.slots()] == ["m", "v", "v_max"]
