"""Tests for dsml.expert_parallel (bonus notebook 5c): the mixture-of-experts layer's backward
against finite differences (and PyTorch's autograd when torch is installed), the expert-parallel
rank program against the unsharded layer, bytes against the closed form, the dropped-token
model against exact enumeration, and the cp/ep layout search against week 5's step model."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dsml.comm.run import run
from dsml.expert_parallel import (MoE, ParallelLayout, alltoall_bytes_per_rank,
                                  alltoall_lower_bound, estimate_parallel_step, expert_capacity,
                                  expected_overflow, expert_parallel_moe, init_moe, moe_backward,
                                  moe_forward, moe_params, owned_experts, parallel_memory,
                                  ring_attention_kv_bytes, route, search_parallel_layouts,
                                  simulated_alltoall, softmax)
from dsml.model_config import TransformerConfig, preset
from dsml.memory import Layout, memory_per_rank
from dsml.step_model import estimate_step
from dsml.net import AlphaBeta
from dsml.net.presets import LINKS
from dsml.net.topology import fat_tree

SEED = 11
NETWORK = AlphaBeta(alpha=1e-6, beta=1e-9)


def relative(a, b):
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)


def perturbed(hidden=6, ffn=10, experts=4, seed=SEED):
    return init_moe(hidden, ffn, experts, seed=seed, std=0.5)


@pytest.mark.parametrize("k,factor", [(1, 1.0), (2, 1.0), (2, 4.0), (1, 0.5)])
def test_backward_matches_finite_differences(k, factor):
    params = perturbed()
    rng = np.random.default_rng(SEED + k)
    x, g = rng.standard_normal((10, 6)), rng.standard_normal((10, 6))
    _, cache = moe_forward(params, x, k, factor)
    dx, grads = moe_backward(params, cache, g)

    def loss():
        return float(np.sum(g * moe_forward(params, x, k, factor)[0]))
    for name, value in list(params.items()) + [("x", x)]:
        numeric = np.zeros_like(value)
        for index in np.ndindex(value.shape):
            saved = value[index]
            value[index] = saved + 1e-6
            up = loss()
            value[index] = saved - 1e-6
            numeric[index] = (up - loss()) / 2e-6
            value[index] = saved
        assert relative(dx if name == "x" else grads[name], numeric) < 1e-6, name


def test_matches_pytorch_autograd():
    torch = pytest.importorskip("torch")
    params = perturbed()
    rng = np.random.default_rng(SEED)
    x, g = rng.standard_normal((12, 6)), rng.standard_normal((12, 6))
    y, cache = moe_forward(params, x, 2, 1.0)
    dx, grads = moe_backward(params, cache, g)
    _, _, expert, slot, *_ = cache
    t = {n: torch.tensor(p, dtype=torch.float64, requires_grad=True) for n, p in params.items()}
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    probs = torch.softmax(tx @ t["router"], dim=-1)
    rows = []
    for token in range(x.shape[0]):
        out = torch.zeros(6, dtype=torch.float64)
        for choice in range(2):
            e = int(expert[token, choice])
            if slot[token, choice] >= 0:
                hidden = torch.nn.functional.gelu(tx[token] @ t["w1"][e] + t["b1"][e],
                                                  approximate="tanh")
                out = out + probs[token, e] * (hidden @ t["w2"][e] + t["b2"][e])
        rows.append(out)
    ty = torch.stack(rows)
    ty.backward(torch.tensor(g))
    assert relative(y, ty.detach().numpy()) < 1e-12
    assert relative(dx, tx.grad.numpy()) < 1e-12
    for name in grads:
        assert relative(grads[name], t[name].grad.numpy()) < 1e-12, name


def _program(comm, params, groups, upstream, k, factor):
    return (yield from expert_parallel_moe(comm, params, groups[comm.rank], upstream[comm.rank],
                                           k, factor))


@pytest.mark.parametrize("ep,experts,k,factor", [(2, 4, 1, 1.0), (4, 8, 2, 1.25), (4, 4, 2, 0.5),
                                                 (3, 6, 1, 1.5), (1, 4, 2, 1.0)])
def test_sharded_layer_equals_the_layer_on_each_group(ep, experts, k, factor):
    rng = np.random.default_rng(SEED + ep)
    params = init_moe(8, 12, experts, seed=SEED, std=0.4)
    groups = [rng.standard_normal((10, 8)) for _ in range(ep)]
    upstream = [rng.standard_normal((10, 8)) for _ in range(ep)]
    result = run(_program, ep, network=NETWORK, args=(params, groups, upstream, k, factor))
    w1 = np.zeros_like(params["w1"])
    for rank, (y, dx, grads, _) in enumerate(result.values):
        y_ref, cache = moe_forward(params, groups[rank], k, factor)
        dx_ref, grads_ref = moe_backward(params, cache, upstream[rank])
        assert np.abs(y - y_ref).max() < 1e-12 and np.abs(dx - dx_ref).max() < 1e-12
        w1 += grads_ref["w1"]
    mine = np.concatenate([v[2]["w1"] for v in result.values])
    assert np.abs(mine - w1).max() < 1e-12          # each expert's gradient summed over groups
    sent = sum(r.nbytes for r in result.trace.of_rank(0) if r.op in ("send", "sendrecv"))
    assert sent == 4 * alltoall_bytes_per_rank(10, 8, experts, k, factor, ep)


def test_sharded_layer_without_drops_equals_the_whole_layer():
    rng = np.random.default_rng(SEED)
    params = init_moe(8, 12, 8, seed=SEED, std=0.4)
    groups = [rng.standard_normal((10, 8)) for _ in range(4)]
    upstream = [rng.standard_normal((10, 8)) for _ in range(4)]
    result = run(_program, 4, network=NETWORK, args=(params, groups, upstream, 2, 8.0))
    y, cache = moe_forward(params, np.concatenate(groups), 2, 100.0)
    dx, grads = moe_backward(params, cache, np.concatenate(upstream))
    assert (cache[3] >= 0).all()
    assert np.abs(np.concatenate([v[0] for v in result.values]) - y).max() < 1e-12
    assert np.abs(np.concatenate([v[1] for v in result.values]) - dx).max() < 1e-12
    assert np.abs(sum(v[3] for v in result.values) - grads["router"]).max() < 1e-12
    for name in ("w1", "b1", "w2", "b2"):
        assert np.abs(np.concatenate([v[2][name] for v in result.values]) - grads[name]).max() \
            < 1e-12


def test_route_hands_slots_first_choices_first():
    probs = np.array([[0.6, 0.4, 0.0], [0.5, 0.1, 0.4], [0.2, 0.7, 0.1]])
    expert, slot, gate = route(probs, 2, 1)
    assert expert.tolist() == [[0, 1], [0, 2], [1, 0]]
    # first choices: token 0 takes expert 0's slot, token 1 is dropped there, token 2 takes 1's;
    # second choices: token 0's expert 1 is full, token 1's expert 2 is free, token 2's 0 full
    assert slot.tolist() == [[0, -1], [-1, 0], [0, -1]]
    assert np.allclose(gate, [[0.6, 0.4], [0.5, 0.4], [0.7, 0.2]])


def test_expected_overflow_equals_exact_enumeration():
    pi, tokens, experts = np.array([0.5, 0.3, 0.2]), 6, 3
    for capacity in (0, 1, 2, 3, 6):
        mean = second = 0.0
        for choices in itertools.product(range(experts), repeat=tokens):
            p = math.prod(pi[c] for c in choices)
            d = sum(max(choices.count(e) - capacity, 0) for e in range(experts))
            mean, second = mean + p * d, second + p * d * d
        expected, variance_bound = expected_overflow(tokens, pi, capacity)
        assert math.isclose(expected, mean, rel_tol=1e-12, abs_tol=1e-12)
        assert second - mean**2 <= variance_bound + 1e-12


def test_capacity_and_parameter_counts():
    assert expert_capacity(512, 8, 1, 1.0) == 64
    assert expert_capacity(512, 8, 2, 1.25) == 160
    assert expert_capacity(10, 4, 1, 1.0) == 3              # rounded up
    mixtral = TransformerConfig.llama_style(32, 4096, 32, 32000, 4096, ffn_hidden=14336,
                                            kv_heads=8)
    counts = moe_params(mixtral, MoE(8, 2))
    assert round(counts["total"] / 1e8) == 467 and round(counts["active"] / 1e8) == 129
    assert moe_params(mixtral, MoE(1, 1))["total"] == mixtral.num_params() + 32 * 4096


def test_alltoall_on_a_fat_tree_is_within_its_bounds():
    for spines in (4, 1):
        network = fat_tree(2, 4, spines, bandwidth=1e9, sharing="fair")
        seconds, sent = simulated_alltoall(network, 8, 10**5)
        assert sent == 7 * 10**5
        bound = alltoall_lower_bound(8, 10**5, 1e9, 4, spines * 1e9)
        assert bound <= seconds <= 1.5 * bound


def test_layout_with_cp_and_ep_one_is_week5s_step():
    config = preset("gpt2-large")
    base = Layout(dp=4, tp=2, pp=1, zero=1, micro_batch=2, microbatches=4, recompute="selective",
                  sequence_parallel=True)
    layout = ParallelLayout(base)
    assert math.isclose(estimate_parallel_step(config, layout).seconds,
                        estimate_step(config, base).seconds, rel_tol=1e-12)
    assert parallel_memory(config, layout) == memory_per_rank(config, base).total


def test_cp_and_ep_terms():
    assert ring_attention_kv_bytes(4096, 1024, 4, micro_batch=2, itemsize=2) == \
        2 * 3 * 1024 * 1024 * 2 * 2
    config = preset("llama2-7b")
    moe = MoE(8, 2)
    base = Layout(dp=8, tp=1, pp=1, zero=1, micro_batch=1, microbatches=4, recompute="selective")
    alone = estimate_parallel_step(config, ParallelLayout(base, 1, 1), moe)
    split = estimate_parallel_step(config, ParallelLayout(base, 1, 8), moe)
    assert alone.alltoall == 0 and split.alltoall > 0
    assert parallel_memory(config, ParallelLayout(base, 1, 8), moe) < \
        parallel_memory(config, ParallelLayout(base, 1, 1), moe)
    with_cp = estimate_parallel_step(config, ParallelLayout(base, 2, 1))
    assert with_cp.attention > 0



def test_expert_data_traffic_is_week5s_rule_without_the_double_count():
    # E = k experts held by every rank (ep = 1) are exactly the base's k-wide MLP: split into
    # a dense and an expert part, week 5's exposed all-reduce of pp > 1 comes back, plus the
    # second collective's latency 2(d − 1)α (all eight ranks inside one node)
    config = preset("llama2-7b")
    base = Layout(dp=8, tp=1, pp=2, zero=1, micro_batch=1, microbatches=4, recompute="selective")
    step = estimate_parallel_step(config, ParallelLayout(base), MoE(2, 2))
    assert step.expert_data > 0
    assert math.isclose(step.data, step.base.data_comm_seconds + 2 * 7 * LINKS["nvlink3"].alpha,
                        rel_tol=1e-9)
    assert math.isclose(step.seconds - step.data, step.base.seconds - step.base.data_comm_seconds,
                        rel_tol=1e-12)
    # ZeRO-3 gathers the weights of all E/ep experts a rank holds, not k of them
    zero3 = Layout(dp=8, tp=1, pp=1, zero=3, micro_batch=1, microbatches=2, recompute="selective")
    few, many = (estimate_parallel_step(config, ParallelLayout(zero3), MoE(experts, 2)).expert_data
                 for experts in (2, 8))
    split = estimate_parallel_step(config, ParallelLayout(zero3, 1, 4), MoE(8, 2)).expert_data
    assert many > 3 * few and split < many / 3

def test_the_ring_carries_the_key_value_width_not_the_hidden_width():
    # cp = 16 leaves the node, so the ring's hops show; grouped-query attention with 8 of 32
    # key/value heads sends a quarter of the bytes, so far less of the ring is exposed
    base = Layout(dp=1, tp=1, pp=1, zero=0, micro_batch=1, microbatches=1, recompute="selective")
    exposed = {}
    for kv_heads in (32, 8):
        config = TransformerConfig.llama_style(4, 4096, 32, 32000, 4096, ffn_hidden=14336,
                                               kv_heads=kv_heads)
        exposed[kv_heads] = estimate_parallel_step(config, ParallelLayout(base, 16, 1)).ring
    assert exposed[32] > 0 and exposed[8] < exposed[32] / 2


def test_search_returns_fitting_layouts_fastest_first():
    config = preset("gpt2-large")
    results = search_parallel_layouts(config, 8, 16, 40e9, MoE(4, 1), micro_batches=(1,))
    assert results and all(r.bytes <= 40e9 for r in results)
    assert [r.step.seconds for r in results] == sorted(r.step.seconds for r in results)
    assert any(r.layout.ep > 1 for r in results) and any(r.layout.cp > 1 for r in results)
    for r in results:
        assert r.layout.devices == 8 and 4 % r.layout.ep == 0


@pytest.mark.parametrize("call,words", [
    (lambda: expert_capacity(0, 4, 1, 1.0), "tokens must be an integer ≥ 1"),
    (lambda: expert_capacity(8, 4, 5, 1.0), "k must be at most experts=4"),
    (lambda: expert_capacity(8, 4, 1, 0), "capacity_factor must be a finite number > 0"),
    (lambda: MoE(4, 0), "k must be an integer ≥ 1"),
    (lambda: owned_experts(6, 4, 0), "ep must divide the number of experts 6"),
    (lambda: ParallelLayout(Layout(dp=2), cp=1, ep=4), "ep must divide dp·cp = 2"),
    (lambda: ParallelLayout(Layout(dp=2), cp=0), "cp must be an integer ≥ 1"),
    (lambda: estimate_parallel_step(preset("gpt2-xl"), ParallelLayout(Layout(dp=2), ep=2)),
     "ep=2 needs a MoE model"),
    (lambda: expected_overflow(4, [0.5, 0.6], 1), "probabilities must be"),
    (lambda: search_parallel_layouts(preset("gpt2-xl"), 8, 16, 0), "device_bytes must be > 0"),
])
def test_bad_input_names_the_argument(call, words):
    with pytest.raises(ValueError, match=words.replace("·", ".").replace("(", r"\(")):
        call()


def test_softmax_rows_sum_to_one():
    rows = softmax(np.array([[1000.0, 0.0], [-5.0, -5.0]]))
    assert np.allclose(rows.sum(axis=1), 1) and np.allclose(rows[1], 0.5)


def test_the_notebooks_quick_search_picks_what_the_full_search_picks():
    from dataclasses import replace
    mixtral = TransformerConfig.llama_style(32, 4096, 32, 32000, 4096, ffn_hidden=14336,
                                            kv_heads=8)
    dense = replace(preset("llama2-7b"), seq_len=32768)
    rules = [lambda l: True, lambda l: l.cp == 1, lambda l: l.cp == 1 and l.ep == 1]
    for config, moe, batch in [(dense, None, 64), (mixtral, MoE(8, 2), 256)]:
        quick = search_parallel_layouts(config, 64, batch, 80e9, moe, micro_batches=(1, 2, 4),
                                        recompute=("selective",))
        full = search_parallel_layouts(config, 64, batch, 80e9, moe, micro_batches=(1, 2, 4),
                                       recompute=("selective", "full"))
        for rule in rules:
            picked = [next(r.layout for r in results if rule(r.layout))
                      for results in (quick, full)]
            assert picked[0] == picked[1]


def test_moe_forward_names_a_wrong_input_shape():
    with pytest.raises(ValueError, match=r"x must be \(tokens, hidden=6\), got shape \(3, 5\)"):
        moe_forward(perturbed(), np.zeros((3, 5)))


def test_the_ring_criterion_costs_the_block_above_5bs_peak_rate_block():
    # 5b's simulator runs a block's attention at the peak FLOP rate (4c²h FLOPs); 5c costs it
    # week 5's way, so it is never shorter and a hop hides behind it at a shorter block
    from dsml.expert_parallel import HARDWARE, attention_core_seconds
    config = preset("llama2-7b")
    for block in (1024, 4096, 16384):
        products, traffic = attention_core_seconds(config, 1, 1, block, block, HARDWARE)
        assert products + traffic > 4 * block ** 2 * config.hidden / HARDWARE["device_flops"]
