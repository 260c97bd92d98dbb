"""ZeRO stages 0–3 / FSDP (dsml.zero): the same updates as plain data parallelism, and the bytes
sent and held measured from the trace and the ledger against ZeRO's closed forms."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsml.comm.api import RankError
from dsml.data_parallel import data_parallel_sgd, train_single
from dsml.net import AlphaBeta
from dsml.comm.run import run
from dsml.train import MLP
from dsml.train.data import batch_indices, teacher_classes
from dsml.train.models import loss_and_grads
from dsml.train.optim import make_optimizer
from dsml.zero import (LEDGER_CATEGORIES, ZERO_STAGES, MemoryLedger, fsdp_layer_seconds,
                       fsdp_step_prediction, fsdp_units,
                       state_bytes_per_parameter, trace_bytes_sent, zero_comm_formula,
                       zero_data_parallel, zero_memory_formula, zero_train)

LINK = AlphaBeta(alpha=5e-6, beta=1e-9)
SIZES = [23, 32, 32, 8]            # layers of 768, 1056 and 264 parameters: all divisible by 24
ODD_SIZES = [5, 7, 3]              # layers of 42 and 24 parameters: N = 5 divides neither
LR = 1e-2


def problem(sizes, n=96, batch=16, steps=4, seed=0):
    X, y, _, _ = teacher_classes(n, dim=sizes[0], classes=sizes[-1], seed=seed)
    batches = batch_indices(n, batch, seed=seed)[:steps]
    return MLP(sizes, seed=seed), X, y, batches


def train(stage, world_size, sizes=SIZES, precision="mixed", **options):
    model, X, y, batches = problem(sizes)
    return zero_train(stage, model, X, y, batches, world_size, network=LINK, lr=LR,
                      precision=precision, **options)


def layer_sizes(sizes):
    return [(a + 1) * b for a, b in zip(sizes[:-1], sizes[1:])]


def assert_same_bits(a, b):
    assert a.losses == b.losses
    for name in a.params:
        assert np.array_equal(a.params[name], b.params[name]), name
        assert a.params[name].dtype == b.params[name].dtype
        assert np.array_equal(a.master[name], b.master[name]), name


# -- identical updates --------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["mixed", "fp64"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("sizes", [SIZES, ODD_SIZES])
def test_stages_1_to_3_are_bit_identical_to_plain_data_parallel(precision, world_size, sizes):
    plain = train(0, world_size, sizes, precision)
    assert plain.replicas_agree
    for stage in (1, 2, 3):
        sharded = train(stage, world_size, sizes, precision)
        assert sharded.replicas_agree
        assert_same_bits(sharded, plain)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_fp64_equals_the_single_process_and_week3_data_parallel_with_adam(world_size):
    model, X, y, batches = problem(SIZES)
    single = MLP(SIZES, seed=0)
    train_single(single, make_optimizer("adam", LR), X, y, batches)

    def week3(comm):
        replica = MLP(SIZES, seed=0)
        yield from data_parallel_sgd(comm, replica, make_optimizer("adam", LR), X, y, batches)
        return replica.params

    week3_params = run(week3, world_size, network=LINK).values[0]
    for stage in ZERO_STAGES:
        result = train(stage, world_size, precision="fp64")
        for name in single.params:
            # Another summation order (whole batch; one flat vector with the loss): round-off.
            np.testing.assert_allclose(result.params[name], single.params[name], rtol=0,
                                       atol=1e-13)
            np.testing.assert_allclose(result.params[name], week3_params[name], rtol=0,
                                       atol=1e-13)
        if world_size == 1:     # one rank, the same arithmetic: exactly the single process
            assert all(np.array_equal(result.params[k], single.params[k]) for k in single.params)


def serial_mixed_precision(sizes, steps_batches, X, y, lr, scale=1024.0):
    """An independent one-process mixed-precision Adam: fp16 weights used by MLP's own forward
    and backward, gradient × scale rounded to fp16, unscaled in fp32, fp32 master + Adam."""
    model = MLP(sizes, seed=0)
    master = {k: v.astype(np.float32) for k, v in model.params.items()}
    optimizer = make_optimizer("adam", lr)
    losses = []
    for batch in steps_batches:
        for k in model.params:
            model.params[k] = master[k].astype(np.float16).astype(np.float64)
        value, grads = loss_and_grads(model, X[batch], y[batch])
        fp16 = {k: (g * scale).astype(np.float16) for k, g in grads.items()}
        optimizer.step(master, {k: g.astype(np.float32) / np.float32(scale)
                                for k, g in fp16.items()})
        losses.append(value)
    return master, losses


def test_mixed_precision_on_one_rank_is_the_serial_mixed_precision_step_bit_for_bit():
    model, X, y, batches = problem(SIZES)
    master, losses = serial_mixed_precision(SIZES, batches, X, y, LR)
    for stage in ZERO_STAGES:
        result = zero_train(stage, model, X, y, batches, 1, network=LINK, lr=LR)
        assert result.losses == losses
        for name in master:
            assert np.array_equal(result.master[name], master[name])
            assert np.array_equal(result.params[name],
                                  master[name].astype(np.float16).reshape(master[name].shape))


def test_mixed_precision_on_three_ranks_stays_close_to_the_serial_step():
    # fp16 sums round at every hop of the ring, the serial reference once: close, not equal.
    model, X, y, batches = problem(SIZES)
    master, losses = serial_mixed_precision(SIZES, batches, X, y, LR)
    result = zero_train(3, model, X, y, batches, 3, network=LINK, lr=LR)
    np.testing.assert_allclose(result.losses, losses, rtol=1e-3)
    for name in master:
        np.testing.assert_allclose(result.master[name], master[name], atol=0.05 * LR)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum"])
def test_other_elementwise_optimizers_shard_too(optimizer):
    plain = train(0, 3, optimizer=optimizer)
    for stage in (1, 2, 3):
        assert_same_bits(train(stage, 3, optimizer=optimizer), plain)
    held = train(3, 3, optimizer=optimizer).memory[0]["at_peak"]
    P, G, K = state_bytes_per_parameter("mixed", optimizer)
    assert held["optimizer"] == zero_memory_formula(3, 2088, 3, P, G, K)["optimizer"]


def test_model_is_only_read():
    model, X, y, batches = problem(SIZES)
    before = {k: v.copy() for k, v in model.params.items()}
    zero_train(3, model, X, y, batches, 2, network=LINK)
    assert all(np.array_equal(model.params[k], before[k]) for k in before)


def test_training_reduces_the_loss():
    model, X, y, _ = problem(SIZES, n=256)
    batches = [b for epoch in range(4) for b in batch_indices(256, 32, seed=epoch)]
    result = zero_train(3, model, X, y, batches, 4, network=LINK, lr=LR)
    assert np.mean(result.losses[-8:]) < 0.6 * np.mean(result.losses[:4])


# -- awkward sizes ------------------------------------------------------------------------------

def test_more_ranks_than_a_layer_has_parameters_and_than_the_batch_has_examples():
    # MLP [1, 1, 2]: layers of 2 and 4 parameters on 3 ranks (a piece is empty); batches of 2
    # examples (a shard is empty). Stages still agree bit for bit, and with the single process.
    X, y, _, _ = teacher_classes(6, dim=1, classes=2, seed=1)
    batches = [np.array([0, 1]), np.array([2, 3, 4]), np.array([5])]
    single = MLP([1, 1, 2], seed=0)
    train_single(single, make_optimizer("adam", LR), X, y, batches)
    runs = [zero_train(stage, MLP([1, 1, 2], seed=0), X, y, batches, 3, network=LINK, lr=LR,
                       precision="fp64") for stage in ZERO_STAGES]
    for result in runs[1:]:
        assert_same_bits(result, runs[0])
    for name in single.params:
        np.testing.assert_allclose(runs[0].params[name], single.params[name], atol=1e-14)


@settings(max_examples=12, deadline=None)
@given(widths=st.lists(st.integers(1, 6), min_size=2, max_size=4),
       world_size=st.integers(1, 5), stage=st.sampled_from([1, 2, 3]))
def test_property_any_shape_any_world_size_same_bits_and_comm_count(widths, world_size, stage):
    sizes = widths + [3]
    X, y, _, _ = teacher_classes(20, dim=sizes[0], classes=3, seed=2)
    batches = batch_indices(20, 7, seed=2)
    plain = zero_train(0, MLP(sizes, seed=1), X, y, batches, world_size, network=LINK, lr=LR)
    sharded = zero_train(stage, MLP(sizes, seed=1), X, y, batches, world_size, network=LINK,
                         lr=LR)
    assert_same_bits(sharded, plain)
    assert np.array_equal(sharded.bytes_per_step, ring_piece_count(stage, sizes, world_size))


# -- bytes sent ---------------------------------------------------------------------------------

def ring_piece_count(stage, sizes, world_size, param_bytes=2, grad_bytes=2):
    """Independent count: a ring reduce-scatter sends every piece but the rank's own, a ring
    all-gather every piece but its right neighbour's; pieces cut as np.array_split cuts."""
    sent = np.zeros(world_size)
    for n in layer_sizes(sizes):
        pieces = [len(p) for p in np.array_split(np.zeros(n), world_size)]
        for r in range(world_size):
            scatter, gather = n - pieces[r], n - pieces[(r + 1) % world_size]
            gathers = {0: 0, 1: 1, 2: 1, 3: 2}[stage]
            sent[r] += scatter * grad_bytes + gathers * gather * param_bytes
            if stage == 0:
                sent[r] += gather * grad_bytes
    return sent


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("precision", ["mixed", "fp64"])
def test_bytes_sent_equal_the_closed_form_when_layers_divide(world_size, precision):
    P, G, _ = state_bytes_per_parameter(precision)
    psi = sum(layer_sizes(SIZES))
    for stage in ZERO_STAGES:
        measured = train(stage, world_size, precision=precision).bytes_per_step
        assert np.all(measured == zero_comm_formula(stage, psi, world_size, P, G)), stage
    if world_size > 1:
        assert zero_comm_formula(3, psi, world_size) == 1.5 * zero_comm_formula(0, psi,
                                                                                world_size)


