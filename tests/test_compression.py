"""dsml.compression: compressors against NumPy references and closed forms, QSGD's statistics with
tolerances derived from the number of draws, error feedback, the exchange on simulated ranks
(bytes read from the trace), the α–β break-even against the simulator, and bad input."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsml.collectives import allgather, allreduce
from dsml.comm.api import SizeOnly
from dsml.comm.run import run
from dsml.compression import (DGC, Compressed, Dense, ErrorFeedback, MajorityVote, PowerSGD,
                              QSGD, RandomK, Sign, TopK, breakeven_bandwidth, dgc_density,
                              looped_data_parallel_sgd,
                              compressed_data_parallel_sgd, exchange_time, gradient_shapes, pack,
                              overlapped_step_time, qsgd, qsgd_variance, qsgd_variance_bound,
                              time_compressor, trace_bytes_sent, unpack)
from dsml.data_parallel import ddp_allreduce, train_single
from dsml.net import AlphaBeta
from dsml.train import MLP, digits
from dsml.train.data import batch_indices
from dsml.train.optim import SGD

NET = AlphaBeta(alpha=5e-6, beta=1e-9)
SIZES = [1, 7, 8, 9, 100, 1001]
FAILURE = 1e-6          # probability that a correct QSGD fails one statistical check


def vector(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n) * rng.exponential(size=n)     # uneven magnitudes


def all_compressors(n, seed=0):
    """One of each, for a vector of n elements (PowerSGD: an n = rows·cols matrix, or biases)."""
    out = [Dense(), Sign(), Sign(bucket=4), MajorityVote(), QSGD(3), QSGD(2, bucket=5),
           TopK(k=1), TopK(fraction=0.3), RandomK(k=1), RandomK(fraction=0.5, unbiased=True),
           RandomK(k=1, shared_seed=seed)]
    if n % 3 == 0:
        out.append(PowerSGD([(3, n // 3)], 1, seed=seed))
    else:
        out.append(PowerSGD([(n,)], 1, seed=seed))            # a vector: sent dense
    return out


# ---------------------------------------------------------------- wire sizes and references

@pytest.mark.parametrize("n", SIZES)
def test_wire_bytes_match_the_formats(n):
    x = vector(n)
    k = lambda f: max(1, math.ceil(f * n))                  # noqa: E731
    expected = {"dense": 4 * n, "sign": math.ceil(n / 8) + 4,
                "sign/4": math.ceil(n / 8) + 4 * math.ceil(n / 4), "sign vote": n + 4,
                "qsgd s=3": n + 4, "qsgd s=2/5": n + 4 * math.ceil(n / 5),
                "top-k 1": 8, "top-k 30%": 8 * k(0.3), "rand-k 1": 8,
                "rand-k 50% ×n/k": 8 * k(0.5), "rand-k 1 shared": 4}
    for compressor in all_compressors(n):
        c = compressor.compress(x, np.random.default_rng(1))
        out = compressor.decompress(c)
        assert out.shape == (n,) and out.dtype == np.float64
        if compressor.name.startswith("powersgd"):
            shape = compressor.shapes[0]
            assert c.nbytes == 4 * ((shape[0] + shape[1]) if len(shape) == 2 else shape[0])
        else:
            assert c.nbytes == expected[compressor.name], compressor.name


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("bucket", [None, 1, 3, 64])
def test_sign_is_mean_absolute_value_times_sign(n, bucket):
    x = vector(n, seed=n)
    out = Sign(bucket).decompress(Sign(bucket).compress(x))
    size = n if bucket is None else bucket
    reference = np.concatenate([np.where(x[a:a + size] >= 0, 1.0, -1.0)
                                * float(np.float32(np.mean(np.abs(x[a:a + size]))))
                                for a in range(0, n, size)])
    assert np.allclose(out, reference, rtol=1e-6)


@pytest.mark.parametrize("n", SIZES)
def test_topk_keeps_the_largest(n):
    x = vector(n, seed=3)
    for k in sorted({1, max(1, n // 3), n}):
        out = TopK(k=k).decompress(TopK(k=k).compress(x))
        keep = np.argsort(-np.abs(x))[:k]
        reference = np.zeros(n)
        reference[keep] = x[keep].astype(np.float32)
        assert np.array_equal(out, reference)


def test_randomk_scaling_and_shared_indices():
    x = vector(50, seed=4)
    rng = np.random.default_rng(0)
    plain, scaled = RandomK(k=5), RandomK(k=5, unbiased=True)
    kept = plain.decompress(plain.compress(x, np.random.default_rng(7)))
    kept_scaled = scaled.decompress(scaled.compress(x, np.random.default_rng(7)))
    assert np.count_nonzero(kept) == 5
    assert np.allclose(kept_scaled, kept * 10, rtol=1e-6)
    assert np.allclose(kept[kept != 0], x[kept != 0], rtol=1e-6)
    a, b = RandomK(k=5, shared_seed=9), RandomK(k=5, shared_seed=9)
    for _ in range(3):        # the same stream of indices, step after step, whatever rng says
        ca, cb = a.compress(x, rng), b.compress(-x, None)
        assert np.array_equal(a.decompress(ca) != 0, b.decompress(cb) != 0)
    # Unbiased when scaled: mean of N draws within Hoeffding's tolerance (width |x_i|·n/k).
    draws = 4000
    mean = np.mean([scaled.decompress(scaled.compress(x, rng)) for _ in range(draws)], axis=0)
    tolerance = np.abs(x) * 10 * math.sqrt(math.log(2 * len(x) / FAILURE) / (2 * draws))
    assert np.all(np.abs(mean - x) <= tolerance + 1e-12)


# ---------------------------------------------------------------- QSGD statistics

def level_widths(x, levels, bucket):
    size = len(x) if bucket is None else bucket
    widths = np.zeros(len(x))
    for a in range(0, len(x), size):
        widths[a:a + size] = np.linalg.norm(x[a:a + size]) / levels
    return widths


def qsgd_statistics(quantize, x, levels, bucket, draws, rng):
    """(passes the unbiasedness check, |mean sq. error − exact| within tolerance, mean sq. error
    within bound + tolerance) with Hoeffding tolerances for `draws` samples."""
    samples = np.array([quantize(x, levels, rng, bucket) for _ in range(draws)])
    widths = level_widths(x, levels, bucket)
    mean_ok = np.all(np.abs(samples.mean(axis=0) - x)
                     <= widths * math.sqrt(math.log(2 * len(x) / FAILURE) / (2 * draws)))
    errors = np.sum((samples - x) ** 2, axis=1)
    tolerance = np.sum(widths ** 2) * math.sqrt(math.log(2 / FAILURE) / (2 * draws))
    exact_ok = abs(errors.mean() - qsgd_variance(x, levels, bucket)) <= tolerance
    bound_ok = errors.mean() <= qsgd_variance_bound(x, levels, bucket) + tolerance
    return mean_ok, exact_ok, bound_ok


@pytest.mark.parametrize("levels,bucket,n", [(1, None, 20), (3, None, 37), (8, 5, 37),
                                             (2, 1, 6), (127, None, 10)])
def test_qsgd_unbiased_and_variance_within_bound(levels, bucket, n):
    x = vector(n, seed=levels)
    assert all(qsgd_statistics(qsgd, x, levels, bucket, 3000, np.random.default_rng(levels)))


def test_a_biased_quantizer_fails_the_same_check():
    def nearest(x, levels, rng, bucket):        # deterministic rounding: biased
        norm = np.linalg.norm(x)
        return np.sign(x) * np.round(levels * np.abs(x) / norm) * norm / levels
    mean_ok, _, _ = qsgd_statistics(nearest, vector(37, seed=3), 3, None, 3000,
                                    np.random.default_rng(0))
    assert not mean_ok


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=40), st.integers(1, 20),
       st.one_of(st.none(), st.integers(1, 10)))
def test_exact_variance_never_exceeds_the_bound(values, levels, bucket):
    x = np.array(values)
    assert qsgd_variance(x, levels, bucket) <= qsgd_variance_bound(x, levels, bucket) * (1 + 1e-9) \
        + 1e-12


def test_qsgd_levels_are_integers_in_range_and_zero_stays_zero():
    x = vector(100, seed=8)
    c = QSGD(5, bucket=16).compress(x, np.random.default_rng(0))
    assert c.arrays["levels"].dtype == np.int8
    assert np.abs(c.arrays["levels"]).max() <= 5
    assert np.array_equal(np.sign(c.arrays["levels"]) * np.sign(x) >= 0, np.ones(100, bool))
    assert np.array_equal(qsgd(np.zeros(9), 4, np.random.default_rng(0)), np.zeros(9))
    assert QSGD(200).compress(x, np.random.default_rng(0)).arrays["levels"].dtype == np.int16


# ---------------------------------------------------------------- error feedback and PowerSGD

@pytest.mark.parametrize("make", [Sign, lambda: TopK(k=2), lambda: RandomK(k=3),
                                  lambda: PowerSGD([(4, 5), (3,)], 1), lambda: QSGD(2)],
                         ids=["sign", "topk", "randk", "powersgd", "qsgd"])
def test_error_feedback_telescopes(make):
    rng = np.random.default_rng(0)
    steps = rng.standard_normal((30, 23))
    ef = ErrorFeedback(make())
    sent = sum(ef.decompress(ef.compress(g, rng)) for g in steps)
    assert np.allclose(sent + ef.residual, steps.sum(axis=0), atol=1e-9)


def test_powersgd_full_rank_is_exact_and_warm_start_converges_to_the_svd():
    rng = np.random.default_rng(1)
    M = rng.standard_normal((6, 4))
    full = PowerSGD([(6, 4)], 4)
    assert np.allclose(full.decompress(full.compress(M.ravel())), M.ravel(), atol=1e-5)
    # Repeating the same matrix, warm-started Q is power iteration: rank-1 error → the SVD tail.
    low = PowerSGD([(6, 4)], 1, seed=3)
    errors = [np.linalg.norm(low.decompress(low.compress(M.ravel())) - M.ravel())
              for _ in range(60)]
    sigma = np.linalg.svd(M, compute_uv=False)
    assert errors[-1] <= np.sqrt(np.sum(sigma[1:] ** 2)) * (1 + 1e-3)
    assert errors[-1] < errors[0]


@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_distributed_powersgd_is_powersgd_of_the_summed_matrix(p):
    shapes = [(5, 7), (7,), (7, 3)]
    vectors = [vector(5 * 7 + 7 + 7 * 3, seed=r) for r in range(p)]

    def program(comm):
        compressor = PowerSGD(shapes, 2, seed=4)
        total, mine = yield from compressor.exchange(comm, vectors[comm.rank])
        return total, mine

    result = run(program, p, network=NET)
    reference = PowerSGD(shapes, 2, seed=4)
    summed = reference.decompress(reference.compress(np.sum(vectors, axis=0)))
    assert np.allclose(result.values[0][0], summed, rtol=1e-4, atol=1e-4)
    assert np.allclose(result.values[0][0], sum(v[1] for v in result.values), atol=1e-5)


# ---------------------------------------------------------------- the exchange on ranks

@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [1, 9, 30, 241])
def test_exchange_sums_decompressed_and_bytes_match_the_collective(p, n):
    vectors = [vector(n, seed=r) for r in range(p)]
    for index in range(len(all_compressors(n))):
        def program(comm):
            compressor = all_compressors(n)[index]
            rng = np.random.default_rng((2, comm.rank))
            wire = all_compressors(n)[index].compress(vectors[comm.rank],
                                                      np.random.default_rng((2, comm.rank)))
            total, mine = yield from compressor.exchange(comm, vectors[comm.rank], rng)
            return total, mine, wire

        result = run(program, p, network=NET)
        name = all_compressors(n)[index].name
        totals, mines, wires = zip(*result.values)
        assert all(np.array_equal(totals[0], t) for t in totals), name
        if name == "sign vote":
            votes = sum(w.arrays["votes"].astype(int) for w in wires)
            scale = sum(float(w.arrays["scale"][0]) for w in wires)
            assert np.allclose(totals[0], np.sign(votes) * scale, rtol=1e-6)
        else:
            assert np.allclose(totals[0], sum(mines), rtol=1e-5, atol=1e-6), name
        c = wires[0].nbytes
        as_is = all_compressors(n)[index].allreduce_as_is
        expected = 2 * (p - 1) * c if as_is else p * (p - 1) * c
        assert trace_bytes_sent(result.trace) == expected, name


def test_majority_vote_refuses_more_ranks_than_int8_holds():
    def program(comm):
        yield from MajorityVote().exchange(comm, np.ones(3))

    with pytest.raises(Exception, match="overflow"):
        run(program, 128, network=NET, trace=False)


def test_pack_unpack_round_trip():
    c = Compressed({"a": np.arange(5, dtype=np.float32), "b": np.array([3, -1], np.int32),
                    "bits": np.packbits([1, 0, 1])}, 5)
    back = unpack(pack(c), c)
    assert pack(c).dtype == np.uint8 and len(pack(c)) == c.nbytes
    for name in c.arrays:
        assert np.array_equal(back.arrays[name], c.arrays[name])
        assert back.arrays[name].dtype == c.arrays[name].dtype


def test_training_with_dense_matches_one_process():
    X, y, _, _ = digits(seed=0)
    batches = batch_indices(len(X), 64, seed=0)[:10]

    def program(comm):
        model = MLP((64, 16, 10), seed=1)
        yield from compressed_data_parallel_sgd(comm, model, SGD(0.3), X, y, batches, Dense())
        return model.params

    result = run(program, 3, network=NET)
    reference = MLP((64, 16, 10), seed=1)
    train_single(reference, SGD(0.3), X, y, batches)
    for name, w in reference.params.items():
        assert np.allclose(result.values[0][name], w, rtol=1e-4, atol=1e-6)
        assert all(np.array_equal(v[name], result.values[0][name]) for v in result.values)
    assert gradient_shapes(reference) == [w.shape for w in reference.params.values()]


def test_error_feedback_helps_topk_training():
    X, y, _, _ = digits(seed=0)
    batches = [b for e in range(4) for b in batch_indices(len(X), 64, seed=e)]

    def program(comm, feedback):
        model = MLP((64, 16, 10), seed=1)
        compressor = TopK(fraction=0.005)
        compressor = ErrorFeedback(compressor) if feedback else compressor
        losses = yield from compressed_data_parallel_sgd(comm, model, SGD(0.5), X, y, batches,
                                                         compressor, seed=2)
        return np.mean(losses[-20:])

    with_ef = run(program, 2, network=NET, args=(True,), trace=False).values[0]
    without = run(program, 2, network=NET, args=(False,), trace=False).values[0]
    assert with_ef < 0.7 * without


# ---------------------------------------------------------------- Deep Gradient Compression
def test_dgc_warmup_schedule():
    assert [dgc_density(t, 8) for t in range(10)] == [0.25, 0.25, 0.0625, 0.0625, 0.015625,
                                                      0.015625, 0.00390625, 0.00390625,
                                                      0.001, 0.001]
    assert dgc_density(0, 0, 0.01) == 0.01
    assert dgc_density(3, 4, density=0.1) == 0.1          # never below the final density


@pytest.mark.parametrize("n, k", [(10, 3), (5000, 5), (100_000, 100), (100_000, 1)])
def test_dgc_selection_is_the_top_k(n, k):
    from dsml.compression import _largest
    x = np.abs(vector(n, seed=n))
    assert np.array_equal(_largest(x, k), np.sort(np.argsort(x)[n - k:]))


def test_dgc_without_sparsity_is_momentum_sgd():
    """Density 1, no masking, no clipping: the summed sends are dense momentum SGD's velocity."""
    grads = [vector(50, seed=s) for s in range(6)]
    dgc, velocity = DGC(density=1.0, momentum=0.9, factor_masking=False), np.zeros(50)
    for g in grads:
        velocity = 0.9 * velocity + g
        assert np.allclose(dgc.decompress(dgc.compress(g)), velocity, rtol=1e-6, atol=1e-6)


