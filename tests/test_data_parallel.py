"""Plumbing (hand-written): tests for dsml.data_parallel — synchronous data-parallel SGD (week 3,
section 4).

The independent reference is one process training on the whole global batch: `reference_training`
below (loss_and_grads and optimizer.step, nothing else), which `train_single` must reproduce
exactly. Against it:
- p ranks (1–5 on the simulator, 2–3 on threads, 2 on processes) give the same parameters after
  every step and the same losses, for SGD, momentum and Adam, both losses, every all-reduce
  algorithm, global batches divisible by p, not divisible, and smaller than p (empty shards);
- every rank ends every step with bit-identical parameters, and frozen parameters never change;
- shard_bounds cuts as np.array_split does, and flatten/unflatten round-trip exactly;
- bad input fails with an error that names what went wrong: a non-finite value in the data (the
  step and a parameter), ranks whose models differ in shape (the ranks and the shapes), an empty
  global batch.

The tolerance is relative, 1e-12: ranks add their shard sums in a different order than one
process adds a whole batch, so the last bits differ — nothing more. Everything is seeded.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsml
from dsml import RankError
from dsml.collectives import ALLREDUCE_ALGORITHMS
from dsml.data_parallel import (data_parallel_sgd, flatten, shard_bounds, train_single,
                                unflatten)
from dsml.train import MLP, gaussian_mixture, loss_and_grads, make_optimizer, teacher
from leaks import nothing_left_behind  # noqa: F401

NET = dsml.net.AlphaBeta(1e-6, 1e-9)
TIMEOUT = 60.0                 # s: real engines
TOLERANCE = 1e-12              # relative: the same sums in another order (worst seen ≈ 1e-15)
SIZES = (4, 8, 3)              # the classifier: 4 inputs, 8 hidden ReLUs, 3 classes
REGRESSION_SIZES = (3, 6, 2)   # the regressor (MSE): 3 inputs, 6 hidden tanh units, 2 outputs
SEED = 5
# Global batch sizes, one per step: 12 is divisible by 2, 3 and 4; 10 by 2 and 5; 5 by 5;
# 7 by none; 3, 2 and 1 are smaller than most rank counts, so some shards are empty.
BATCH_SIZES = (12, 7, 3, 1, 10, 5, 2, 8)
OPTIMIZERS = {"sgd": (0.1, {}), "momentum": (0.1, {}), "adam": (0.01, {}),
              # weight decay moves a parameter even when its gradient is 0: a frozen parameter
              # must get no gradient at all, not a zero one
              "decayed momentum": (0.1, {"momentum": 0.9, "weight_decay": 0.01}),
              "decayed adam": (0.01, {"weight_decay": 0.01})}
EQUIVALENCE_OPTIMIZERS = ["sgd", "momentum", "adam"]
PARAM_NAME = re.compile(r"layer\d+\.(weight|bias)")
# The all-reduce's mismatch check: "rank R received shape S D from rank Q, expected shape S' D'".
MISMATCH = re.compile(r"rank (\d+) received shape (\(.*?\)) (\w+) from rank (\d+), expected "
                      r"shape (\(.*?\)) (\w+)")


# --- problems and the reference ---------------------------------------------------------------

def classification(n: int = 60):
    """(X (n, 4), y (n,) labels 0..2) from three Gaussian blobs."""
    return gaussian_mixture(n, classes=SIZES[-1], dim=SIZES[0], seed=SEED)


def regression(n: int = 60):
    """(X (n, 3), Y (n, 2)) from a random tanh teacher."""
    return teacher(n, sizes=REGRESSION_SIZES, seed=SEED)


def global_batches(n: int, sizes=BATCH_SIZES, seed: int = SEED):
    """Index arrays of the given sizes cut from one seeded shuffle of range(n)."""
    order = np.random.default_rng(seed).permutation(n)
    cuts = np.cumsum(sizes)[:-1]
    assert sum(sizes) <= n
    return np.split(order[:sum(sizes)], cuts)


def build(sizes, optimizer, frozen=(), activation="relu"):
    """A fresh model and optimizer, the same on every rank (same seed)."""
    model = MLP(sizes, activation=activation, seed=SEED)
    model.frozen = set(frozen)
    lr, hyper = OPTIMIZERS[optimizer]
    return model, make_optimizer(optimizer.split()[-1], lr, **hyper)


def snapshot(params) -> dict:
    return {name: value.copy() for name, value in params.items()}


def reference_training(sizes, optimizer, X, y, batches, loss="cross_entropy", frozen=(),
                       activation="relu"):
    """One process, whole batches: (parameters after each step, losses)."""
    model, opt = build(sizes, optimizer, frozen, activation)
    history, losses = [], []
    for batch in batches:
        value, grads = loss_and_grads(model, X[batch], y[batch], loss)
        opt.step(model.params, grads)
        history.append(snapshot(model.params))
        losses.append(value)
    return history, losses


def relative_error(actual, expected) -> float:
    """‖actual − expected‖ / ‖expected‖ (absolute error when expected is 0)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    scale = float(np.linalg.norm(expected))
    error = float(np.linalg.norm(actual - expected))
    return error / scale if scale > 0 else error