@pytest.mark.parametrize("world_size", [5, 7])
def test_bytes_sent_depart_from_the_closed_form_when_layers_do_not_divide(world_size):
    psi = sum(layer_sizes(ODD_SIZES))
    for stage in ZERO_STAGES:
        measured = train(stage, world_size, ODD_SIZES).bytes_per_step
        formula = zero_comm_formula(stage, psi, world_size)
        assert np.array_equal(measured, ring_piece_count(stage, ODD_SIZES, world_size))
        assert np.any(measured != formula) and len(set(measured)) > 1
        assert np.isclose(measured.sum(), world_size * formula)      # right on average


def test_trace_bytes_sent_counts_sends_and_exchanges_only():
    def program(comm):
        if comm.rank == 0:
            yield comm.send(1, np.zeros(10))                       # 80 B
            yield comm.sendrecv(1, np.zeros(3), 1)                 # 24 B
        else:
            yield comm.recv(0)
            yield comm.sendrecv(0, np.zeros(5, dtype=np.float16), 0)   # 10 B
        yield comm.compute(1e-6)

    trace = run(program, 2, network=LINK).trace
    assert list(trace_bytes_sent(trace, 2)) == [104, 10]


# -- bytes held ---------------------------------------------------------------------------------

@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("precision", ["mixed", "fp64"])
def test_model_state_held_equals_zero_formula_and_buffers_are_the_largest_layer(world_size,
                                                                                precision):
    P, G, K = state_bytes_per_parameter(precision)
    psi, largest = sum(layer_sizes(SIZES)), max(layer_sizes(SIZES))
    buffers = {0: 0, 1: 0, 2: G * largest, 3: (P + G) * largest}
    for stage in ZERO_STAGES:
        formula = zero_memory_formula(stage, psi, world_size, P, G, K)
        for report in train(stage, world_size, precision=precision).memory:
            held = report["at_peak"]
            assert {part: held[part] for part in formula} == formula, stage
            assert held["buffers"] == buffers[stage]
            # The peak departs from ZeRO's formula by the buffers it does not count.
            assert report["peak"] == sum(formula.values()) + buffers[stage]