def test_dgc_accumulates_and_masks():
    g = vector(1000, seed=3)
    dgc = DGC(density=0.01, momentum=0.5)
    c = dgc.compress(g)
    sent = c.arrays["indices"]
    assert len(sent) == 10 and c.nbytes == 80
    assert np.array_equal(np.sort(np.argsort(np.abs(g))[-10:]), sent)
    assert np.all(dgc.u[sent] == 0) and np.allclose(np.delete(dgc.u, sent), np.delete(g, sent))
    assert np.allclose(dgc.v[sent], 0, atol=1e-6)
    plain = DGC(density=0.01, momentum_correction=False)       # v accumulates g, nothing lost
    total = sum(plain.decompress(plain.compress(vector(1000, seed=s))) for s in range(20))
    assert np.allclose(total + plain.v, sum(vector(1000, seed=s) for s in range(20)), atol=1e-5)


def test_dgc_clips_locally():
    g = vector(200, seed=1)
    dgc = DGC(density=1.0, momentum=0.0, clip_norm=0.5)
    assert math.isclose(np.linalg.norm(dgc.decompress(dgc.compress(g))), 0.5, rel_tol=1e-6)
    assert dgc.clipped == 1
    dgc.compress(g * 1e-6)
    assert dgc.clipped == 1


