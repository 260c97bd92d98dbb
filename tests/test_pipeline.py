"""Pipeline parallelism (dsml.pipeline): schedules, their simulation, and the NumPy executor.

Schedules are checked by counting their ops and by reading the simulated timeline against the
dependencies written out here; bubbles and peaks measured on the simulator are held against
the published closed forms where those hold exactly, and against a flow-shop calculation where
they must not (unequal stages, paid messages); gradients are held against unpipelined
`loss_and_grads`.
"""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsml.pipeline as pipeline
from dsml.net.alphabeta import AlphaBeta
from dsml.pipeline import (SCHEDULES, Op, bubble_formula, check_schedule, pipeline_gradients,
                           schedule, simulate, split_layers)
from dsml.train import MLP, loss_and_grads

T_F, T_B = 1e-3, 2e-3


def cases(max_stages=5, microbatches=(1, 2, 3, 4, 5, 8, 12)):
    """(name, p, m, v) for every schedule, including m < p and p = 1."""
    for name in SCHEDULES:
        for p in range(1, max_stages + 1):
            for m in microbatches:
                for v in ((1, 2, 3) if name == "interleaved" else (1,)):
                    if name == "interleaved" and m % p:
                        continue
                    yield name, p, m, v


ALL_CASES = list(cases())


# ---------------------------------------------------------------- schedules as data

@pytest.mark.parametrize("name,p,m,v", ALL_CASES)
def test_every_stage_runs_every_op_exactly_once(name, p, m, v):
    ops = schedule(name, p, m, v)
    assert len(ops) == p
    wanted = sorted(itertools.product(range(m), range(v)))
    for stage_ops in ops:
        for kind in ("F", "B"):
            ran = sorted((op.microbatch, op.chunk) for op in stage_ops if op.kind == kind)
            assert ran == wanted
        weights = sorted((op.microbatch, op.chunk) for op in stage_ops if op.kind == "W")
        assert weights == (wanted if name == "zb-h1" else [])
        assert len(stage_ops) == len(wanted) * (3 if name == "zb-h1" else 2)
    check_schedule(ops, m, v)


def dependencies(op, stage, p, v):
    """What `op` waits for, written independently of the module: (kind, micro-batch, piece)."""
    piece = op.chunk * p + stage
    if op.kind == "F":
        return [("F", op.microbatch, piece - 1)] if piece else []
    if op.kind == "B":
        after_own_forward = [("F", op.microbatch, piece)]
        if piece < p * v - 1:
            return after_own_forward + [("B", op.microbatch, piece + 1)]
        return after_own_forward
    return [("B", op.microbatch, piece)]


@pytest.mark.parametrize("name,p,m,v", list(cases(max_stages=4, microbatches=(1, 3, 4, 8))))
def test_simulated_timeline_respects_dependencies(name, p, m, v):
    rng = np.random.default_rng(p * 100 + m * 10 + v)
    forward = list(rng.uniform(0.5e-3, 2e-3, p))
    backward = list(rng.uniform(1e-3, 4e-3, p))
    run = simulate(name, p, m, forward, backward, chunks=v, t_comm=5e-5)
    ends = {}
    for stage, spans in enumerate(run.timeline):
        assert [span.op for span in spans] == schedule(name, p, m, v)[stage]   # ran in order
        for before, after in zip(spans, spans[1:]):
            assert after.start >= before.end                     # one op at a time per stage
        for span in spans:
            ends[(span.op.kind, span.op.microbatch, span.op.chunk * p + stage)] = span.end
    for stage, spans in enumerate(run.timeline):
        for span in spans:
            for need in dependencies(span.op, stage, p, v):
                assert span.start >= ends[need], (span, need)


def test_schedules_are_deterministic_and_simulations_repeat():
    assert schedule("zb-h1", 4, 9) == schedule("zb-h1", 4, 9)
    first = simulate("interleaved", 3, 6, [1e-3, 2e-3, 1e-3], 2e-3, chunks=2, t_comm=1e-4)
    second = simulate("interleaved", 3, 6, [1e-3, 2e-3, 1e-3], 2e-3, chunks=2, t_comm=1e-4)
    assert first.timeline == second.timeline
    assert first.result.trace.rows == second.result.trace.rows