def test_model_state_held_departs_from_the_formula_when_layers_do_not_divide():
    psi, world_size = sum(layer_sizes(ODD_SIZES)), 5
    for stage in (1, 2, 3):
        formula = zero_memory_formula(stage, psi, world_size)
        state = [sum(r["at_peak"][part] for part in formula)
                 for r in train(stage, world_size, ODD_SIZES).memory]
        assert state[0] > sum(formula.values()) > state[-1]
        assert np.isclose(np.mean(state), sum(formula.values()))


def test_mixed_precision_adam_holds_16_bytes_per_parameter_in_plain_data_parallel():
    psi = sum(layer_sizes(SIZES))
    report = train(0, 4).memory[2]
    assert report["peak"] == 16 * psi
    assert report["at_peak"] == {"params": 2 * psi, "grads": 2 * psi, "optimizer": 12 * psi,
                                 "buffers": 0}


def test_ledger_adds_nbytes_tracks_the_peak_and_its_breakdown():
    ledger = MemoryLedger()
    ledger.hold("w", "params", [np.zeros(10, np.float16), np.zeros(3, np.float32)])   # 32 B
    ledger.hold("buf", "buffers", [np.zeros(4)])                                      # 32 B
    ledger.free("buf")
    ledger.hold("w", "params", [np.zeros(2)])        # replaced: 16 B
    ledger.hold("g", "grads", [np.zeros(1, np.float16)])
    report = ledger.report()
    assert report["peak"] == 64
    assert report["at_peak"] == {"params": 32, "grads": 0, "optimizer": 0, "buffers": 32}
    assert report["now"] == {"params": 16, "grads": 2, "optimizer": 0, "buffers": 0}
    assert [total for _, total in ledger.history] == [32, 64, 32, 16, 18]
    assert set(report["now"]) == set(LEDGER_CATEGORIES)