@pytest.mark.parametrize("kwargs", [{"density": 0}, {"density": 1.5}, {"momentum": 1.0},
                                    {"momentum": -0.1}, {"clip_norm": 0}, {"warmup_steps": -1}])
def test_dgc_bad_input(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs)).replace("density", "fraction")):
        DGC(**kwargs)


def test_looped_ranks_match_the_simulated_ranks():
    X, y, _, _ = digits(seed=0)
    batches = batch_indices(len(X), 64, seed=0)[:8]

    def make():
        return DGC(density=0.05, warmup_steps=4, clip_norm=1.0)

    def program(comm):
        model = MLP((64, 16, 10), seed=1)
        yield from compressed_data_parallel_sgd(comm, model, SGD(0.3), X, y, batches, make())
        return model.params

    simulated = run(program, 3, network=NET, trace=False).values[0]
    looped = MLP((64, 16, 10), seed=1)
    wire = looped_data_parallel_sgd(looped, SGD(0.3), X, y, batches, [make() for _ in range(3)])
    for name, w in looped.params.items():
        assert np.array_equal(simulated[name], w), name
    n = sum(w.size for w in looped.params.values())
    assert [sizes[0] for sizes in wire] == [8 * math.ceil(dgc_density(t, 4, 0.05) * n)
                                            for t in range(len(batches))]
    with pytest.raises(ValueError, match="compressors"):
        looped_data_parallel_sgd(looped, SGD(0.3), X, y, batches, [])