def test_one_f_one_b_and_zb_h1_orders_are_the_published_ones():
    assert [op.label() for op in schedule("1f1b", 3, 4)[0]] == \
        "F0 F1 F2 B0 F3 B1 B2 B3".split()
    # ZB-H1: the last stage postpones its first p − 1 W's to the end; stage 0 none.
    assert [op.label() for op in schedule("zb-h1", 3, 4)[2]] == \
        "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3".split()
    assert [op.label() for op in schedule("zb-h1", 3, 4)[0]] == \
        "F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3".split()
    # Interleaved (Megatron-LM order): groups of p micro-batches per chunk.
    assert [op.label() for op in schedule("interleaved", 2, 2, 2)[1]][:4] == \
        "F0 F1 F0c1 B0c1".split()


# ---------------------------------------------------------------- check_schedule

def test_check_schedule_refuses_broken_schedules():
    good = schedule("1f1b", 2, 2)
    with pytest.raises(ValueError, match="missing"):
        check_schedule([good[0][:-1], good[1]], 2)
    with pytest.raises(ValueError, match="repeated"):
        check_schedule([good[0] + [Op("F", 0)], good[1]], 2)
    with pytest.raises(ValueError, match="kind 'X'"):
        check_schedule([good[0] + [Op("X", 0)], good[1]], 2)
    with pytest.raises(ValueError, match="out of range"):
        check_schedule([good[0][:-1] + [Op("B", 7)], good[1]], 2)
    with pytest.raises(ValueError, match="stage 1 must run W"):   # W on some stages only
        check_schedule([good[0] + [Op("W", 0), Op("W", 1)], good[1]], 2)
    impatient = [[Op("F", 0), Op("B", 0), Op("F", 1), Op("B", 1)],
                 [Op("F", 0), Op("F", 1), Op("B", 0), Op("B", 1)]]
    with pytest.raises(ValueError, match="stage 0 waits at B0.*stage 1 waits at F1"):
        check_schedule(impatient, 2)
    with pytest.raises(ValueError, match="cannot run"):           # B before its own F
        check_schedule([[Op("B", 0), Op("F", 0)]], 1)
    with pytest.raises(ValueError, match="at least one stage"):
        check_schedule([], 1)


def test_custom_schedule_runs_and_a_broken_one_is_refused():
    # GPipe with the backwards in reverse micro-batch order (as drawn in the GPipe paper).
    reverse = [[Op("F", mb) for mb in range(4)] + [Op("B", mb) for mb in reversed(range(4))]
               for _ in range(3)]
    run = simulate(reverse, 3, 4, T_F, T_B)
    assert run.name == "custom"
    assert abs(run.bubble_fraction - 2 / 6) < 1e-12
    with pytest.raises(ValueError, match="stage lists"):
        simulate(reverse, 2, 4, T_F, T_B)
    with pytest.raises(ValueError, match="cannot run"):
        simulate([[Op("B", 0), Op("F", 0)]], 1, 1, T_F, T_B)


# ---------------------------------------------------------------- measured against formulas

@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("t_forward,t_backward", [(1e-3, 2e-3), (1e-3, 1e-3), (2e-3, 1e-3),
                                                  (0.3e-3, 1.7e-3)])
def test_gpipe_and_1f1b_bubble_is_the_formula(name, t_forward, t_backward):
    for p in (1, 2, 3, 4, 7, 8):
        for m in (1, 2, 3, 5, 8, 13, 32):
            run = simulate(name, p, m, t_forward, t_backward)
            assert abs(run.bubble_fraction - (p - 1) / (m + p - 1)) < 1e-12
            assert abs(run.makespan - (m + p - 1) * (t_forward + t_backward)) < 1e-12
            assert abs(run.bubble_fraction - bubble_formula(name, p, m)) < 1e-12


@pytest.mark.parametrize("p,m", [(1, 1), (1, 5), (2, 1), (3, 2), (4, 4), (4, 8), (5, 3), (8, 13)])
def test_peak_inflight_gpipe_holds_m_and_1f1b_holds_min_p_minus_i_m(p, m):
    assert simulate("gpipe", p, m, T_F, T_B).peak_inflight == [m] * p
    assert simulate("1f1b", p, m, T_F, T_B).peak_inflight == [min(p - i, m) for i in range(p)]