def test_ledger_rejects_unknown_categories_and_keys():
    ledger = MemoryLedger()
    with pytest.raises(ValueError, match="category must be one of"):
        ledger.hold("x", "activations", [np.zeros(1)])
    with pytest.raises(KeyError, match="nothing is held"):
        ledger.free("x")


# -- the formulas -------------------------------------------------------------------------------

def test_memory_formula_reproduces_the_zero_paper_example():
    # Rajbhandari et al. 2020: Ψ = 7.5 B, N_d = 64, K = 12 → 120, 31.4, 16.6, 1.9 GB.
    totals = [sum(zero_memory_formula(stage, 7_500_000_000, 64).values()) / 1e9
              for stage in ZERO_STAGES]
    assert np.allclose(totals, [120, 31.4, 16.6, 1.9], atol=0.05)


@given(psi=st.integers(0, 10**12), n_d=st.integers(1, 4096))
def test_formula_properties(psi, n_d):
    held = [sum(zero_memory_formula(s, psi, n_d).values()) for s in ZERO_STAGES]
    sent = [zero_comm_formula(s, psi, n_d) for s in ZERO_STAGES]
    assert held[0] >= held[1] >= held[2] >= held[3]
    assert np.isclose(held[3], 16 * psi / n_d) and held[0] == 16 * psi
    assert sent[0] == sent[1] == sent[2] and np.isclose(sent[3], 1.5 * sent[0])


def test_bytes_per_parameter():
    assert state_bytes_per_parameter("mixed", "adam") == (2, 2, 12)
    assert state_bytes_per_parameter("fp64", "adam") == (8, 8, 16)
    assert state_bytes_per_parameter("mixed", "sgd") == (2, 2, 4)
    assert state_bytes_per_parameter("fp64", "momentum") == (8, 8, 8)


def test_fsdp_units_are_the_layers_in_forward_order():
    units = fsdp_units(MLP([3, 4, 2]))
    assert units == [("layer0", [("layer0.weight", (3, 4)), ("layer0.bias", (4,))]),
                     ("layer1", [("layer1.weight", (4, 2)), ("layer1.bias", (2,))])]


# -- real engines -------------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["threads", "processes"])
def test_real_engines_give_the_simulators_bits_and_bytes(engine):
    for stage in (0, 3):
        model, X, y, batches = problem(SIZES)
        real = zero_train(stage, model, X, y, batches, 3, engine=engine, lr=LR, timeout=60)
        simulated = train(stage, 3)
        assert_same_bits(real, simulated)
        assert np.array_equal(real.bytes_sent, simulated.bytes_sent)
        assert [m["peak"] for m in real.memory] == [m["peak"] for m in simulated.memory]