# ---------------------------------------------------------------- α–β time and break-even

def timed_program(comm, wire_bytes, collective, compute_seconds):
    yield comm.compute(compute_seconds)
    for size in wire_bytes:
        if collective == "allreduce":
            yield from allreduce(comm, SizeOnly(int(size)), algorithm="ring")   # the model's
        else:
            yield from allgather(comm, SizeOnly(int(size)))


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("collective,wire", [("allreduce", [4096]), ("allreduce", [512, 1024]),
                                             ("allgather", [640])])
def test_exchange_time_is_the_simulated_time_when_sizes_divide(p, collective, wire):
    net = AlphaBeta(alpha=3e-6, beta=2e-9)
    simulated = run(timed_program, p, network=net, args=(wire, collective, 1e-4)).time
    assert math.isclose(simulated, exchange_time(p, wire, net.alpha, net.beta, collective, 1e-4),
                        rel_tol=1e-12)


def test_simulated_time_departs_from_the_formula_for_uneven_blocks():
    net = AlphaBeta(alpha=3e-6, beta=2e-9)

    def program(comm):
        yield from Dense().exchange(comm, np.ones(10))       # 10 values on 4 ranks: 3, 3, 2, 2

    simulated = run(program, 4, network=net).time
    model = exchange_time(4, [40], net.alpha, net.beta)
    assert simulated > model * (1 + 1e-6)
    # The ring's step is set by the largest block (3 values = 12 bytes), not the mean (10 bytes).
    assert math.isclose(simulated, 2 * 3 * (net.alpha + 12 * net.beta), rel_tol=1e-12)


