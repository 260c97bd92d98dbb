"""DDP's bucketed all-reduce (week 3, section 10): buckets as PyTorch assigns them, training
equal to plain data parallelism on every engine, the simulated iteration time equal to the α–β
recurrence of buckets queued behind backward, and clear errors for gradients that do not fit
the buckets."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsml
from dsml import RankError
from dsml.collectives import cost
from dsml.comm.api import SizeOnly
from dsml.data_parallel import (LOSS, SLICE_SECONDS, assign_buckets, compute_sharing, ddp_allreduce,
                                ddp_sgd)
from dsml.net import presets
from dsml.train import MLP
from leaks import nothing_left_behind  # noqa: F401
from test_data_parallel import (NET, SIZES, TIMEOUT, assert_matches_reference, build,
                                classification, global_batches, reference_training, snapshot)

INF = float("inf")


# --- the MLP hands over its gradients one at a time ------------------------------------------

@pytest.mark.parametrize("frozen", [(), ("layer1.weight", "layer0.bias")])
def test_backward_layers_gives_backwards_gradients_last_layer_first(frozen):
    model = MLP([5, 7, 6, 3], seed=1)
    model.frozen = set(frozen)
    X = np.random.default_rng(2).standard_normal((9, 5))
    dout = np.random.default_rng(3).standard_normal((9, 3))
    model.forward(X)
    whole = model.backward(dout)
    one_by_one = list(model.backward_layers(dout))
    names = [name for name, _ in one_by_one]
    assert names == _backward_order(model, frozen)
    assert sorted(names) == sorted(whole)
    for name, gradient in one_by_one:
        assert np.array_equal(gradient, whole[name]), name


def _backward_order(model, frozen):
    """Layer by layer from the last; within a layer the weight, then the bias."""
    order = []
    for i in reversed(range(model.layers)):
        order += [n for n in (f"layer{i}.weight", f"layer{i}.bias") if n not in frozen]
    return order


# --- assign_buckets ---------------------------------------------------------------------------

SIZES_FWD = [("a", 100), ("b", 40), ("c", 300), ("d", 10), ("e", 50)]


@pytest.mark.parametrize("cap, expected", [
    (0, [["e"], ["d"], ["c"], ["b"], ["a"]]),              # one bucket per gradient
    (INF, [["e", "d", "c", "b", "a"]]),                      # one bucket
    (60, [["e", "d"], ["c"], ["b", "a"]]),                   # closes once it holds ≥ cap
    (350, [["e", "d", "c"], ["b", "a"]]),                    # the last bucket may be short
    (360, [["e", "d", "c"], ["b", "a"]]),
    (361, [["e", "d", "c", "b"], ["a"]]),
])
def test_assign_buckets_fills_in_backward_order_until_the_cap(cap, expected):
    assert assign_buckets(SIZES_FWD, cap) == expected


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 1000), min_size=0, max_size=30),
       cap=st.floats(0, 5000, allow_nan=False))
def test_assign_buckets_partitions_in_reverse_and_respects_the_cap(sizes, cap):
    named = [(f"p{i}", n) for i, n in enumerate(sizes)]
    buckets = assign_buckets(named, cap)
    assert [n for bucket in buckets for n in bucket] == [n for n, _ in reversed(named)]
    nbytes = dict(named)
    for k, bucket in enumerate(buckets):
        assert bucket, "no empty bucket"
        held = sum(nbytes[n] for n in bucket)
        if k < len(buckets) - 1:
            assert held >= cap                          # closed because it reached the cap
        assert held - nbytes[bucket[-1]] < cap or len(bucket) == 1   # not a gradient later


@pytest.mark.parametrize("cap", [-1, float("nan")])
def test_assign_buckets_refuses_a_negative_or_nan_cap(cap):
    with pytest.raises(ValueError, match="bucket cap must be ≥ 0"):
        assign_buckets(SIZES_FWD, cap)


# --- training: DDP = plain data parallelism ---------------------------------------------------

def ddp_step_by_step(comm, optimizer, X, y, batches, cap, overlap, frozen=()):
    model, opt = build(SIZES, optimizer, frozen)
    history, losses = [], []
    for batch in batches:
        losses += (yield from ddp_sgd(comm, model, opt, X, y, [batch], cap, overlap))
        history.append(snapshot(model.params))
    return history, losses


def run(engine, program, p, args=()):
    if engine == "sim":
        return dsml.run(program, p, network=NET, args=args)
    return dsml.run(program, p, engine=engine, args=args, timeout=TIMEOUT)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("cap", [0, 100, 1000, INF])
@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_ddp_trains_as_one_process_on_sim(p, cap, overlap):
    X, y = classification()
    batches = global_batches(len(X))              # includes batches shorter than p
    reference, losses = reference_training(SIZES, "momentum", X, y, batches)
    values = run("sim", ddp_step_by_step, p, ("momentum", X, y, batches, cap, overlap)).values
    assert_matches_reference(values, reference, losses)


@pytest.mark.parametrize("frozen", [("layer0.weight",), ("layer1.bias", "layer0.bias")])
def test_ddp_leaves_frozen_parameters_alone(frozen):
    X, y = classification()
    batches = global_batches(len(X))
    reference, losses = reference_training(SIZES, "adam", X, y, batches, frozen=frozen)
    initial = {name: build(SIZES, "adam", frozen)[0].params[name].copy() for name in frozen}
    values = run("sim", ddp_step_by_step, 3, ("adam", X, y, batches, 100, True, frozen)).values
    assert_matches_reference(values, reference, losses, frozen=initial)


@pytest.mark.parametrize("engine", ["threads", "processes"])
def test_ddp_trains_as_one_process_on_real_engines(engine, nothing_left_behind):
    X, y = classification()
    batches = global_batches(len(X))
    reference, losses = reference_training(SIZES, "momentum", X, y, batches)
    for cap, overlap in [(100, True), (INF, False)]:
        values = run(engine, ddp_step_by_step, 3, ("momentum", X, y, batches, cap, overlap)).values
        assert_matches_reference(values, reference, losses)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_ddp_stops_on_a_non_finite_gradient_naming_step_and_layer():
    X, y = classification()
    X = X.copy()
    batches = global_batches(len(X))
    X[batches[1][0]] = np.inf
    with pytest.raises(RankError, match=r"step 0: non-finite gradient in layer\d\.weight"):
        run("sim", ddp_step_by_step, 2, ("sgd", X, y, batches[1:], 100, True))


# --- ddp_allreduce: errors --------------------------------------------------------------------

def _produce(names, p_bytes=8):
    for name in names:
        yield name, np.ones(p_bytes // 8), 0.0


def test_a_gradient_in_no_bucket_is_an_error_naming_it():
    def program(comm):
        return (yield from ddp_allreduce(comm, _produce(["x", "stray"]), [["x"]]))
    with pytest.raises(RankError, match="gradient 'stray' is in no bucket"):
        dsml.run(program, 2, network=NET)


def test_a_gradient_produced_twice_is_an_error():
    def program(comm):
        return (yield from ddp_allreduce(comm, _produce(["x", "x"]), [["x"], ["y"]]))
    with pytest.raises(RankError, match="gradient 'x' is produced twice"):
        dsml.run(program, 2, network=NET)


def test_a_bucket_that_never_fills_is_an_error_naming_what_is_missing():
    def program(comm):
        return (yield from ddp_allreduce(comm, _produce(["x"]), [["x"], ["y", "z"]]))
    with pytest.raises(RankError, match=r"backward never produced \['y', 'z'\]"):
        dsml.run(program, 2, network=NET)


def test_buckets_that_fill_out_of_order_are_reduced_in_order():
    def program(comm):
        grads = [("b", np.full(2, comm.rank + 1.0), 0.0), ("a", np.full(3, 10.0 * comm.rank), 0.0)]
        return (yield from ddp_allreduce(comm, iter(grads), [["a"], ["b"]]))
    values = dsml.run(program, 3, network=NET).values
    for summed in values:
        assert np.array_equal(summed["a"], np.full(3, 30.0))
        assert np.array_equal(summed["b"], np.full(2, 6.0))


# --- time: the α–β recurrence of buckets queued behind backward ------------------------------

def recurrence(profile, buckets, p, alpha, beta, forward, overlap=True):
    """Iteration time of one DDP step: each bucket's ring all-reduce starts when its last
    gradient is produced and the bucket before it is done."""
    ready, clock, at = {}, forward, {}
    for name, nbytes, seconds in profile:
        clock += seconds
        ready[name], at[name] = clock, nbytes
    end = forward if overlap else clock
    for bucket in buckets:
        start = max(max(ready[n] for n in bucket), end) if overlap else end
        end = start + cost("allreduce", "ring", p, sum(at[n] for n in bucket), alpha, beta)
    return max(end, clock)


def _random_profile(seed, p, tensors=12):
    rng = np.random.default_rng(seed)
    return [(f"t{i}", int(rng.integers(1, 500)) * 8 * p, float(rng.uniform(0, 2e-4)))
            for i in range(tensors)]


def _ddp_time(profile, cap, p, network, forward, overlap):
    buckets = assign_buckets([(n, b) for n, b, _ in reversed(profile)], cap)

    def step(comm):
        yield comm.compute(forward)
        yield from ddp_allreduce(comm, ((n, SizeOnly(b), s) for n, b, s in profile), buckets,
                                 overlap)
    return dsml.run(step, p, network=network, trace=False).time, buckets


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("cap", [0, 20_000, 100_000, INF])
@pytest.mark.parametrize("overlap", [True, False])
def test_simulated_ddp_time_is_the_alpha_beta_recurrence(seed, p, cap, overlap):
    profile = _random_profile(seed, p)
    network = dsml.net.AlphaBeta(alpha=3e-6, beta=1 / 10e9)
    time, buckets = _ddp_time(profile, cap, p, network, 1e-3, overlap)
    expected = recurrence(profile, buckets, p, network.alpha, network.beta, 1e-3, overlap)
    assert math.isclose(time, expected, rel_tol=1e-12), (time, expected)


def test_one_bucket_overlapped_is_no_overlap_and_overlap_never_hurts():
    p, network = 8, presets.network("ib_hdr")
    profile = _random_profile(7, p, tensors=30)
    serial = _ddp_time(profile, INF, p, network, 1e-3, False)[0]
    assert _ddp_time(profile, INF, p, network, 1e-3, True)[0] == serial
    compute = 1e-3 + sum(s for _, _, s in profile)
    for cap in (0, 10_000, 100_000, 1_000_000):
        overlapped = _ddp_time(profile, cap, p, network, 1e-3, True)[0]
        assert compute <= overlapped
        assert overlapped <= _ddp_time(profile, cap, p, network, 1e-3, False)[0]


# --- contention: compute slowed while an all-reduce is in flight ------------------------------

def _contended_time(profile, cap, p, network, forward, contention, overlap=True):
    buckets = assign_buckets([(n, b) for n, b, _ in reversed(profile)], cap)

    def step(comm):
        yield comm.compute(forward)
        yield from ddp_allreduce(comm, ((n, SizeOnly(b), s) for n, b, s in profile), buckets,
                                 overlap, contention=contention)
    return dsml.run(step, p, network=network, trace=False).time


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("cap", [0, 20_000, INF])
def test_contention_zero_is_todays_step_exactly(seed, cap):
    p, network = 4, dsml.net.AlphaBeta(alpha=3e-6, beta=1 / 10e9)
    profile = _random_profile(seed, p)
    today = _ddp_time(profile, cap, p, network, 1e-3, True)[0]
    assert _contended_time(profile, cap, p, network, 1e-3, 0.0) == today


def test_contention_slows_the_compute_that_runs_beside_an_all_reduce_by_hand():
    # Bucket "a" (0.5 MB) is all-reduced for T_a = 2α + 0.5 ms while "b"'s 1 ms of compute runs
    # in 10 µs slices: the 26 slices that start before T_a = 514 µs take 20 µs each at c = 0.5,
    # the other 74 take 10 µs.
    network, c = dsml.net.AlphaBeta(alpha=7e-6, beta=1e-9), 0.5
    profile = [("a", 500_000, 1e-4), ("b", 8, 1e-3)]
    t_a = cost("allreduce", "ring", 2, 500_000, network.alpha, network.beta)
    slowed = math.ceil(t_a / (SLICE_SECONDS / (1 - c)))
    assert slowed == 26
    b_done = 1e-4 + slowed * SLICE_SECONDS / (1 - c) + (100 - slowed) * SLICE_SECONDS
    expected = b_done + cost("allreduce", "ring", 2, 8, network.alpha, network.beta)
    assert math.isclose(_contended_time(profile, 0, 2, network, 0.0, c), expected, rel_tol=1e-9)
    free = 1e-4 + max(t_a, 1e-3) + cost("allreduce", "ring", 2, 8, network.alpha, network.beta)
    assert math.isclose(_contended_time(profile, 0, 2, network, 0.0, 0.0), free, rel_tol=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_contention_costs_at_most_the_stretch_of_backward_and_nothing_without_overlap(seed):
    p, network, c = 4, dsml.net.AlphaBeta(alpha=3e-6, beta=1 / 10e9), 0.3
    profile = _random_profile(seed, p, tensors=20)
    backward = sum(s for _, _, s in profile)
    for cap in (0, 20_000, 100_000):
        free = _contended_time(profile, cap, p, network, 1e-3, 0.0)
        shared = _contended_time(profile, cap, p, network, 1e-3, c)
        assert free - 1e-12 <= shared <= free + backward * c / (1 - c) + 1e-12
    serial = _contended_time(profile, INF, p, network, 1e-3, 0.0, overlap=False)
    assert math.isclose(_contended_time(profile, INF, p, network, 1e-3, c, overlap=False), serial,
                        rel_tol=1e-12)          # nothing in flight while backward computes


def test_contention_makes_a_step_slower_when_compute_overlaps_communication():
    p, network = 4, dsml.net.AlphaBeta(alpha=3e-6, beta=1 / 10e9)
    # Ten tensors of 100 µs compute; each bucket's all-reduce (30 µs) runs beside the next
    # tensor's compute, which is the critical path: the step grows by at least c × 9 × 30 µs.
    profile = [(f"t{i}", 80_000, 1e-4) for i in range(10)]
    beside = 9 * cost("allreduce", "ring", p, 80_000, network.alpha, network.beta)
    assert beside < 9e-4
    free = _contended_time(profile, 0, p, network, 1e-3, 0.0)
    assert _contended_time(profile, 0, p, network, 1e-3, 0.2) - free >= 0.2 * beside - 1e-12


@pytest.mark.parametrize("contention", [-0.1, 1.0, float("nan")])
def test_contention_outside_zero_to_one_is_an_error_naming_it(contention):
    def program(comm):
        return (yield from ddp_allreduce(comm, _produce(["x"]), [["x"]], contention=contention))
    with pytest.raises(RankError, match=r"contention must be in \[0, 1\)"):
        dsml.run(program, 2, network=NET)


def test_compute_sharing_refuses_a_slice_that_is_not_positive():
    with pytest.raises(ValueError, match="slice_seconds > 0"):
        next(compute_sharing(None, 1e-3, None, 0.2, slice_seconds=0.0))


def test_resnet50_counted_layer_by_layer_matches_torchvision():
    layers = presets.resnet50_layers()
    assert len(layers) == 161
    assert sum(n for _, n, _ in layers) == 25_557_032            # torchvision's count
    assert round(sum(f for _, _, f in layers) / 2e9, 2) == 4.09     # its 4.09 GMAC per image
    assert layers[0][0] == "conv1.weight" and layers[-1][0] == "fc.bias"
    assert sum(n for name, n, _ in layers if name.startswith("layer4")) == 14_964_736


# --- bucket rebuild after the first iteration (DDP's `_rebuild_buckets`) ----------------------

def _scrambled_program(comm, batches, rebuild, steps_seconds):
    from dsml.train import digits, make_optimizer
    X, y, _, _ = digits(seed=1)
    model = MLP([64, 32, 32, 10], seed=4)
    model.params = dict(reversed(list(model.params.items())))   # registered back to front
    optimizer = make_optimizer("momentum", 0.05)
    losses = yield from ddp_sgd(comm, model, optimizer, X, y, batches, bucket_cap=2_000,
                                seconds_per_flop=steps_seconds, rebuild=rebuild)
    return losses, (yield comm.now())


def test_rebuilt_buckets_follow_backward_and_restore_overlap():
    from dsml.train import digits
    X, _, _, _ = digits(seed=1)
    batches = [np.arange(k * 96, (k + 1) * 96) for k in range(4)]
    network = dsml.net.AlphaBeta(20e-6, 2e-9)
    one = {r: dsml.run(_scrambled_program, 3, network=network, args=(batches[:1], r, 1e-9))
           for r in (True, False)}
    four = {r: dsml.run(_scrambled_program, 3, network=network, args=(batches, r, 1e-9))
            for r in (True, False)}
    # the first step is the same either way; the later steps are faster once rebuilt
    assert math.isclose(one[True].values[0][1], one[False].values[0][1], rel_tol=1e-12)
    later = {r: four[r].values[0][1] - one[r].values[0][1] for r in (True, False)}
    assert later[True] < 0.8 * later[False], later
    # and the training is the same, to round-off
    assert np.allclose(four[True].values[0][0], four[False].values[0][0], rtol=1e-12)


def test_an_empty_shard_rebuilds_the_same_buckets():
    # 2 examples on 3 ranks: rank 2's shard is empty; its zeros must come in backward's order,
    # or its rebuilt buckets would differ from the others' and the all-reduces would not match.
    batches = [np.array([0, 1]), np.array([2, 3]), np.array([4, 5])]
    result = dsml.run(_scrambled_program, 3, network=dsml.net.AlphaBeta(5e-6, 1e-9),
                      args=(batches, True, 0.0))
    losses = [v[0] for v in result.values]
    assert all(l == losses[0] for l in losses)