# -- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("stage", [-1, 4, 1.5, "1", True, None])
def test_stage_outside_0_to_3_is_refused(stage):
    model, X, y, batches = problem(SIZES)
    with pytest.raises(ValueError, match=r"stage must be one of 0, 1, 2, 3"):
        zero_train(stage, model, X, y, batches, 2, network=LINK)
    with pytest.raises(ValueError, match=r"stage must be one of"):
        zero_memory_formula(stage, 10, 2)
    with pytest.raises(ValueError, match=r"stage must be one of"):
        zero_comm_formula(stage, 10, 2)


def test_bad_arguments_name_the_problem():
    model, X, y, batches = problem(SIZES)
    with pytest.raises(ValueError, match="unknown precision 'bf16'"):
        zero_train(1, model, X, y, batches, 2, network=LINK, precision="bf16")
    with pytest.raises(ValueError, match="'lamb' cannot be sharded elementwise"):
        zero_train(1, model, X, y, batches, 2, network=LINK, optimizer="lamb")
    with pytest.raises(ValueError, match="unknown loss 'hinge'"):
        zero_train(1, model, X, y, batches, 2, network=LINK, loss="hinge")
    with pytest.raises(ValueError, match=r"X must have shape \(examples, 23\).*\(96, 22\)"):
        zero_train(1, model, X[:, :22], y, batches, 2, network=LINK)
    with pytest.raises(ValueError, match="one label per row of X: 96 rows, 95 labels"):
        zero_train(1, model, X, y[:95], batches, 2, network=LINK)
    frozen = MLP(SIZES, seed=0)
    frozen.frozen.add("layer0.bias")
    with pytest.raises(ValueError, match="frozen parameters are not supported"):
        zero_train(1, frozen, X, y, batches, 2, network=LINK)
    with pytest.raises(ValueError, match="world_size must be an integer ≥ 1, got 0"):
        zero_train(1, model, X, y, batches, 0, network=LINK)
    with pytest.raises(ValueError, match="network"):
        zero_train(1, model, X, y, batches, 2, engine="threads", network=LINK)
    with pytest.raises(ValueError, match="n_params must be an integer ≥ 0, got -1"):
        zero_memory_formula(1, -1, 2)
    with pytest.raises(ValueError, match="world_size must be an integer ≥ 1, got 0"):
        zero_comm_formula(1, 10, 0)
    with pytest.raises(ValueError, match="optimizer_bytes must be ≥ 0"):
        zero_memory_formula(1, 10, 2, optimizer_bytes=-4)


def test_bad_arguments_are_refused_by_the_rank_program_too():
    model, X, y, batches = problem(SIZES)
    with pytest.raises(RankError, match="stage must be one of"):
        run(zero_data_parallel, 2, network=LINK, args=(5, model, X, y, batches))


def test_an_empty_batch_is_an_error_naming_the_step():
    model, X, y, batches = problem(SIZES)
    with pytest.raises(RankError, match="step 1: the batch is empty"):
        zero_train(2, model, X, y, [batches[0], np.array([], dtype=int)], 2, network=LINK)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
def test_fp16_overflow_stops_training_with_a_clear_error():
    model, X, y, batches = problem(SIZES)
    with pytest.raises(RankError, match="non-finite gradient in layer.*lower the loss scale"):
        zero_train(3, model, X * 1e9, y, batches, 2, network=LINK)


# -- stage 3 with prefetch (FSDP's one layer ahead) ---------------------------------------------

def timed(world_size, seconds_per_flop, prefetch, steps=1):
    model, X, y, batches = problem(SIZES, batch=12, steps=steps)
    return zero_train(3, model, X, y, batches, world_size, network=LINK, lr=LR,
                      seconds_per_flop=seconds_per_flop, prefetch=prefetch)