def test_interleaved_bubble_is_megatrons_and_costs_v_times_the_messages():
    for p in (1, 2, 3, 4, 8):
        for v in (1, 2, 3, 4):
            for m in (p, 2 * p, 3 * p, 8 * p):
                run = simulate("interleaved", p, m, T_F, T_B, chunks=v)
                x = (p - 1) / (v * m)
                assert abs(run.bubble_over_ideal - x) < 1e-12
                assert abs(run.bubble_fraction - x / (1 + x)) < 1e-12
                sends = sum(1 for r in run.result.trace if r.op == "send")
                assert sends == (2 * m * (p * v - 1) if p > 1 else 0)


def test_interleaved_equals_1f1b_with_one_chunk():
    assert schedule("interleaved", 4, 8, 1) == schedule("1f1b", 4, 8)


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
def test_zb_h1_bubble_is_a_third_of_1f1b_at_equal_f_b_w(p):
    for m in range(1, 4 * p + 1):
        zb = simulate("zb-h1", p, m, T_F, 2 * T_F)          # t_B = t_W = t_F by default
        one_f = simulate("1f1b", p, m, T_F, 2 * T_F)
        assert max(zb.peak_inflight) <= max(one_f.peak_inflight)
        assert zb.peak_inflight == [min(p, m)] * p
        assert zb.bubble_fraction < one_f.bubble_fraction
        ratio = zb.bubble_over_ideal / ((p - 1) / (3 * m))
        if m >= p:
            assert abs(ratio - 1) < 1e-9
            assert abs(one_f.bubble_over_ideal / zb.bubble_over_ideal - 3) < 1e-9
        else:                                  # no steady state: the "≈" of the paper
            assert ratio > 1 + 1e-6


def test_zb_h1_t_weight_and_per_stage_times_are_charged_per_op():
    run = simulate("zb-h1", 3, 4, [1e-3, 2e-3, 3e-3], [4e-3, 4e-3, 6e-3], t_weight=[1e-3, 3e-3, 0])
    expected = [{"F": 1e-3, "B": 3e-3, "W": 1e-3}, {"F": 2e-3, "B": 1e-3, "W": 3e-3},
                {"F": 3e-3, "B": 6e-3, "W": 0.0}]
    for stage, spans in enumerate(run.timeline):
        for span in spans:
            assert abs((span.end - span.start) - expected[stage][span.op.kind]) < 1e-15
    chunked = simulate("interleaved", 2, 2, [1e-3, 3e-3], 2e-3, chunks=2)
    for stage, spans in enumerate(chunked.timeline):
        for span in spans:
            want = ([1e-3, 3e-3][stage] if span.op.kind == "F" else 2e-3) / 2
            assert abs((span.end - span.start) - want) < 1e-15


def flow_shop_makespan(times, m):
    """m identical jobs through machines in order with these times: Σ t + (m − 1)·max t."""
    return sum(times) + (m - 1) * max(times)


def test_unequal_stages_depart_from_the_formula_as_a_flow_shop_predicts():
    p, m = 4, 8
    forward = [1e-3, 1e-3, 1e-3, 2e-3]
    backward = [2e-3, 2e-3, 2e-3, 4e-3]
    run = simulate("gpipe", p, m, forward, backward)
    # GPipe: the forwards are a flow shop; the last stage then runs its backwards at once,
    # and they flow back up as a second flow shop.
    expected = flow_shop_makespan(forward, m) + flow_shop_makespan(backward[::-1], m)
    assert abs(run.makespan - expected) < 1e-12
    busy = m * (np.array(forward) + np.array(backward))
    assert abs(run.bubble_fraction - (1 - busy.sum() / (p * expected))) < 1e-12
    assert run.bubble_fraction > bubble_formula("gpipe", p, m) + 0.1
    one_f = simulate("1f1b", p, m, forward, backward)
    assert one_f.bubble_fraction > bubble_formula("1f1b", p, m) + 0.1
    assert one_f.idle[-1] == min(one_f.idle)


