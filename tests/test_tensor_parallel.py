"""Plumbing (hand-written): tests for dsml.tensor_parallel — Megatron-style tensor parallelism of a
transformer block (week 5).

The independent reference is the unsharded layer: dsml.train.transformer's TransformerBlock (itself
checked against finite differences and PyTorch autograd in tests/test_transformer.py) and plain
NumPy matmuls for the linear layers. Against it:
- column-parallel and row-parallel linear layers, the Megatron MLP, head-parallel attention and
  the whole block give the same output, input gradient and every parameter gradient (shards
  gathered) for tp = 1, 2, 4 and the uneven 3, over several shapes and seeds (and a hypothesis
  sweep of shapes with every tp from 1 to heads), on the simulator, on threads (bit for bit the
  simulator's numbers) and on processes; t = 1 is bit-exact;
- the traces hold exactly one all-reduce per sub-layer and pass (column-parallel: 0 forward,
  1 backward; row-parallel: 1 and 0; MLP and attention: 1 and 1; block: 2 and 2);
- the bytes each rank sends equal the model 4·2(t−1)/t·b·s·h·8 (mean over ranks), and the
  simulated communication time equals 4 closed-form all-reduces when the ring's blocks are
  equal — and departs from it, measurably and within a bound, when b·s·h is not divisible by
  t, when recursive doubling runs on a non-power-of-two t, and when heads split unevenly (the
  busiest rank sets the pace);
- sequence parallelism (Korthikanti et al. 2022): the block with LayerNorms on s/t positions,
  all-gather and reduce-scatter in place of the all-reduces, equals the unsharded block for
  t = 1, 2, 4 (both keeping and re-gathering the column-parallel inputs) and on threads the
  simulator bit for bit; it refuses a sequence t does not divide; it sends the all-reduce
  version's bytes plus the LayerNorm gradients' all-reduce (plus two all-gathers when it
  re-gathers); the activation bytes a rank keeps equal Korthikanti's rows in dsml.memory,
  dropout removed (our block has none);
- bad input fails with a clear error: mismatched shapes, more ranks than heads or columns,
  heads not dividing hidden, shards cut for another world size, wrong parameter sets.

The tolerance is relative, 1e-12: the ranks add the same products in another order.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsml
from dsml import RankError
from dsml.collectives import cost
from dsml.model_config import TransformerConfig
from dsml.memory import activation_bytes_per_layer
from dsml.net import AlphaBeta
from dsml.sim import Trace
from dsml.tensor_parallel import (ALLREDUCES_PER_BLOCK, BLOCK_PARTITION, ColumnParallelLinear,
                                  ParallelAttention, ParallelMLP, RowParallelLinear,
                                  TensorParallelBlock, allreduce_nbytes, block_forward_flops,
                                  bytes_sent, count_collectives, gather_block_grads,
                                  parallel_block_step, qkv_columns, sequence_shard, shard_block_params, shard_range, shard_sizes,
                                  tensor_parallel_block_step, tp_block_bytes_per_rank,
                                  tp_block_comm_seconds)
from dsml.train.transformer import (TransformerBlock, causal_attention_backward,
                                    causal_attention_forward, gelu, gelu_grad, linear_backward)
from leaks import nothing_left_behind  # noqa: F401

NET = AlphaBeta(alpha=2e-6, beta=1e-9)
TOLERANCE = 1e-12
FLOP_RATE = 1e9          # FLOP/s charged by the layers when we count bursts or time compute
TIMEOUT = 60.0
# (batch, seq, hidden, heads): heads 4 split by 1, 2, 4 and unevenly by 3; 6 heads by 4 unevenly.
BLOCK_SHAPES = [(2, 5, 16, 4), (1, 3, 12, 4), (3, 4, 24, 6), (1, 1, 8, 4)]


def perturbed_block(hidden, heads, seed):
    block = TransformerBlock(hidden, heads, seed=seed)
    rng = np.random.default_rng(seed + 1)
    for value in block.params.values():
        value += 0.3 * rng.standard_normal(value.shape)
    return block


def close(got, want, tolerance=TOLERANCE):
    scale = max(float(np.max(np.abs(want))), 1e-300)
    return float(np.max(np.abs(got - want))) / scale < tolerance


def block_problem(batch, seq, hidden, heads, seed):
    """(block params, x, upstream, reference y, reference dx, reference grads)."""
    block = perturbed_block(hidden, heads, seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, seq, hidden))
    upstream = rng.standard_normal((batch, seq, hidden))
    y = block.forward(x)
    dx, grads = block.backward_with_input(upstream)
    return block.params, x, upstream, y, dx, grads


def run(program, tp, engine="sim", args=()):
    if engine == "sim":
        return dsml.run(program, tp, network=NET, args=args)
    return dsml.run(program, tp, engine=engine, args=args, timeout=TIMEOUT)


# --- cutting ---------------------------------------------------------------------------------

@pytest.mark.parametrize("total", [1, 2, 5, 7, 12, 13])
def test_shard_sizes_and_ranges_cut_as_array_split(total):
    for tp in range(1, total + 1):
        expected = [len(a) for a in np.array_split(np.arange(total), tp)]
        assert shard_sizes(total, tp) == expected
        ranges = [shard_range(total, tp, r) for r in range(tp)]
        assert [stop - start for start, stop in ranges] == expected
        assert ranges[0][0] == 0 and ranges[-1][1] == total
        assert all(ranges[r][1] == ranges[r + 1][0] for r in range(tp - 1))


@pytest.mark.parametrize("hidden,heads,tp", [(12, 3, 3), (16, 4, 3), (8, 8, 8), (12, 6, 4)])
def test_qkv_columns_give_each_rank_its_heads_q_k_v_and_cover_every_column_once(hidden, heads, tp):
    d = hidden // heads
    columns = [qkv_columns(hidden, heads, tp, r) for r in range(tp)]
    assert sorted(np.concatenate(columns).tolist()) == list(range(3 * hidden))
    for r, mine in enumerate(columns):
        first, last = shard_range(heads, tp, r)
        q = list(range(first * d, last * d))
        assert mine.tolist() == q + [hidden + c for c in q] + [2 * hidden + c for c in q]


@pytest.mark.parametrize("tp", [1, 2, 3, 4])
def test_gather_inverts_shard(tp):
    params = perturbed_block(16, 4, seed=tp).params
    shards = [shard_block_params(params, 4, tp, r) for r in range(tp)]
    gathered = gather_block_grads(shards, 4)
    assert list(gathered) == list(params)
    assert all(np.array_equal(gathered[n], params[n]) for n in params)
    per_rank = sum(sum(a.size for n, a in s.items() if BLOCK_PARTITION[n] != "replicated")
                   for s in shards)
    assert per_rank == sum(a.size for n, a in params.items() if BLOCK_PARTITION[n] != "replicated")


# --- the linear layers against NumPy ---------------------------------------------------------

def column_program(comm, weight, bias, x, dy_full):
    layer = ColumnParallelLinear.from_full(weight, bias, comm.size, comm.rank)
    y = yield from layer.forward(comm, x)
    start, stop = shard_range(weight.shape[1], comm.size, comm.rank)
    dx, grads = yield from layer.backward(comm, dy_full[..., start:stop])
    return y, dx, grads


def row_program(comm, weight, bias, x_full, dz):
    layer = RowParallelLinear.from_full(weight, bias, comm.size, comm.rank)
    start, stop = shard_range(weight.shape[0], comm.size, comm.rank)
    z = yield from layer.forward(comm, x_full[..., start:stop])
    dx, grads = yield from layer.backward(comm, dz)
    return z, dx, grads


@pytest.mark.parametrize("tp", [1, 2, 3, 4])
@pytest.mark.parametrize("n_in,n_out,seed", [(6, 8, 0), (5, 7, 1), (4, 4, 2)])
def test_column_parallel_linear_equals_the_whole_layer(tp, n_in, n_out, seed):
    rng = np.random.default_rng(seed)
    weight, bias = rng.standard_normal((n_in, n_out)), rng.standard_normal(n_out)
    x, dy = rng.standard_normal((2, 3, n_in)), rng.standard_normal((2, 3, n_out))
    dx_ref, dw_ref, db_ref = linear_backward(dy, x, weight)
    values = run(column_program, tp, args=(weight, bias, x, dy)).values
    assert close(np.concatenate([v[0] for v in values], axis=-1), x @ weight + bias)
    for v in values:
        assert close(v[1], dx_ref)                          # f's all-reduce: the whole dx
    assert close(np.concatenate([v[2]["weight"] for v in values], axis=1), dw_ref)
    assert close(np.concatenate([v[2]["bias"] for v in values]), db_ref)


@pytest.mark.parametrize("tp", [1, 2, 3, 4])
@pytest.mark.parametrize("n_in,n_out,seed", [(8, 6, 0), (7, 5, 1), (4, 4, 2)])
def test_row_parallel_linear_equals_the_whole_layer(tp, n_in, n_out, seed):
    rng = np.random.default_rng(seed)
    weight, bias = rng.standard_normal((n_in, n_out)), rng.standard_normal(n_out)
    x, dz = rng.standard_normal((2, 3, n_in)), rng.standard_normal((2, 3, n_out))
    dx_ref, dw_ref, db_ref = linear_backward(dz, x, weight)
    values = run(row_program, tp, args=(weight, bias, x, dz)).values
    for v in values:
        assert close(v[0], x @ weight + bias)               # bias added once, after the sum
        assert close(v[2]["bias"], db_ref)                  # replicated bias, whole gradient
    assert close(np.concatenate([v[1] for v in values], axis=-1), dx_ref)
    assert close(np.concatenate([v[2]["weight"] for v in values], axis=0), dw_ref)


# --- MLP and attention -----------------------------------------------------------------------

def mlp_program(comm, p, x, dz, flop_rate=None):
    layer = ParallelMLP.from_full(p["mlp.fc.weight"], p["mlp.fc.bias"], p["mlp.proj.weight"],
                                  p["mlp.proj.bias"], comm.size, comm.rank, flop_rate=flop_rate)
    z = yield from layer.forward(comm, x)
    forward_end = yield comm.now()
    dx, grads = yield from layer.backward(comm, dz)
    return z, dx, grads, forward_end


def attention_program(comm, p, heads, x, dz, flop_rate=None):
    layer = ParallelAttention.from_full(p["attn.qkv.weight"], p["attn.qkv.bias"],
                                        p["attn.proj.weight"], p["attn.proj.bias"], heads,
                                        comm.size, comm.rank, flop_rate=flop_rate)
    z = yield from layer.forward(comm, x)
    forward_end = yield comm.now()
    dx, grads = yield from layer.backward(comm, dz)
    return z, dx, grads, forward_end


@pytest.mark.parametrize("tp", [1, 2, 3, 4])
def test_megatron_mlp_equals_the_unsharded_mlp(tp):
    hidden, rng = 8, np.random.default_rng(tp)
    p = perturbed_block(hidden, 2, seed=tp).params
    x, dz = rng.standard_normal((2, 5, hidden)), rng.standard_normal((2, 5, hidden))
    pre = x @ p["mlp.fc.weight"] + p["mlp.fc.bias"]
    z_ref = gelu(pre) @ p["mlp.proj.weight"] + p["mlp.proj.bias"]
    dh, dw2, db2 = linear_backward(dz, gelu(pre), p["mlp.proj.weight"])
    dx_ref, dw1, db1 = linear_backward(dh * gelu_grad(pre), x, p["mlp.fc.weight"])
    values = run(mlp_program, tp, args=(p, x, dz)).values
    for z, dx, _, _ in values:
        assert close(z, z_ref) and close(dx, dx_ref)
    grads = [v[2] for v in values]
    assert close(np.concatenate([g["fc.weight"] for g in grads], axis=1), dw1)
    assert close(np.concatenate([g["fc.bias"] for g in grads]), db1)
    assert close(np.concatenate([g["proj.weight"] for g in grads], axis=0), dw2)
    assert all(close(g["proj.bias"], db2) for g in grads)


@pytest.mark.parametrize("tp,heads", [(1, 4), (2, 4), (4, 4), (3, 4), (4, 6)])
def test_head_parallel_attention_equals_unsharded_attention(tp, heads):
    hidden, rng = 12, np.random.default_rng(tp + heads)
    p = perturbed_block(hidden, heads, seed=tp).params
    x, dz = rng.standard_normal((2, 4, hidden)), rng.standard_normal((2, 4, hidden))
    qkv = x @ p["attn.qkv.weight"] + p["attn.qkv.bias"]
    out, cache = causal_attention_forward(qkv, heads)
    z_ref = out @ p["attn.proj.weight"] + p["attn.proj.bias"]
    dout, dw_proj, db_proj = linear_backward(dz, out, p["attn.proj.weight"])
    dx_ref, dw_qkv, db_qkv = linear_backward(causal_attention_backward(dout, cache), x,
                                             p["attn.qkv.weight"])
    values = run(attention_program, tp, args=(p, heads, x, dz)).values
    for z, dx, _, _ in values:
        assert close(z, z_ref) and close(dx, dx_ref)
    grads = [v[2] for v in values]
    columns = [qkv_columns(hidden, heads, tp, r) for r in range(tp)]
    gathered_w, gathered_b = np.zeros_like(dw_qkv), np.zeros_like(db_qkv)
    for r, g in enumerate(grads):
        gathered_w[:, columns[r]], gathered_b[columns[r]] = g["qkv.weight"], g["qkv.bias"]
    assert close(gathered_w, dw_qkv) and close(gathered_b, db_qkv)
    assert close(np.concatenate([g["proj.weight"] for g in grads], axis=0), dw_proj)
    assert all(close(g["proj.bias"], db_proj) for g in grads)


# --- the whole block ---------------------------------------------------------------------------

def check_block_run(result, heads, y, dx, grads, tp):
    values = result.values
    for v in values:                                       # replicated outputs: the same bits
        assert np.array_equal(v["output"], values[0]["output"])
        assert np.array_equal(v["input_grad"], values[0]["input_grad"])
    gathered = gather_block_grads([v["grads"] for v in values], heads)
    if tp == 1:                                            # one rank: the very same arithmetic
        assert np.array_equal(values[0]["output"], y)
        assert np.array_equal(values[0]["input_grad"], dx)
        assert all(np.array_equal(gathered[n], grads[n]) for n in grads)
    assert close(values[0]["output"], y)
    assert close(values[0]["input_grad"], dx)
    for name in grads:
        assert close(gathered[name], grads[name]), name


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("batch,seq,hidden,heads", BLOCK_SHAPES)
@pytest.mark.parametrize("tp", [1, 2, 4, 3])
def test_split_block_equals_the_unsharded_block_on_the_simulator(tp, batch, seq, hidden, heads,
                                                                  seed):
    params, x, upstream, y, dx, grads = block_problem(batch, seq, hidden, heads, seed)
    result = run(tensor_parallel_block_step, tp, args=(params, heads, x, upstream))
    check_block_run(result, heads, y, dx, grads, tp)


@settings(max_examples=30, deadline=None)
@given(heads=st.integers(1, 5), head_width=st.integers(1, 3), batch=st.integers(1, 2),
       seq=st.integers(1, 4), tp_choice=st.integers(0, 4), seed=st.integers(0, 2**16))
def test_split_block_equals_the_unsharded_block_for_any_shape(heads, head_width, batch, seq,
                                                                tp_choice, seed):
    tp = 1 + tp_choice % heads                      # every tp from 1 to heads, even or not
    params, x, upstream, y, dx, grads = block_problem(batch, seq, heads * head_width, heads, seed)
    result = run(tensor_parallel_block_step, tp, args=(params, heads, x, upstream))
    check_block_run(result, heads, y, dx, grads, tp)


@pytest.mark.parametrize("tp", [2, 4])
def test_split_block_on_threads_equals_the_unsharded_block_and_the_simulator(tp):
    params, x, upstream, y, dx, grads = block_problem(2, 5, 16, 4, seed=7)
    threads = run(tensor_parallel_block_step, tp, engine="threads",
                  args=(params, 4, x, upstream))
    check_block_run(threads, 4, y, dx, grads, tp)
    simulated = run(tensor_parallel_block_step, tp, args=(params, 4, x, upstream))
    for real, sim in zip(threads.values, simulated.values):
        assert np.array_equal(real["output"], sim["output"])
        assert all(np.array_equal(real["grads"][n], sim["grads"][n]) for n in grads)


def test_split_block_on_processes_equals_the_unsharded_block():
    params, x, upstream, y, dx, grads = block_problem(1, 4, 12, 6, seed=3)
    result = run(tensor_parallel_block_step, 3, engine="processes", args=(params, 6, x, upstream))
    check_block_run(result, 6, y, dx, grads, 3)


def test_split_block_in_float32():
    block = perturbed_block(8, 4, seed=2)
    params32 = {n: p.astype(np.float32) for n, p in block.params.items()}
    block32 = TransformerBlock(8, 4, dtype=np.float32)
    block32.params = params32
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    upstream = rng.standard_normal((2, 3, 8)).astype(np.float32)
    y = block32.forward(x)
    dx, grads = block32.backward_with_input(upstream)
    result = run(tensor_parallel_block_step, 2, args=(params32, 4, x, upstream))
    assert result.values[0]["output"].dtype == np.float32
    assert close(result.values[0]["output"], y, 1e-5)
    gathered = gather_block_grads([v["grads"] for v in result.values], 4)
    assert all(gathered[n].dtype == np.float32 and close(gathered[n], grads[n], 1e-4)
               for n in grads)


# --- counting all-reduces in the trace ---------------------------------------------------------

def counts(result, forward_end_of):
    return [(count_collectives(result.trace, r, 0.0, forward_end_of(r)),
             count_collectives(result.trace, r, forward_end_of(r)))
            for r in range(result.world_size)]


def timed_column(comm, weight, bias, x, dy):
    layer = ColumnParallelLinear.from_full(weight, bias, comm.size, comm.rank, flop_rate=FLOP_RATE)
    yield from layer.forward(comm, x)
    forward_end = yield comm.now()
    start, stop = shard_range(weight.shape[1], comm.size, comm.rank)
    yield from layer.backward(comm, dy[..., start:stop])
    return forward_end


def timed_row(comm, weight, bias, x, dz):
    layer = RowParallelLinear.from_full(weight, bias, comm.size, comm.rank, flop_rate=FLOP_RATE)
    start, stop = shard_range(weight.shape[0], comm.size, comm.rank)
    yield from layer.forward(comm, x[..., start:stop])
    forward_end = yield comm.now()
    yield from layer.backward(comm, dz)
    yield comm.compute(1e-6)          # end on compute, so a trailing burst would still count
    return forward_end


@pytest.mark.parametrize("tp", [1, 2, 3, 4])
def test_one_allreduce_per_sublayer_and_pass_counted_in_the_trace(tp):
    params, x, upstream, *_ = block_problem(2, 4, 12, 4, seed=tp)
    expect = 0 if tp == 1 else 1
    mlp = run(mlp_program, tp, args=(params, x, upstream, FLOP_RATE))
    assert counts(mlp, lambda r: mlp.values[r][3]) == [(expect, expect)] * tp
    attention = run(attention_program, tp, args=(params, 4, x, upstream, FLOP_RATE))
    assert counts(attention, lambda r: attention.values[r][3]) == [(expect, expect)] * tp
    block = run(tensor_parallel_block_step, tp, args=(params, 4, x, upstream, FLOP_RATE))
    per_pass = (ALLREDUCES_PER_BLOCK["forward"] * expect, ALLREDUCES_PER_BLOCK["backward"] * expect)
    assert counts(block, lambda r: block.values[r]["forward_end"]) == [per_pass] * tp
    rng = np.random.default_rng(tp)
    weight, bias = rng.standard_normal((12, 10)), rng.standard_normal(10)
    xs, dys = rng.standard_normal((3, 12)), rng.standard_normal((3, 10))
    column = run(timed_column, tp, args=(weight, bias, xs, dys))
    assert counts(column, lambda r: column.values[r]) == [(0, expect)] * tp      # f: backward
    row = run(timed_row, tp, args=(weight.T, rng.standard_normal(12), dys, xs))
    assert counts(row, lambda r: row.values[r]) == [(expect, 0)] * tp            # g: forward


def test_count_collectives_reads_bursts_between_computations():
    trace = Trace()
    for op, start, end in [("compute", 0, 1), ("sendrecv", 1, 2), ("combine", 2, 2),
                           ("sendrecv", 2, 3), ("compute", 3, 4), ("send", 4, 5), ("recv", 5, 6),
                           ("compute", 6, 7), ("compute", 7, 8), ("sendrecv", 8, 9)]:
        trace.add(0, op, start, end, nbytes=10 if op in ("send", "sendrecv") else 0)
    trace.add(1, "sendrecv", 0, 1, nbytes=99)
    assert count_collectives(trace, 0) == 3
    assert count_collectives(trace, 0, 0, 4) == 1
    assert count_collectives(trace, 0, 4) == 2
    assert count_collectives(trace, 1) == 1
    assert bytes_sent(trace, 0) == 40 and bytes_sent(trace) == 139
    assert bytes_sent(trace, 0, 4) == 20


# --- communication: measured against the model -----------------------------------------------

def comm_only(tp, batch, seq, hidden, heads, network=NET, algorithm="ring"):
    params = TransformerBlock(hidden, heads, seed=0).params
    x = np.ones((batch, seq, hidden))
    return dsml.run(tensor_parallel_block_step, tp, network=network,
                    args=(params, heads, x, x), kwargs={"algorithm": algorithm})


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("batch,seq,hidden,heads", [(2, 4, 12, 6), (1, 5, 12, 6), (1, 3, 30, 6)])
def test_bytes_sent_per_rank_equal_the_model(tp, batch, seq, hidden, heads):
    result = comm_only(tp, batch, seq, hidden, heads)
    assert math.isclose(bytes_sent(result.trace) / tp,
                        tp_block_bytes_per_rank(batch, seq, hidden, tp), rel_tol=1e-12, abs_tol=0)
    # every all-reduce carries the whole activation, b·s·h numbers, whatever tp is
    assert allreduce_nbytes(batch, seq, hidden) == batch * seq * hidden * 8


@pytest.mark.parametrize("tp,batch,seq,hidden,heads", [(2, 2, 4, 12, 6), (3, 2, 4, 12, 6),
                                                       (4, 1, 4, 16, 4), (6, 2, 3, 12, 6)])
def test_simulated_time_equals_four_closed_form_allreduces_when_blocks_are_equal(tp, batch, seq,
                                                                                 hidden, heads):
    assert batch * seq * hidden % tp == 0
    for network in (NET, AlphaBeta(alpha=1e-5, beta=1e-10, gamma=3e-10)):
        measured = comm_only(tp, batch, seq, hidden, heads, network).time
        model = tp_block_comm_seconds(batch, seq, hidden, tp, network.alpha, network.beta,
                                      network.gamma)
        assert math.isclose(measured, model, rel_tol=1e-12)
    measured = comm_only(4, 1, 4, 16, 4, algorithm="recursive_doubling").time
    assert math.isclose(measured, tp_block_comm_seconds(1, 4, 16, 4, NET.alpha, NET.beta,
                                                        algorithm="recursive_doubling"),
                        rel_tol=1e-12)


@pytest.mark.parametrize("tp,batch,seq,hidden,heads", [(2, 1, 3, 15, 3), (3, 1, 5, 16, 8),
                                                       (5, 2, 16, 48, 12), (4, 1, 3, 6, 6)])
def test_simulated_time_departs_from_the_closed_form_when_the_ring_blocks_are_unequal(
        tp, batch, seq, hidden, heads):
    # b·s·h not divisible by tp: the ring's blocks differ by one number, and the closed form's
    # n/tp per step is an average the simulated ring does not achieve.
    elements = batch * seq * hidden
    assert elements % tp
    measured = comm_only(tp, batch, seq, hidden, heads).time
    model = tp_block_comm_seconds(batch, seq, hidden, tp, NET.alpha, NET.beta)
    largest = math.ceil(elements / tp) * 8
    bound = 4 * 2 * (tp - 1) * (NET.alpha + largest * NET.beta)   # every step at the largest block
    assert model * (1 + 1e-9) < measured <= bound * (1 + 1e-12)


def test_recursive_doubling_on_a_non_power_of_two_departs_from_the_closed_form():
    # On 3 ranks recursive doubling folds one rank in and back out: 2 extra full-vector messages
    # that the closed form lg p·(α + nβ), with lg 3 rounded up to 2, does not count.
    measured = comm_only(3, 1, 4, 12, 3, algorithm="recursive_doubling").time
    model = tp_block_comm_seconds(1, 4, 12, 3, NET.alpha, NET.beta, algorithm="recursive_doubling")
    assert measured > model * 1.2


def test_uneven_heads_make_the_busiest_rank_set_the_pace():
    # 6 heads on 4 ranks: 2, 2, 1, 1. The all-reduces wait for the ranks with two heads, so the
    # block takes longer than compute/t + communication, the model for an even split.
    batch, seq, hidden, heads = 2, 8, 24, 6
    params, x, upstream, *_ = block_problem(batch, seq, hidden, heads, seed=0)
    flops = 3 * block_forward_flops(batch, seq, hidden)
    comm = tp_block_comm_seconds(batch, seq, hidden, 4, NET.alpha, NET.beta)
    uneven = dsml.run(tensor_parallel_block_step, 4, network=NET,
                      args=(params, heads, x, upstream, FLOP_RATE))
    assert uneven.time > (flops / 4 / FLOP_RATE + comm) * 1.01
    # ... while an even split (6 heads on 3 or 2 ranks) matches that model exactly
    for tp in (2, 3):
        even = dsml.run(tensor_parallel_block_step, tp, network=NET,
                        args=(params, heads, x, upstream, FLOP_RATE))
        model = flops / tp / FLOP_RATE + tp_block_comm_seconds(batch, seq, hidden, tp, NET.alpha,
                                                               NET.beta)
        assert math.isclose(even.time, model, rel_tol=1e-12)


def test_flop_model_is_twelve_h_squared_per_token_times_two_plus_attention():
    assert block_forward_flops(1, 1, 1) == 28
    assert block_forward_flops(2, 16, 48) == 24 * 2 * 16 * 48**2 + 4 * 2 * 16**2 * 48
    assert tp_block_bytes_per_rank(2, 3, 4, 1) == 0
    assert tp_block_comm_seconds(2, 3, 4, 1, 1e-6, 1e-9) == 0
    assert tp_block_comm_seconds(2, 3, 4, 4, 1e-6, 1e-9) == 4 * cost("allreduce", "ring", 4,
                                                                     2 * 3 * 4 * 8, 1e-6, 1e-9)


# --- bad input -------------------------------------------------------------------------------

def test_more_ranks_than_heads_or_columns_is_an_error():
    params = TransformerBlock(12, 4).params
    with pytest.raises(ValueError, match="tensor-parallel size 5 exceeds the 4 attention heads to "
                                         "split: a rank would own none; use tp ≤ 4"):
        shard_block_params(params, 4, 5, 0)
    with pytest.raises(ValueError, match="exceeds the 3 output columns"):
        ColumnParallelLinear.from_full(np.zeros((4, 3)), np.zeros(3), 4, 0)
    with pytest.raises(ValueError, match="exceeds the 2 input rows"):
        RowParallelLinear.from_full(np.zeros((2, 3)), np.zeros(3), 3, 1)


def test_heads_that_do_not_divide_hidden_and_bad_tp_or_rank_are_errors():
    params = TransformerBlock(12, 4).params
    with pytest.raises(ValueError, match=r"heads \(5\) must divide hidden \(12\)"):
        shard_block_params(params, 5, 2, 0)
    with pytest.raises(ValueError, match="tensor-parallel size tp must be an integer ≥ 1, got 0"):
        shard_block_params(params, 4, 0, 0)
    with pytest.raises(ValueError, match=r"rank must be in 0\.\.1 for tp = 2, got 2"):
        shard_block_params(params, 4, 2, 2)


def test_wrong_parameter_sets_are_errors():
    params = dict(TransformerBlock(8, 2).params)
    wrong = dict(params, **{"attn.qkv.weight": np.zeros((8, 16))})
    with pytest.raises(ValueError, match=r"params\['attn.qkv.weight'\] \(hidden = 8\) must have "
                                         r"shape \(8, 24\), got \(8, 16\)"):
        shard_block_params(wrong, 2, 2, 0)
    missing = {n: p for n, p in params.items() if n != "mlp.fc.bias"}
    with pytest.raises(ValueError, match=r"missing \['mlp.fc.bias'\]"):
        shard_block_params(missing, 2, 2, 0)
    with pytest.raises(ValueError, match="fc_weight .* and proj_weight .* do not chain"):
        ParallelMLP.from_full(np.zeros((8, 32)), np.zeros(32), np.zeros((16, 8)), np.zeros(8), 2, 0)
    with pytest.raises(ValueError, match=r"bias \(one per output column\) must have shape \(3,\)"):
        ColumnParallelLinear(np.zeros((4, 3)), np.zeros(4), 1, 0)


def shapes_program(comm, case):
    rng = np.random.default_rng(0)
    if case == "column x":
        layer = ColumnParallelLinear.from_full(rng.standard_normal((6, 4)), np.zeros(4),
                                               comm.size, comm.rank)
        yield from layer.forward(comm, np.zeros((3, 5)))
    elif case == "column dy":
        layer = ColumnParallelLinear.from_full(rng.standard_normal((6, 4)), np.zeros(4),
                                               comm.size, comm.rank)
        yield from layer.forward(comm, np.zeros((3, 6)))
        yield from layer.backward(comm, np.zeros((3, 4)))      # the whole dy, not this rank's
    elif case == "row x":
        layer = RowParallelLinear.from_full(rng.standard_normal((6, 4)), np.zeros(4),
                                            comm.size, comm.rank)
        yield from layer.forward(comm, np.zeros((3, 6)))       # the whole x, not this rank's
    elif case == "block x":
        block = TensorParallelBlock.from_full(TransformerBlock(8, 2).params, 2, comm.size,
                                              comm.rank)
        yield from block.forward(comm, np.zeros((2, 3, 6)))
    elif case == "block dy":
        block = TensorParallelBlock.from_full(TransformerBlock(8, 2).params, 2, comm.size,
                                              comm.rank)
        yield from block.forward(comm, np.zeros((2, 3, 8)))
        yield from block.backward(comm, np.zeros((2, 4, 8)))
    elif case == "backward first":
        block = TensorParallelBlock.from_full(TransformerBlock(8, 2).params, 2, comm.size,
                                              comm.rank)
        yield from block.backward(comm, np.zeros((2, 3, 8)))


@pytest.mark.parametrize("case,message", [
    ("column x", r"x has 5 features \(shape \(3, 5\)\) but the weight expects 6"),
    ("column dy", r"dy \(this rank's output columns\) must have shape \(3, 2\), got \(3, 4\)"),
    ("row x", r"x_shard has 6 features \(shape \(3, 6\)\) but this rank's rows of the weight "
              r"expect 3"),
    ("block x", r"expected x of shape \(batch, seq, 8\), got \(2, 3, 6\)"),
    ("block dy", r"dy \(the block's output\) must have shape \(2, 3, 8\), got \(2, 4, 8\)"),
    ("backward first", "call forward before backward"),
])
def test_mismatched_shapes_are_errors_naming_the_shapes(case, message):
    with pytest.raises(RankError, match=message):
        dsml.run(shapes_program, 2, network=NET, args=(case,))


def mismatched_world(comm, params, cut_for):
    block = TensorParallelBlock.from_full(params, 4, cut_for, comm.rank % cut_for)
    yield from block.forward(comm, np.zeros((1, 2, 8)))


@pytest.mark.parametrize("engine", ["sim", "threads"])
def test_shards_cut_for_another_world_size_are_an_error(engine):
    params = TransformerBlock(8, 4).params
    with pytest.raises(RankError, match=r"TensorParallelBlock was cut for tensor-parallel size 4 "
                                        r"\(rank \d\) but runs as rank \d of a world of size 2"):
        run(mismatched_world, 2, engine=engine, args=(params, 4))


def test_gather_refuses_replicated_gradients_that_differ():
    params = TransformerBlock(8, 2).params
    shards = [shard_block_params(params, 2, 2, r) for r in range(2)]
    shards[1]["ln2.bias"] = shards[1]["ln2.bias"] + 1e-15
    with pytest.raises(ValueError, match="replicated gradient ln2.bias differs between rank 0 and "
                                         "rank 1"):
        gather_block_grads(shards, 2)
    with pytest.raises(ValueError, match="at least one rank"):
        gather_block_grads([], 2)


# --- sequence parallelism (Korthikanti et al. 2022) ------------------------------------------

def sp_run(tp, problem, engine="sim", **kwargs):
    params, x, upstream = problem[:3]
    heads = 4 if params["ln1.weight"].shape[0] == 16 else 6
    if engine == "sim":
        return dsml.run(parallel_block_step, tp, network=NET, args=(params, heads, x, upstream),
                        kwargs=kwargs)
    return dsml.run(parallel_block_step, tp, engine=engine, args=(params, heads, x, upstream),
                    kwargs=kwargs, timeout=TIMEOUT)


@pytest.mark.parametrize("regather", [True, False])
@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_sequence_parallel_block_equals_the_unsharded_block(tp, regather, seed):
    params, x, upstream, y, dx, grads = block_problem(2, 8, 16, 4, seed)
    values = sp_run(tp, (params, x, upstream), regather=regather).values
    assert all(v["output"].shape == (2, 8 // tp, 16) for v in values)
    assert close(np.concatenate([v["output"] for v in values], axis=1), y)
    assert close(np.concatenate([v["input_grad"] for v in values], axis=1), dx)
    gathered = gather_block_grads([v["grads"] for v in values], 4)   # replicated: same bits
    for name in grads:
        assert close(gathered[name], grads[name]), name


def test_sequence_parallel_block_on_threads_equals_the_simulator():
    problem = block_problem(1, 6, 12, 6, seed=4)
    threads = sp_run(3, problem, engine="threads").values
    simulated = sp_run(3, problem).values
    for real, sim in zip(threads, simulated):
        assert np.array_equal(real["output"], sim["output"])
        assert all(np.array_equal(real["grads"][n], sim["grads"][n]) for n in sim["grads"])


def test_a_sequence_the_ranks_do_not_divide_is_refused():
    problem = block_problem(2, 6, 16, 4, seed=0)
    with pytest.raises(RankError, match=r"cuts the sequence into tp = 4 equal shards, but x of "
                                        r"shape \(2, 6, 16\) has sequence length 6; pad it to a "
                                        r"multiple of 4"):
        sp_run(4, problem)
    with pytest.raises(ValueError, match="sequence length none"):
        sequence_shard(np.zeros(5), 1, 0)


@pytest.mark.parametrize("tp", [2, 4])
def test_sequence_parallel_bytes_against_the_all_reduce_version(tp):
    batch, seq, hidden = 2, 8, 16
    problem = block_problem(batch, seq, hidden, 4, seed=0)
    sent = {name: bytes_sent(sp_run(tp, problem, **kwargs).trace) / tp for name, kwargs in
            (("tp", {"sequence_parallel": False}), ("keep", {"regather": False}),
             ("regather", {"regather": True}))}
    ring = 2 * (tp - 1) / tp
    assert math.isclose(sent["tp"], tp_block_bytes_per_rank(batch, seq, hidden, tp), rel_tol=1e-12)
    # reduce-scatter + all-gather = all-reduce: only the LayerNorms' 4h gradients are added
    assert sent["keep"] - sent["tp"] == ring * 4 * hidden * 8
    # re-gathering the two column-parallel inputs: two all-gathers, (t − 1)/t·b·s·h·8 each
    assert sent["regather"] - sent["keep"] == ring * batch * seq * hidden * 8


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_activations_held_equal_korthikantis_rows(tp):
    batch, seq, hidden, heads = 2, 8, 16, 4
    problem = block_problem(batch, seq, hidden, heads, seed=0)
    config = TransformerConfig.gpt_style(1, hidden, heads, vocab=8, seq_len=seq)
    for sp, kwargs in ((False, {"sequence_parallel": False}), (True, {"regather": True})):
        held = {v["held"] for v in sp_run(tp, problem, **kwargs).values}
        split = tp if sp else 1
        dropout = 2 * seq * batch * hidden / split + 3 * heads * seq**2 * batch / tp
        paper = activation_bytes_per_layer(config, batch, tp, sp)
        assert held == {8 * ((paper - dropout) / 2 + 2 * seq * batch / split)}, (sp, held)
    keep = {v["held"] for v in sp_run(tp, problem, regather=False).values}
    assert keep == {next(iter(held)) + 8 * 2 * seq * batch * hidden * (1 - 1 / tp)}