def test_breakeven_bandwidth_is_where_the_times_cross():
    p, dense, wire, alpha, compute = 8, 2.0**24, [2.0**24 / 100], 2e-5, 5e-3
    b_star = breakeven_bandwidth(p, dense, wire, alpha, "allgather", compute)
    assert 0 < b_star < math.inf
    at = [exchange_time(p, [dense], alpha, 1 / b_star),
          exchange_time(p, wire, alpha, 1 / b_star, "allgather", compute)]
    assert math.isclose(at[0], at[1], rel_tol=1e-9)
    slower, faster = 1 / (b_star / 2), 1 / (b_star * 2)
    assert exchange_time(p, wire, alpha, slower, "allgather", compute) < \
        exchange_time(p, [dense], alpha, slower)
    assert exchange_time(p, wire, alpha, faster, "allgather", compute) > \
        exchange_time(p, [dense], alpha, faster)
    # Cheaper even at β = 0 (same latency, no compute): pays on every link.
    assert breakeven_bandwidth(p, dense, [dense / 10], alpha, "allreduce") == math.inf
    # More bytes than dense on the wire (all-gather of 1/2 the gradient on 8 ranks): never pays.
    assert breakeven_bandwidth(p, dense, [dense / 2], alpha, "allgather") == 0.0