def test_message_time_departs_from_the_formula_as_a_flow_shop_predicts():
    p, m, c = 4, 6, 0.1e-3
    run = simulate("gpipe", p, m, T_F, T_B, t_comm=c)
    # A send holds its stage for c: every stage but the last pays it after each forward,
    # every stage but the first after each backward.
    forward = [T_F + c] * (p - 1) + [T_F]
    backward = [T_B + c] * (p - 1) + [T_B]
    expected = flow_shop_makespan(forward, m) + flow_shop_makespan(backward, m)
    assert abs(run.makespan - expected) < 1e-12
    assert run.bubble_fraction > bubble_formula("gpipe", p, m) + 0.01
    # The same through a network model: messages of n bytes at β s/B cost what t_comm = nβ does.
    priced = simulate("gpipe", p, m, T_F, T_B, network=AlphaBeta(0.0, 1e-9), message_nbytes=100_000)
    assert abs(priced.makespan - expected) < 1e-12
    interleaved_free = simulate("interleaved", 4, 8, T_F, T_B, chunks=4)
    interleaved_paid = simulate("interleaved", 4, 8, T_F, T_B, chunks=4, t_comm=c)
    assert interleaved_paid.bubble_over_ideal > interleaved_free.bubble_over_ideal + 0.05


def test_simulation_never_asks_the_formula(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("a measurement called the closed form")
    monkeypatch.setattr(pipeline, "bubble_formula", forbidden)
    run = simulate("zb-h1", 4, 8, T_F, T_B)
    assert run.bubble_fraction > 0


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(SCHEDULES), p=st.integers(1, 6), groups=st.integers(1, 4),
       v=st.integers(1, 3), extra=st.integers(0, 5))
def test_property_valid_and_on_the_formula(name, p, groups, v, extra):
    if name == "interleaved":
        m = groups * p
    else:
        m, v = groups * p + extra, 1
    ops = schedule(name, p, m, v)
    check_schedule(ops, m, v)
    run = simulate(name, p, m, T_F, 2 * T_F, chunks=v)
    if name != "zb-h1" or m >= p:
        assert abs(run.bubble_fraction - bubble_formula(name, p, m, v)) < 1e-12
    assert sum(run.busy) == pytest.approx(p * m * 3 * T_F)


# ---------------------------------------------------------------- executor: real gradients

def batch(n=37, features=6, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, features)), rng.integers(0, classes, n)


@pytest.mark.parametrize("name,p,m,v", [
    ("gpipe", 1, 1, 1), ("gpipe", 3, 5, 1), ("gpipe", 9, 4, 1),
    ("1f1b", 2, 3, 1), ("1f1b", 4, 8, 1), ("1f1b", 5, 2, 1),
    ("interleaved", 1, 3, 4), ("interleaved", 2, 4, 4), ("interleaved", 3, 6, 3),
    ("interleaved", 4, 8, 2),
    ("zb-h1", 1, 2, 1), ("zb-h1", 3, 7, 1), ("zb-h1", 4, 8, 1), ("zb-h1", 6, 3, 1)])
@pytest.mark.parametrize("engine", ["sim", "threads"])
def test_pipelined_gradients_equal_unpipelined(name, p, m, v, engine):
    X, y = batch()                                  # 37 rows: micro-batches of unequal size
    model = MLP([6, 9, 8, 7, 8, 9, 7, 6, 8, 9, 8, 7, 4], activation="tanh", seed=3)  # 12 layers
    reference_loss, reference = loss_and_grads(model, X, y)
    got = pipeline_gradients(model, X, y, name, p, m, v, engine=engine)
    assert list(got.grads) == list(reference)
    for key in reference:
        np.testing.assert_allclose(got.grads[key], reference[key], rtol=1e-10, atol=1e-13)
    assert got.loss == pytest.approx(reference_loss, rel=1e-12)
    assert got.peak_held == got.run.peak_inflight     # kept arrays = timeline's count


def test_pipelined_gradients_mse_relu_frozen_and_exactly_as_many_layers_as_pieces():
    rng = np.random.default_rng(1)
    X, Y = rng.standard_normal((10, 3)), rng.standard_normal((10, 2))
    model = MLP([3, 5, 4, 2], activation="relu", seed=2)        # 3 layers on 3 stages
    model.frozen = {"layer1.bias"}
    reference_loss, reference = loss_and_grads(model, X, Y, loss="mse")
    for name in SCHEDULES:
        got = pipeline_gradients(model, X, Y, name, 3, 3 if name == "interleaved" else 4,
                                 loss="mse")
        assert list(got.grads) == list(reference) and "layer1.bias" not in got.grads
        for key in reference:
            np.testing.assert_allclose(got.grads[key], reference[key], rtol=1e-10, atol=1e-13)
        assert got.loss == pytest.approx(reference_loss, rel=1e-12)