def assert_close(actual, expected, what: str):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (
        f"{what}: shape {actual.shape}, expected {expected.shape}")
    assert np.all(np.isfinite(actual)), f"{what}: contains NaN or inf"
    error = relative_error(actual, expected)
    assert error < TOLERANCE, (
        f"{what}: relative error {error:.3g} ≥ {TOLERANCE:g} against one process training on "
        f"the whole batch\n got      {actual.ravel()[:5]}…\n expected {expected.ravel()[:5]}…")


# --- rank programs ----------------------------------------------------------------------------

def step_by_step(comm, sizes, optimizer, X, y, batches, loss="cross_entropy",
                 algorithm="ring", frozen=(), activation="relu"):
    """Train one global batch per call, keeping the parameters after every step."""
    model, opt = build(sizes, optimizer, frozen, activation)
    history, losses = [], []
    for batch in batches:
        losses += (yield from data_parallel_sgd(comm, model, opt, X, y, [batch], loss=loss,
                                                algorithm=algorithm))
        history.append(snapshot(model.params))
    return history, losses


def all_at_once(comm, sizes, optimizer, X, y, batches, loss="cross_entropy",
                algorithm="ring", frozen=(), hidden_on=None):
    """Train on every batch in one call; `hidden_on` = {rank: width} gives a rank its own
    (wrong) hidden width."""
    if hidden_on and comm.rank in hidden_on:
        sizes = (sizes[0], hidden_on[comm.rank], sizes[-1])
    model, opt = build(sizes, optimizer, frozen)
    losses = yield from data_parallel_sgd(comm, model, opt, X, y, batches, loss=loss,
                                          algorithm=algorithm)
    return snapshot(model.params), losses


def run(engine, program, p, args=(), kwargs=None):
    if engine == "sim":
        return dsml.run(program, p, network=NET, args=args, kwargs=kwargs)
    return dsml.run(program, p, engine=engine, args=args, kwargs=kwargs, timeout=TIMEOUT)


def assert_matches_reference(values, reference, reference_losses, frozen=None):
    """Every rank: parameters after every step close to the reference, losses close; all ranks
    bit-identical to rank 0; `frozen` ({name: initial value}) unchanged bit for bit."""
    frozen = frozen or {}
    history0, losses0 = values[0]
    for rank, (history, losses) in enumerate(values):
        assert len(history) == len(reference), f"rank {rank}: {len(history)} steps"
        assert len(losses) == len(reference_losses), (
            f"rank {rank}: {len(losses)} losses for {len(reference_losses)} steps")
        for step, (params, expected) in enumerate(zip(history, reference)):
            assert list(params) == list(expected), f"rank {rank}: parameter names {list(params)}"
            for name in expected:
                assert_close(params[name], expected[name], f"rank {rank}, step {step}, {name}")
                assert np.array_equal(params[name], history0[step][name]), (
                    f"step {step}: rank {rank}'s {name} differs from rank 0's; every rank must "
                    f"end every step with bit-identical parameters")
            for name, initial in frozen.items():
                assert np.array_equal(params[name], initial), (
                    f"rank {rank}, step {step}: frozen {name} changed")
        assert_close(losses, reference_losses, f"rank {rank}, losses")
        assert list(losses) == list(losses0), (
            f"rank {rank}'s losses differ from rank 0's: {losses} vs {losses0}")