def test_time_compressor_returns_positive_seconds():
    compress_s, decompress_s = time_compressor(TopK(k=10), vector(1000), repeats=2)
    assert compress_s > 0 and decompress_s > 0


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("make,message", [
    (lambda: TopK(k=0), "k must be an integer ≥ 1"),
    (lambda: TopK(k=-3), "k must be an integer ≥ 1"),
    (lambda: TopK(k=2.5), "k must be an integer ≥ 1"),
    (lambda: TopK(fraction=0.0), r"fraction must be in \(0, 1\]"),
    (lambda: TopK(fraction=1.5), r"fraction must be in \(0, 1\]"),
    (lambda: TopK(k=3, fraction=0.1), "exactly one of k"),
    (lambda: TopK(), "exactly one of k"),
    (lambda: RandomK(k=0), "k must be an integer ≥ 1"),
    (lambda: RandomK(fraction=-0.1), r"fraction must be in \(0, 1\]"),
    (lambda: QSGD(0), "levels must be an integer ≥ 1"),
    (lambda: QSGD(2.0), "levels must be an integer ≥ 1"),
    (lambda: QSGD(4, bucket=0), "bucket must be an integer ≥ 1"),
    (lambda: Sign(bucket=0), "bucket must be an integer ≥ 1"),
    (lambda: PowerSGD([(4, 5)], 0), "rank must be an integer ≥ 1"),
    (lambda: PowerSGD([(4, 5)], 5), r"rank must be ≤ min\(rows, cols\) = 4"),
    (lambda: PowerSGD([(4, 5, 6)], 1), "shapes must be 1-D or 2-D"),
    (lambda: PowerSGD([(0, 5)], 1), "shapes must be 1-D or 2-D with positive sizes"),
    (lambda: ErrorFeedback("top-k"), "inner must be a compressor"),
    (lambda: ErrorFeedback(ErrorFeedback(Sign())), "inner must be a compressor"),
    (lambda: exchange_time(4, [10], 1e-6, 1e-9, "broadcast"), "collective must be one of"),
    (lambda: exchange_time(4, [10], 1e-6, 1e-9, "allreduce", -1.0), "compute_seconds must be ≥ 0"),
    (lambda: time_compressor(Sign(), np.ones(4), repeats=0), "repeats must be an integer ≥ 1"),
])
def test_bad_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("compress,message", [
    (lambda: TopK(k=5).compress(np.ones(4)), "k must be ≤ n = 4"),
    (lambda: RandomK(k=5).compress(np.ones(4), np.random.default_rng(0)), "k must be ≤ n = 4"),
    (lambda: qsgd(np.ones(4), 0, np.random.default_rng(0)), "levels must be an integer ≥ 1"),
    (lambda: qsgd(np.ones(4), 2, None), "rng must be a numpy Generator"),
    (lambda: RandomK(k=2).compress(np.ones(4)), "rng must be a numpy Generator"),
    (lambda: Sign().compress(np.ones((2, 3))), r"must be a 1-D vector, got shape \(2, 3\)"),
    (lambda: TopK(k=1).compress(np.arange(4)), "must hold floats"),
    (lambda: QSGD(2).compress(np.ones(3, dtype=complex), np.random.default_rng(0)),
     "must hold floats"),
    (lambda: Dense().compress(np.array(["a", "b"])), "must hold floats"),
    (lambda: PowerSGD([(2, 3)], 1).compress(np.ones(7)),
     "x has 7 elements, the shapes add up to 6"),
])
def test_bad_vectors(compress, message):
    with pytest.raises(ValueError, match=message):
        compress()