@pytest.mark.parametrize("precision", ["mixed", "fp64"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("sizes", [SIZES, ODD_SIZES])
def test_prefetch_keeps_the_updates_bit_identical_to_plain_data_parallel(precision, world_size,
                                                                         sizes):
    plain = train(0, world_size, sizes, precision)
    for seconds_per_flop in (0.0, 1e-9):
        ahead = train(3, world_size, sizes, precision, prefetch=True,
                      seconds_per_flop=seconds_per_flop)
        assert_same_bits(ahead, plain)
        assert np.array_equal(ahead.bytes_sent, train(3, world_size, sizes, precision).bytes_sent)


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("seconds_per_flop", [2e-9, 1e-10, 0.0])
def test_step_time_equals_the_alpha_beta_prediction_with_and_without_prefetch(world_size,
                                                                            seconds_per_flop):
    model = problem(SIZES)[0]
    seconds = fsdp_layer_seconds(model, world_size, LINK, 12 // world_size, seconds_per_flop)
    for prefetch in (False, True):
        for steps in (1, 3):
            measured = timed(world_size, seconds_per_flop, prefetch, steps).time
            assert measured == pytest.approx(steps * fsdp_step_prediction(seconds, prefetch),
                                             rel=1e-9)


def test_prefetch_hides_the_gathers_when_compute_dominates_and_the_compute_when_not():
    model = problem(SIZES)[0]
    for per_flop in (1e-8, 1e-11):
        seconds = fsdp_layer_seconds(model, 4, LINK, 3, per_flop)
        g, f, b = seconds["gather"], seconds["forward"], seconds["backward"]
        saved = timed(4, per_flop, False).time - timed(4, per_flop, True).time
        if per_flop == 1e-8:     # every gather is shorter than the compute it runs beside
            assert all(g[i + 1] < f[i] for i in range(len(g) - 1))
            assert all(g[i - 1] < b[i] for i in range(1, len(g)))
            assert saved == pytest.approx(2 * sum(g) - g[0] - g[-1], rel=1e-9)
        else:                    # every gather is longer: the compute hides instead
            assert max(max(f), max(b)) < min(g)
            assert saved == pytest.approx(sum(f) + sum(b) - f[-1] - b[0], rel=1e-9)
        assert saved > 0


def test_with_prefetch_a_gather_runs_during_compute_on_the_same_rank():
    trace = timed(3, 2e-9, True).trace
    computes = [r for r in trace.of_rank(0) if r.op == "compute"]
    exchanges = [r for r in trace.of_rank(0) if r.op == "sendrecv"]
    overlapping = [e for e in exchanges
                   if any(c.start <= e.start < c.end for c in computes)]
    assert len(overlapping) == 2 * 2 * (3 - 1)      # 2 layers ahead per pass, 2 ring steps
    plain = timed(3, 2e-9, False).trace
    assert not any(c.start <= e.start < c.end for c in plain.of_rank(0) if c.op == "compute"
                   for e in plain.of_rank(0) if e.op == "sendrecv")


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_prefetch_holds_two_gathered_layers_instead_of_one(world_size):
    layer_bytes = [2 * n for n in layer_sizes(SIZES)]                   # fp16 weights
    plain = timed(world_size, 1e-9, False).memory
    ahead = timed(world_size, 1e-9, True).memory
    assert {m["gathered_peak"] for m in plain} == {max(layer_bytes)}
    assert {m["gathered_peak"] for m in ahead} == {max(a + b for a, b in
                                                       zip(layer_bytes, layer_bytes[1:]))}


def test_prefetch_arguments_are_checked():
    model, X, y, batches = problem(SIZES)
    with pytest.raises(ValueError, match="prefetch=True needs stage 3.*got stage 2"):
        zero_train(2, model, X, y, batches, 2, network=LINK, prefetch=True)
    with pytest.raises(ValueError, match="prefetch must be True or False, got 'yes'"):
        zero_train(3, model, X, y, batches, 2, network=LINK, prefetch="yes")
    with pytest.raises(ValueError, match="prefetch runs on engine 'sim' only.*'threads'"):
        zero_train(3, model, X, y, batches, 2, engine="threads", prefetch=True)
    with pytest.raises(ValueError, match="need world_size ≥ 1"):
        fsdp_layer_seconds(model, 0, LINK, 4, 1e-9)