def test_split_layers_cuts_like_array_split():
    assert split_layers(8, 3) == [range(0, 3), range(3, 6), range(6, 8)]
    assert split_layers(4, 4) == [range(i, i + 1) for i in range(4)]


# ---------------------------------------------------------------- bad input

def test_bad_schedule_arguments():
    with pytest.raises(ValueError,
                       match="unknown schedule 'pipedream'.*gpipe, 1f1b, interleaved, zb-h1"):
        schedule("pipedream", 2, 2)
    with pytest.raises(ValueError, match="unknown schedule"):
        simulate("GPipe", 2, 2, T_F, T_B)
    with pytest.raises(ValueError, match="stages must be an integer ≥ 1, got 0"):
        schedule("gpipe", 0, 2)
    with pytest.raises(ValueError, match="microbatches must be an integer ≥ 1, got 0"):
        simulate("1f1b", 2, 0, T_F, T_B)
    with pytest.raises(ValueError, match="stages must be an integer ≥ 1, got 2.5"):
        schedule("gpipe", 2.5, 2)
    with pytest.raises(ValueError, match="chunks must be an integer ≥ 1, got 0"):
        schedule("interleaved", 2, 2, 0)
    with pytest.raises(ValueError, match="chunks = 2 needs the 'interleaved' schedule"):
        schedule("1f1b", 2, 2, 2)
    with pytest.raises(ValueError, match="chunks = 2 needs the 'interleaved' schedule"):
        bubble_formula("zb-h1", 2, 2, 2)
    with pytest.raises(ValueError, match="multiple of stages.*microbatches = 6, stages = 4"):
        schedule("interleaved", 4, 6, 2)
    with pytest.raises(ValueError, match="unknown schedule"):
        bubble_formula("zero", 2, 2)


def test_bad_times():
    with pytest.raises(ValueError, match="t_forward must be finite and ≥ 0 seconds, got -0.001"):
        simulate("gpipe", 2, 2, -1e-3, T_B)
    with pytest.raises(ValueError, match="t_backward must be finite"):
        simulate("gpipe", 2, 2, T_F, float("nan"))
    with pytest.raises(ValueError, match="t_forward must be one number or a list of 3 .*got 2"):
        simulate("gpipe", 3, 2, [T_F, T_F], T_B)
    with pytest.raises(ValueError, match="t_backward must be one number or a list of 2"):
        simulate("1f1b", 2, 2, T_F, [T_B, T_B, T_B])
    with pytest.raises(ValueError, match="only a schedule with W ops"):
        simulate("1f1b", 2, 2, T_F, T_B, t_weight=1e-3)
    with pytest.raises(ValueError, match="cannot exceed"):
        simulate("zb-h1", 2, 2, T_F, T_B, t_weight=3e-3)
    with pytest.raises(ValueError, match="t_comm must be finite and ≥ 0"):
        simulate("gpipe", 2, 2, T_F, T_B, t_comm=-1.0)
    with pytest.raises(ValueError, match="either t_comm or a network"):
        simulate("gpipe", 2, 2, T_F, T_B, t_comm=1e-6, network=AlphaBeta(1e-6, 0.0))


def test_bad_executor_arguments():
    X, y = batch(n=6)
    model = MLP([6, 5, 4], seed=0)                 # 2 layers
    with pytest.raises(ValueError, match="2 layers, fewer than the 3 pipeline pieces"):
        pipeline_gradients(model, X, y, "gpipe", 3, 2)
    with pytest.raises(ValueError, match="2 layers, fewer than the 4 pipeline pieces"):
        pipeline_gradients(model, X, y, "interleaved", 2, 2, chunks=2)
    with pytest.raises(ValueError, match="6 examples cannot make 7 non-empty micro-batches"):
        pipeline_gradients(model, X, y, "gpipe", 2, 7)
    with pytest.raises(ValueError, match="unknown loss 'hinge'"):
        pipeline_gradients(model, X, y, "gpipe", 2, 2, loss="hinge")
    with pytest.raises(ValueError, match="engine must be 'sim' or 'threads'"):
        pipeline_gradients(model, X, y, "gpipe", 2, 2, engine="processes")
    with pytest.raises(ValueError, match="X has 6 rows but y has 5"):
        pipeline_gradients(model, X, y[:5], "gpipe", 2, 2)