def test_error_feedback_refuses_a_vector_of_another_length():
    ef = ErrorFeedback(Sign())
    ef.compress(np.ones(5))
    with pytest.raises(ValueError, match="x has 4 elements but the residual has 5"):
        ef.compress(np.ones(4))


def _ddp_sizes(comm, nbytes, slice_seconds):
    produced = ((f"g{i}", SizeOnly(int(b)), slice_seconds) for i, b in enumerate(nbytes))
    yield from ddp_allreduce(comm, produced, [[f"g{i}"] for i in range(len(nbytes))])


@pytest.mark.parametrize("backward", [0.0, 1e-4, 3e-3, 0.1])
@pytest.mark.parametrize("buckets", [1, 3, 5])
def test_overlapped_step_time_matches_bucketed_ddp_on_the_simulator(backward, buckets):
    world, nbytes = 4, [2**20] * buckets
    comm = exchange_time(world, [nbytes[0]], NET.alpha, NET.beta)
    simulated = run(_ddp_sizes, world, network=NET, trace=False,
                    args=(nbytes, backward / buckets)).time
    assert math.isclose(simulated, overlapped_step_time(backward, [comm] * buckets),
                        rel_tol=1e-6, abs_tol=1e-12)


def test_overlapped_step_time_hides_only_what_backward_covers():
    # Communication-bound: first slice + every exchange; compute-bound: backward + last exchange.
    assert math.isclose(overlapped_step_time(1.0, [2.0] * 4), 0.25 + 8.0)
    assert math.isclose(overlapped_step_time(8.0, [0.5] * 4), 8.0 + 0.5)
    # The codec lengthens backward's slices; it never overlaps with backward.
    assert math.isclose(overlapped_step_time(8.0, [0.5] * 4, codec_seconds=4.0), 12.5)
    # Uneven exchanges wait for the link: the last bucket is ready at 2 s but starts only when
    # the long exchange of the second (ready at 4/3 s) ends.
    assert math.isclose(overlapped_step_time(2.0, [0.1, 3.0, 0.1]), 4 / 3 + 3.0 + 0.1)


@pytest.mark.parametrize("kwargs, match", [
    ({"backward_seconds": -1.0, "bucket_comm_seconds": [1.0]}, "backward_seconds"),
    ({"backward_seconds": 1.0, "bucket_comm_seconds": []}, "bucket_comm_seconds"),
    ({"backward_seconds": 1.0, "bucket_comm_seconds": [1.0, -1.0]}, "bucket_comm_seconds"),
    ({"backward_seconds": 1.0, "bucket_comm_seconds": [1.0], "codec_seconds": -2.0},
     "codec_seconds"),
])
def test_overlapped_step_time_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        overlapped_step_time(**kwargs)