# --- shard_bounds -----------------------------------------------------------------------------

@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 6, 7, 12, 13])
def test_shard_bounds_cut_as_array_split_does(n, p):
    expected = np.array_split(np.arange(n), p)
    bounds = [shard_bounds(n, p, rank) for rank in range(p)]
    for rank, ((start, stop), piece) in enumerate(zip(bounds, expected)):
        assert list(range(start, stop)) == piece.tolist(), (
            f"shard_bounds({n}, {p}, {rank}) = ({start}, {stop}); np.array_split gives "
            f"{piece.tolist()}")


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 2000), p=st.integers(1, 64))
def test_shard_bounds_cover_every_example_once(n, p):
    bounds = [shard_bounds(n, p, rank) for rank in range(p)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n, f"n={n}, p={p}: {bounds}"
    for (_, stop), (start, _) in zip(bounds, bounds[1:]):
        assert stop == start, f"n={n}, p={p}: gap or overlap in {bounds}"
    sizes = [stop - start for start, stop in bounds]
    assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1, f"n={n}, p={p}: sizes {sizes}"
    assert sizes == sorted(sizes, reverse=True), f"the longer shards come first: {sizes}"


# --- flatten / unflatten ----------------------------------------------------------------------

def test_flatten_puts_gradients_in_forward_order_and_unflatten_restores_them_exactly():
    X, y = classification()
    model = MLP([4, 5, 6, 3], seed=SEED)
    _, grads = loss_and_grads(model, X[:9], y[:9])
    vector, layout = flatten(grads)
    assert vector.ndim == 1 and vector.dtype == np.float64
    assert vector.size == sum(g.size for g in grads.values())
    assert [(name, tuple(shape)) for name, shape in layout] == \
        [(name, g.shape) for name, g in grads.items()]
    assert np.array_equal(vector, np.concatenate([g.ravel() for g in grads.values()])), \
        "the vector is the gradients, raveled, one after the other in forward order"
    back = unflatten(vector, layout)
    assert list(back) == list(grads)
    for name in grads:
        assert back[name].shape == grads[name].shape and np.array_equal(back[name], grads[name])


@pytest.mark.parametrize("shapes", [
    {},                                                     # every parameter frozen
    {"only": (1,)},
    {"a": (2, 3), "b": (3,), "c": (1, 1), "d": (4, 1, 2)},
    {"empty": (0, 4), "after": (2,)},                       # zero-size arrays keep their place
], ids=["none", "one", "mixed", "zero-size"])
def test_flatten_unflatten_round_trip(shapes):
    rng = np.random.default_rng(SEED)
    grads = {name: rng.standard_normal(shape) for name, shape in shapes.items()}
    vector, layout = flatten(grads)
    assert vector.shape == (sum(g.size for g in grads.values()),)
    back = unflatten(vector, layout)
    assert list(back) == list(grads)
    for name, g in grads.items():
        assert back[name].shape == g.shape and np.array_equal(back[name], g), name


# --- the reference itself ---------------------------------------------------------------------

@pytest.mark.parametrize("optimizer", EQUIVALENCE_OPTIMIZERS)
def test_train_single_is_one_process_training_on_whole_batches(optimizer):
    X, y = classification()
    batches = global_batches(len(X))
    reference, reference_losses = reference_training(SIZES, optimizer, X, y, batches)
    model, opt = build(SIZES, optimizer)
    losses = train_single(model, opt, X, y, batches)
    assert list(losses) == reference_losses
    for name, value in reference[-1].items():
        assert np.array_equal(model.params[name], value), name


# --- equivalence: p ranks with global batch b = one process with batch b ----------------------

@pytest.mark.parametrize("optimizer", EQUIVALENCE_OPTIMIZERS)
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
def test_p_ranks_train_as_one_process_on_sim(p, optimizer):
    X, y = classification()
    batches = global_batches(len(X))
    reference, reference_losses = reference_training(SIZES, optimizer, X, y, batches)
    values = run("sim", step_by_step, p, args=(SIZES, optimizer, X, y, batches)).values
    assert_matches_reference(values, reference, reference_losses)


@pytest.mark.parametrize("optimizer", EQUIVALENCE_OPTIMIZERS)
@pytest.mark.parametrize("p", [2, 3])
def test_p_ranks_train_as_one_process_on_threads(p, optimizer):
    X, y = classification()
    batches = global_batches(len(X))
    reference, reference_losses = reference_training(SIZES, optimizer, X, y, batches)
    values = run("threads", step_by_step, p, args=(SIZES, optimizer, X, y, batches)).values
    assert_matches_reference(values, reference, reference_losses)


def test_two_ranks_train_as_one_process_on_processes():
    X, y = classification()
    batches = global_batches(len(X))
    reference, reference_losses = reference_training(SIZES, "adam", X, y, batches)
    values = run("processes", step_by_step, 2, args=(SIZES, "adam", X, y, batches)).values
    assert_matches_reference(values, reference, reference_losses)


@pytest.mark.parametrize("algorithm", ALLREDUCE_ALGORITHMS)
def test_every_allreduce_algorithm_gives_the_same_training(algorithm):
    X, y = classification()
    batches = global_batches(len(X))
    reference, reference_losses = reference_training(SIZES, "momentum", X, y, batches)
    values = run("sim", step_by_step, 3, args=(SIZES, "momentum", X, y, batches),
                 kwargs={"algorithm": algorithm}).values
    assert_matches_reference(values, reference, reference_losses)


@pytest.mark.parametrize("p", [2, 5])
def test_mean_squared_error_trains_as_one_process(p):
    """MSE's mean runs over rows and outputs; shard size × shard mean must still add up."""
    X, Y = regression()
    batches = global_batches(len(X))
    reference, reference_losses = reference_training(REGRESSION_SIZES, "adam", X, Y, batches,
                                                     loss="mse", activation="tanh")
    values = run("sim", step_by_step, p, args=(REGRESSION_SIZES, "adam", X, Y, batches),
                 kwargs={"loss": "mse", "activation": "tanh"}).values
    assert_matches_reference(values, reference, reference_losses)


@pytest.mark.parametrize("frozen", [("layer0.weight",), ("layer1.bias",),
                                    ("layer0.weight", "layer0.bias", "layer1.weight",
                                     "layer1.bias")],
                         ids=["first-weight", "last-bias", "everything"])
@pytest.mark.parametrize("optimizer", ["decayed momentum", "decayed adam"])
def test_frozen_parameters_never_change(frozen, optimizer):
    X, y = classification()
    batches = global_batches(len(X))
    reference, reference_losses = reference_training(SIZES, optimizer, X, y, batches,
                                                     frozen=frozen)
    values = run("sim", step_by_step, 3, args=(SIZES, optimizer, X, y, batches),
                 kwargs={"frozen": frozen}).values
    initial = MLP(SIZES, seed=SEED).params
    assert_matches_reference(values, reference, reference_losses,
                             frozen={name: initial[name] for name in frozen})


@pytest.mark.parametrize("p", [1, 4])
def test_one_call_over_all_batches_is_the_same_as_one_call_per_batch(p):
    """The generator keeps no state of its own between steps: all of it is in the model and
    the optimizer."""
    X, y = classification()
    batches = global_batches(len(X))
    one_by_one = run("sim", step_by_step, p, args=(SIZES, "adam", X, y, batches)).values
    whole = run("sim", all_at_once, p, args=(SIZES, "adam", X, y, batches)).values
    for rank in range(p):
        (history, step_losses), (params, losses) = one_by_one[rank], whole[rank]
        assert list(losses) == list(step_losses), f"rank {rank}"
        for name, value in history[-1].items():
            assert np.array_equal(params[name], value), f"rank {rank}, {name}"


def test_the_data_is_not_changed():
    X, y = classification()
    X_before, y_before = X.copy(), y.copy()
    run("sim", all_at_once, 3, args=(SIZES, "sgd", X, y, global_batches(len(X))))
    assert np.array_equal(X, X_before) and np.array_equal(y, y_before)


# --- bad input --------------------------------------------------------------------------------

def data_with_inf_at_step(step: int, p: int):
    """Classification data with an inf in one example of global batch `step`, in the shard of
    the last rank (so that rank 0's own gradients stay finite: only the all-reduce spreads it)."""
    X, y = classification()
    batches = global_batches(len(X))
    last_shard = np.array_split(batches[step], p)[-1]
    X = X.copy()
    X[last_shard[0], 1] = np.inf
    return X, y, batches


def assert_names_step_and_parameter(message: str, step: int):
    assert re.search(rf"\bstep {step}\b", message), (
        f"the error should name the step (0-based) {step}: {message}")
    assert not re.search(rf"\bstep (?!{step}\b)\d+", message), (
        f"the error names another step: {message}")
    assert PARAM_NAME.search(message), f"the error should name a parameter: {message}"
    assert "non-finite" in message, message


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("p", [1, 3])
def test_a_non_finite_value_in_the_data_names_the_step_and_a_parameter_on_sim(p):
    X, y, batches = data_with_inf_at_step(2, p)
    with pytest.raises(RankError) as info:
        run("sim", all_at_once, p, args=(SIZES, "sgd", X, y, batches))
    cause = info.value.__cause__
    assert isinstance(cause, FloatingPointError), f"caused by {cause!r}"
    assert_names_step_and_parameter(str(cause), 2)
    assert_names_step_and_parameter(str(info.value), 2)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_a_non_finite_value_in_the_data_is_named_on_threads():
    X, y, batches = data_with_inf_at_step(2, 2)
    with pytest.raises(RankError) as info:
        run("threads", all_at_once, 2, args=(SIZES, "sgd", X, y, batches))
    message = str(info.value)
    assert "FloatingPointError" in message, message
    assert_names_step_and_parameter(message, 2)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_a_non_finite_loss_with_every_parameter_frozen_names_the_step_and_the_loss():
    """No gradient to blame: the loss itself is the non-finite value."""
    X, y, batches = data_with_inf_at_step(2, 3)
    everything = tuple(MLP(SIZES, seed=SEED).params)
    with pytest.raises(RankError) as info:
        run("sim", all_at_once, 3, args=(SIZES, "sgd", X, y, batches),
            kwargs={"frozen": everything})
    cause = info.value.__cause__
    assert isinstance(cause, FloatingPointError), f"caused by {cause!r}"
    assert re.search(r"\bstep 2\b", str(cause)) and "loss" in str(cause), str(cause)


@pytest.mark.parametrize("bad_rank", [0, 2])
def test_ranks_whose_models_differ_in_shape_are_named_with_the_shapes(bad_rank):
    X, y = classification()
    batches = global_batches(len(X))
    with pytest.raises(RankError) as info:
        run("sim", all_at_once, 3, args=(SIZES, "sgd", X, y, batches),
            kwargs={"hidden_on": {bad_rank: SIZES[1] + 1}})
    message = str(info.value)
    assert isinstance(info.value.__cause__, ValueError), f"caused by {info.value.__cause__!r}"
    found = MISMATCH.search(message)
    assert found, f"no 'rank R received shape … from rank S, expected shape …' in: {message}"
    receiver, got_shape, _, sender, want_shape, _ = found.groups()
    assert bad_rank in (int(receiver), int(sender)), (
        f"the mismatch should involve rank {bad_rank}: {message}")
    assert got_shape != want_shape, message


@pytest.mark.parametrize("p", [1, 3])
@pytest.mark.parametrize("position", [0, 1])
def test_an_empty_global_batch_is_a_value_error(p, position):
    X, y = classification()
    batches = global_batches(len(X), sizes=(5, 4))
    batches.insert(position, np.array([], dtype=np.int64))
    with pytest.raises(RankError) as info:
        run("sim", all_at_once, p, args=(SIZES, "sgd", X, y, batches))
    assert isinstance(info.value.__cause__, ValueError), f"caused by {info.value.__cause__!r}"
    assert "empty" in str(info.value).lower(), str(info.value)


# --- DDP's bookkeeping: initial broadcast, distributed sampler, uneven inputs (Join) ----------

from dsml.data_parallel import broadcast_parameters, distributed_indices, join_sgd  # noqa: E402
from dsml.train import digits  # noqa: E402


@pytest.mark.parametrize("n, world", [(1, 1), (1, 3), (10, 3), (12, 4), (7, 8), (1348, 3)])
def test_sampler_covers_the_data_once_per_epoch_plus_padding(n, world):
    for epoch in range(3):
        shards = [distributed_indices(n, world, r, epoch, seed=5) for r in range(world)]
        assert len({len(s) for s in shards}) == 1                  # equal shards: no rank waits
        seen = np.concatenate(shards)
        total = -(-n // world) * world
        assert len(seen) == total and set(seen.tolist()) == set(range(n))
        counts = np.bincount(seen, minlength=n)
        assert counts.min() >= 1 and counts.sum() - n == total - n  # only the padding repeats
        if n % world == 0:
            assert np.all(counts == 1)                              # a partition


def test_sampler_reshuffles_per_epoch_and_agrees_across_ranks():
    a = [distributed_indices(100, 4, r, epoch=0, seed=1) for r in range(4)]
    b = [distributed_indices(100, 4, r, epoch=1, seed=1) for r in range(4)]
    assert not all(np.array_equal(x, y) for x, y in zip(a, b))
    assert np.array_equal(np.sort(np.concatenate(a)), np.arange(100))   # same permutation
    assert np.array_equal(distributed_indices(10, 2, 1, 0, shuffle=False), [1, 3, 5, 7, 9])


def test_sampler_drop_last_and_bad_input():
    shards = [distributed_indices(10, 3, r, 0, drop_last=True) for r in range(3)]
    assert [len(s) for s in shards] == [3, 3, 3] and len(set(np.concatenate(shards))) == 9
    with pytest.raises(ValueError, match="rank=3"):
        distributed_indices(10, 3, 3, 0)


def _uneven_program(comm, counts, join):
    X, y, _, _ = digits(seed=1)
    model = MLP([64, 8, 10], seed=comm.rank)
    optimizer = make_optimizer("momentum", 0.05)
    yield from broadcast_parameters(comm, model)
    mine = [distributed_indices(len(X), comm.size, comm.rank, e, seed=2)[:16]
            for e in range(counts[comm.rank])]
    if join:
        yield from join_sgd(comm, model, optimizer, X, y, mine)
    else:
        yield from data_parallel_sgd(comm, model, optimizer, X, y, [m for m in mine])
    return model.params


@pytest.mark.parametrize("engine", ["sim", "threads"])
@pytest.mark.parametrize("counts", [[3, 3], [4, 1, 2], [0, 2, 1, 2]])
def test_join_sgd_equals_one_process_on_each_steps_union(engine, counts):
    p = len(counts)
    network = dsml.net.AlphaBeta(5e-6, 1e-9) if engine == "sim" else None
    values = dsml.run(_uneven_program, p, engine=engine, network=network,
                      args=(counts, True)).values
    X, y, _, _ = digits(seed=1)
    reference = MLP([64, 8, 10], seed=0)          # rank 0's weights, broadcast
    steps = [np.concatenate([distributed_indices(len(X), p, r, e, seed=2)[:16]
                             for r in range(p) if e < counts[r]]) for e in range(max(counts))]
    train_single(reference, make_optimizer("momentum", 0.05), X, y, steps)
    for params in values:
        for name, w in reference.params.items():
            assert np.array_equal(params[name], values[0][name])      # bit-identical ranks
            assert np.allclose(params[name], w, rtol=1e-12, atol=1e-14)


def test_uneven_inputs_without_join_hang():
    # Plain data parallelism with a different number of batches per rank: the rank with more
    # batches waits in an all-reduce its finished partners never join; the simulator says so.
    with pytest.raises(dsml.DeadlockError, match="deadlock"):
        dsml.run(_uneven_program, 2, network=dsml.net.AlphaBeta(5e-6, 1e-9),
                 args=([3, 2], False))


@pytest.mark.parametrize("engine", ["sim", "threads"])
def test_broadcast_parameters_makes_replicas_equal(engine):
    def program(comm):
        model = MLP([5, 4, 3], seed=10 + comm.rank)
        yield from broadcast_parameters(comm, model, root=1)
        return model.params
    network = dsml.net.AlphaBeta(5e-6, 1e-9) if engine == "sim" else None
    values = dsml.run(program, 3, engine=engine, network=network).values
    root = MLP([5, 4, 3], seed=11).params
    assert all(np.array_equal(v[k], root[k]) for v in values for k in root)
