"""Plumbing (hand-written): tests for dsml.memory — the memory accountant (week 5).

Independent references, never the accountant's own code:
- parameter counts: the published models' counts, closed forms written out by hand for GPT-2
  (V·h + s·h + l(12h² + 13h) + 2h) and Llama (2Vh + l(2h² + 2h·kv + 3hf + 2h) + h), and PyTorch
  modules built from the config on the meta device (no memory), when torch is installed;
- bytes: the nbytes of NumPy arrays actually allocated (`build_numpy_model`, `shard_numpy_model`),
  whose shapes a forward pass proves; the tensor-parallel shards concatenate back to the model;
- ZeRO: the paper's example (exact and to its printed precision) and the four formulas by hand;
- activations: Korthikanti et al.'s table by hand; FLOPs: Narayanan et al.'s eq. 3 and its
  no-recomputation form; the pipeline bubble (p − 1)/(v·m) of the ideal time;
- the step model: Megatron-LM's published Table 1 (Narayanan et al. 2021) row by row within
  ±10 %, ZeRO-2/3 costing more with more micro-batches, ZeRO-2/3 with pp > 1 refused, the
  all-reduce hidden behind the backward only without a pipeline (the exposed ring written out),
  small products below peak, and the interleaved schedule's in-flight micro-batches against
  the op lists of week 5's own schedule;
- the search: an independent enumeration of the layouts and a brute-force Pareto check.
Cases where a measurement and a formula must differ: Narayanan's approximation against the exact
count (by exactly the final LayerNorm for GPT-2, by percents for Llama), a naive Ψ/t against the
bytes a tensor-parallel rank really holds (replicated norms, padded vocabulary), and ZeRO's Ψ/N_d
against a real padded shard when N_d does not divide Ψ.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsml.model_config import PRESETS, TransformerConfig, narayanan_params, preset
from dsml.memory import (GB, Layout, activation_bytes_per_layer, build_numpy_model,
                         inflight_microbatches, measured_bytes, memory_per_rank, numpy_forward,
                         params_per_rank, shard_numpy_model, stage_memory, zero_model_state_bytes)
from dsml.step_model import (GEMM_EFFICIENCY, KERNEL_SECONDS, achieved_fraction, matmul_seconds,
                             megatron_table1, estimate_step, forward_flops_per_sequence,
                             training_flops)
from dsml.layout_search import pareto_frontier, search_layouts

PUBLISHED = {
    "gpt2": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200, "llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
}
GPT_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
LLAMA_NAMES = ("llama2-7b", "llama2-13b", "llama2-70b")

TINY_GPT = TransformerConfig.gpt_style(layers=4, hidden=32, heads=4, vocab=51, seq_len=16)
TINY_LLAMA = TransformerConfig.llama_style(layers=4, hidden=32, heads=8, vocab=51, seq_len=16,
                                           ffn_hidden=88, kv_heads=2)


@st.composite
def small_configs(draw):
    """Small transformers mixing every option, heads dividing hidden, kv_heads dividing heads."""
    head_dim = draw(st.sampled_from([2, 4, 6]))
    kv_heads = draw(st.integers(1, 3))
    heads = kv_heads * draw(st.integers(1, 3))
    return TransformerConfig(
        layers=draw(st.integers(1, 4)), hidden=heads * head_dim, heads=heads,
        vocab=draw(st.integers(1, 40)), seq_len=draw(st.integers(1, 12)), kv_heads=kv_heads,
        ffn_hidden=draw(st.integers(1, 30)), norm=draw(st.sampled_from(["layernorm", "rmsnorm"])),
        mlp=draw(st.sampled_from(["gelu", "swiglu"])), bias=draw(st.booleans()),
        tied_embeddings=draw(st.booleans()),
        positions=draw(st.sampled_from(["learned", "rotary"])))


# ---------------------------------------------------------------- parameter counts

@pytest.mark.parametrize("name", list(PUBLISHED))
def test_presets_reproduce_the_published_counts(name):
    config = preset(name)
    assert config.num_params() == PUBLISHED[name]
    assert sum(config.breakdown().values()) == PUBLISHED[name]
    assert config.name == name


@pytest.mark.parametrize("name", GPT_NAMES)
def test_gpt2_count_by_hand(name):
    c = preset(name)
    l, h, V, s = c.layers, c.hidden, c.vocab, c.seq_len
    assert c.num_params() == V * h + s * h + l * (12 * h * h + 13 * h) + 2 * h
    assert c.breakdown()["head"] == 0 and c.breakdown()["norms"] == (2 * l + 1) * 2 * h


@pytest.mark.parametrize("name", LLAMA_NAMES)
def test_llama_count_by_hand(name):
    c = preset(name)
    l, h, V, f = c.layers, c.hidden, c.vocab, c.ffn_hidden
    kv = c.kv_heads * h // c.heads
    assert c.num_params() == 2 * V * h + l * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + h
    assert c.breakdown()["embeddings"] == c.breakdown()["head"] == V * h


def test_presets_have_the_published_shapes():
    assert preset("llama2-70b").kv_heads == 8 and preset("llama2-7b").kv_heads == 32
    assert all(preset(n).vocab == 50257 and preset(n).seq_len == 1024 for n in GPT_NAMES)
    assert all(preset(n).vocab == 32000 and preset(n).seq_len == 4096 for n in LLAMA_NAMES)
    assert set(PRESETS) == set(PUBLISHED)


@pytest.mark.parametrize("name", GPT_NAMES)
def test_narayanan_approximation_misses_gpt2_by_the_final_layernorm(name):
    """Formula vs. exact count, a pair that must differ: by exactly 2h (small, not zero)."""
    config = preset(name)
    gap = config.num_params() - narayanan_params(config)
    assert gap == pytest.approx(2 * config.hidden, abs=1e-3)
    assert 0 < gap / config.num_params() < 1e-4


@pytest.mark.parametrize("name", LLAMA_NAMES)
def test_narayanan_approximation_departs_for_llama(name):
    config = preset(name)
    relative = abs(narayanan_params(config) - config.num_params()) / config.num_params()
    assert 0.01 < relative < 0.5


def _torch_model(config, torch):
    """The config as torch.nn modules (an independent build of the same architecture)."""
    nn = torch.nn
    h, f = config.hidden, config.ffn_hidden
    kv = config.kv_heads * (h // config.heads)

    def norm():
        if config.norm == "layernorm":
            return nn.LayerNorm(h)
        return nn.RMSNorm(h)

    blocks = []
    for _ in range(config.layers):
        block = nn.ModuleDict({
            "ln_1": norm(), "q": nn.Linear(h, h, bias=config.bias),
            "k": nn.Linear(h, kv, bias=config.bias), "v": nn.Linear(h, kv, bias=config.bias),
            "o": nn.Linear(h, h, bias=config.bias), "ln_2": norm(),
            "down": nn.Linear(f, h, bias=config.bias), "up": nn.Linear(h, f, bias=config.bias)})
        if config.mlp == "swiglu":
            block["gate"] = nn.Linear(h, f, bias=config.bias)
        blocks.append(block)
    model = nn.ModuleDict({"wte": nn.Embedding(config.vocab, h), "blocks": nn.ModuleList(blocks),
                           "ln_f": norm(), "head": nn.Linear(h, config.vocab, bias=False)})
    if config.positions == "learned":
        model["wpe"] = nn.Embedding(config.seq_len, h)
    if config.tied_embeddings:
        model["head"].weight = model["wte"].weight     # parameters() lists it once
    return model


@pytest.mark.parametrize("name", list(PUBLISHED) + ["tiny-gpt", "tiny-llama"])
def test_torch_modules_count_the_same(name):
    torch = pytest.importorskip("torch")
    config = {"tiny-gpt": TINY_GPT, "tiny-llama": TINY_LLAMA}.get(name) or preset(name)
    with torch.device("meta"):                         # shapes only: no bytes allocated
        model = _torch_model(config, torch)
    assert sum(p.numel() for p in model.parameters()) == config.num_params()


# ---------------------------------------------------------------- bytes actually allocated

@settings(max_examples=60, deadline=None)
@given(config=small_configs(), fp16=st.booleans())
def test_allocated_bytes_equal_the_accountant(config, fp16):
    dtype, precision = (np.float16, "mixed") if fp16 else (np.float32, "fp32")
    model = build_numpy_model(config, dtype=dtype, seed=1)
    assert measured_bytes(model) == zero_model_state_bytes(config.num_params(), 1, 0,
                                                           precision).params
    logits = numpy_forward(config, model, np.arange(config.seq_len) % config.vocab)
    assert logits.shape == (config.seq_len, config.vocab) and np.isfinite(logits).all()


def test_build_refuses_a_large_model_before_allocating():
    with pytest.raises(ValueError, match="llama2-7b would allocate 13,476,831,232 bytes"):
        build_numpy_model(preset("llama2-7b"))
    with pytest.raises(ValueError, match="tokens must hold 1..seq_len=16 ids, got 17"):
        numpy_forward(TINY_GPT, build_numpy_model(TINY_GPT), np.zeros(17, dtype=int))


@pytest.mark.parametrize("config", [TINY_GPT, TINY_LLAMA], ids=["gpt", "llama"])
def test_forward_is_causal(config):
    model = build_numpy_model(config, dtype=np.float32, seed=2)
    tokens = np.random.default_rng(3).integers(0, config.vocab, size=10)
    changed = tokens.copy()
    changed[7] = (changed[7] + 1) % config.vocab
    before, after = numpy_forward(config, model, tokens), numpy_forward(config, model, changed)
    np.testing.assert_array_equal(before[:7], after[:7])
    assert not np.allclose(before[7:], after[7:])


def test_grouped_query_attention_equals_repeated_heads():
    """A kv_heads < heads model computes what a full-heads model with repeated K, V computes."""
    grouped = TransformerConfig.llama_style(2, 16, 4, 11, 8, ffn_hidden=20, kv_heads=2)
    full = TransformerConfig.llama_style(2, 16, 4, 11, 8, ffn_hidden=20, kv_heads=4)
    small = build_numpy_model(grouped, dtype=np.float32, seed=4)
    wide = dict(small)
    head_dim = 4
    for i in range(2):
        for name in ("k", "v"):
            w = small[f"h.{i}.attn.{name}.weight"].reshape(16, 2, head_dim)
            wide[f"h.{i}.attn.{name}.weight"] = np.repeat(w, 2, axis=1).reshape(16, 16)
    tokens = np.arange(8) % 11
    np.testing.assert_allclose(numpy_forward(grouped, small, tokens),
                               numpy_forward(full, wide, tokens), rtol=1e-5, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(config=small_configs(), tp=st.sampled_from([1, 2, 3]), pp=st.sampled_from([1, 2, 4]))
def test_every_rank_holds_the_bytes_the_accountant_counts(config, tp, pp):
    if (config.heads % tp or config.kv_heads % tp or config.ffn_hidden % tp
            or config.layers % pp):
        with pytest.raises(ValueError, match="must divide"):
            params_per_rank(config, tp, pp, 0)
        return
    model = build_numpy_model(config, seed=5)
    for stage in range(pp):
        for tp_rank in range(tp):
            held = shard_numpy_model(config, model, tp, tp_rank, pp, stage)
            assert measured_bytes(held) == 2 * params_per_rank(config, tp, pp, stage)


@pytest.mark.parametrize("config", [TINY_GPT, TINY_LLAMA], ids=["gpt", "llama"])
def test_tensor_parallel_shards_concatenate_to_the_model(config):
    model = build_numpy_model(config, seed=6)
    tp = 2
    shards = [shard_numpy_model(config, model, tp, rank) for rank in range(tp)]
    for name, array in model.items():
        parts = [shard[name] for shard in shards]
        if any(name.endswith(f"{m}.weight") for m in ("attn.o", "mlp.proj", "mlp.down")):
            np.testing.assert_array_equal(np.concatenate(parts, axis=0), array)
        elif name == "wte":
            np.testing.assert_array_equal(np.concatenate(parts, axis=0)[: config.vocab], array)
        elif name == "lm_head.weight":
            np.testing.assert_array_equal(np.concatenate(parts, axis=1)[:, : config.vocab], array)
        elif parts[0].shape != array.shape:            # column-parallel weight or bias
            np.testing.assert_array_equal(np.concatenate(parts, axis=-1), array)
        else:                                          # replicated
            for part in parts:
                np.testing.assert_array_equal(part, array)


def test_pipeline_stages_partition_the_layers():
    model = build_numpy_model(TINY_LLAMA, seed=7)
    stages = [shard_numpy_model(TINY_LLAMA, model, pp=4, stage=s) for s in range(4)]
    seen = [name for stage in stages for name in stage]
    assert sorted(seen) == sorted(model)                # untied: every tensor exactly once
    assert sum(params_per_rank(TINY_LLAMA, 1, 4, s) for s in range(4)) == TINY_LLAMA.num_params()
    tied = [params_per_rank(TINY_GPT, 1, 2, s) for s in range(2)]
    assert sum(tied) == TINY_GPT.num_params() + TINY_GPT.vocab * TINY_GPT.hidden   # the copy


def test_naive_division_by_tp_is_not_what_a_rank_holds():
    """Formula vs. measurement, a pair that must differ: Ψ/t ignores replicated norms and biases
    and the padded vocabulary (51 → 52 rows for t = 2)."""
    held = measured_bytes(shard_numpy_model(TINY_GPT, build_numpy_model(TINY_GPT), tp=2)) / 2
    assert held > TINY_GPT.num_params() / 2
    assert held == params_per_rank(TINY_GPT, tp=2)


def test_zero_shards_are_padded_where_the_formula_is_not():
    """ZeRO's KΨ/N_d against a real flat fp32 shard (np.array_split, padded to equal sizes as
    FSDP pads): equal when N_d divides Ψ, larger by less than one element's bytes otherwise."""
    for psi, dp in ((96, 8), (100, 8), (1001, 7), (10, 16)):
        flat = np.zeros(psi, dtype=np.float32)
        shard = -(-psi // dp)
        padded = np.pad(flat, (0, shard * dp - psi))
        rank0 = np.split(padded, dp)[0]
        measured = 3 * rank0.nbytes                     # master weights, m, v
        formula = zero_model_state_bytes(psi, dp, 1).optimizer
        if psi % dp == 0:
            assert measured == formula
        else:
            assert formula < measured < formula + 12


# ---------------------------------------------------------------- ZeRO

def test_zero_paper_example_exact_and_as_printed():
    values = [zero_model_state_bytes(7.5e9, 64, stage).total for stage in range(4)]
    assert values == [120e9, 31.40625e9, 16.640625e9, 1.875e9]
    assert [round(values[0] / GB), *(round(v / GB, 1) for v in values[1:])] == [120, 31.4, 16.6,
                                                                                1.9]


@settings(max_examples=100, deadline=None)
@given(psi=st.integers(1, 10**12), dp=st.integers(1, 4096))
def test_zero_formulas_by_hand(psi, dp):
    K = 12
    by_hand = [(2 + 2 + K) * psi, 4 * psi + K * psi / dp, 2 * psi + (2 + K) * psi / dp,
               (2 + 2 + K) * psi / dp]
    totals = [zero_model_state_bytes(psi, dp, stage).total for stage in range(4)]
    for total, expected in zip(totals, by_hand):
        assert total == pytest.approx(expected, rel=1e-12)
    assert all(a >= b for a, b in zip(totals, totals[1:]))
    fp32 = zero_model_state_bytes(psi, dp, 0, "fp32")
    assert (fp32.params, fp32.grads, fp32.optimizer) == (4 * psi, 4 * psi, 8 * psi)


@pytest.mark.parametrize("stage", [-1, 4, 1.5, "1", None])
def test_zero_stage_outside_0_to_3(stage):
    with pytest.raises(ValueError, match="zero_stage must be 0, 1, 2 or 3"):
        zero_model_state_bytes(1e9, 8, stage)
    with pytest.raises(ValueError, match="zero must be 0, 1, 2 or 3"):
        Layout(dp=8, zero=stage)


@pytest.mark.parametrize("psi, dp, message", [(0, 8, "num_params must be > 0"),
                                              (-5, 8, "num_params must be > 0"),
                                              (1e9, 0, "dp must be an integer ≥ 1"),
                                              (1e9, 2.0, "dp must be an integer ≥ 1")])
def test_zero_bad_sizes(psi, dp, message):
    with pytest.raises(ValueError, match=message):
        zero_model_state_bytes(psi, dp, 1)


# ---------------------------------------------------------------- activations and pipelines

@pytest.mark.parametrize("name, t", [(name, t) for name in ("gpt2", "gpt2-xl", "llama2-70b")
                                     for t in (1, 2, 4, 5, 8) if preset(name).heads % t == 0])
def test_korthikanti_table_by_hand(name, t):
    c = preset(name)
    s, b, h, a = c.seq_len, 2, c.hidden, c.heads
    tp = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    sp = s * b * h * (34 / t + 5 * a * s / (h * t))
    assert activation_bytes_per_layer(c, b, t) == pytest.approx(tp, rel=1e-12)
    assert activation_bytes_per_layer(c, b, t, True) == pytest.approx(sp, rel=1e-12)
    assert activation_bytes_per_layer(c, b, t, recompute="selective") == pytest.approx(
        s * b * h * (10 + 24 / t), rel=1e-12)
    assert activation_bytes_per_layer(c, b, t, True, "selective") == pytest.approx(
        s * b * h * 34 / t, rel=1e-12)
    assert activation_bytes_per_layer(c, b, t, recompute="full") == 2 * s * b * h
    if t == 1:
        assert tp == pytest.approx(s * b * h * (34 + 5 * a * s / h), rel=1e-12)
        assert sp == pytest.approx(tp, rel=1e-12)


@given(pp=st.integers(1, 12), m=st.integers(1, 40))
def test_inflight_microbatches(pp, m):
    for stage in range(pp):
        assert inflight_microbatches(pp, stage, m) == min(pp - stage, m)
        assert inflight_microbatches(pp, stage, m, "gpipe") == m
    assert max(inflight_microbatches(pp, s, m) for s in range(pp)) == min(pp, m)


def test_inflight_bad_input():
    with pytest.raises(ValueError, match="stage must be in 0..pp−1"):
        inflight_microbatches(4, 4, 8)
    with pytest.raises(ValueError, match="schedule must be one of"):
        inflight_microbatches(4, 0, 8, "zb")
    with pytest.raises(ValueError, match="microbatches must be an integer ≥ 1"):
        inflight_microbatches(4, 0, 0)


# ---------------------------------------------------------------- per-rank memory

def test_single_device_memory_by_hand():
    c = preset("gpt2")
    psi, l, s, h, a, b = c.num_params(), c.layers, c.seq_len, c.hidden, c.heads, 4
    m = memory_per_rank(c, Layout(micro_batch=b))
    assert (m.params, m.grads, m.optimizer, m.buffers) == (2 * psi, 2 * psi, 12 * psi, 0)
    assert m.activations == pytest.approx(l * s * b * h * (34 + 5 * a * s / h), rel=1e-12)
    assert m.total == m.params + m.grads + m.optimizer + m.activations + m.buffers
    assert m.in_gb()["total"] == m.total / 1e9


def test_binding_rank_is_the_largest_stage():
    c = preset("llama2-13b")
    layout = Layout(dp=2, tp=4, pp=5, zero=1, micro_batch=1, microbatches=16)
    stages = [stage_memory(c, layout, s) for s in range(5)]
    worst = memory_per_rank(c, layout)
    assert worst.total == max(st.total for st in stages)
    assert worst.stage == 0                                   # holds p micro-batches
    layers = c.layers // 5
    per_layer = activation_bytes_per_layer(c, 1, 4)
    for s, breakdown in enumerate(stages):
        assert breakdown.activations == pytest.approx(per_layer * layers * (5 - s), rel=1e-12)


def test_buffers_assumption():
    c = TINY_GPT
    none = memory_per_rank(c, Layout())
    assert none.buffers == 0
    dp = memory_per_rank(c, Layout(dp=4, zero=1), bucket_bytes=100)
    assert dp.buffers == 100
    z3 = memory_per_rank(c, Layout(dp=4, zero=3), bucket_bytes=100)
    block = c.layer_breakdown()
    assert z3.buffers == 100 + 2 * 2 * sum(block.values())
    huge_bucket = memory_per_rank(c, Layout(dp=4, zero=0), bucket_bytes=1e12)
    assert huge_bucket.buffers == huge_bucket.grads             # no bigger than the gradients


def test_fp32_training_doubles_weights_and_activations():
    c = preset("gpt2")
    mixed = memory_per_rank(c, Layout())
    fp32 = memory_per_rank(c, Layout(precision="fp32"))
    assert fp32.params == 2 * mixed.params and fp32.grads == 2 * mixed.grads
    assert fp32.optimizer == mixed.optimizer * 8 / 12
    assert fp32.activations == 2 * mixed.activations


@pytest.mark.parametrize("kwargs, message", [
    (dict(tp=5), "tp must divide heads"),
    (dict(tp=16), "tp must divide kv_heads"),
    (dict(pp=3), "pp must divide layers"),
])
def test_layouts_the_model_cannot_take(kwargs, message):
    with pytest.raises(ValueError, match=message):
        memory_per_rank(preset("llama2-70b"), Layout(**kwargs))


def test_tp_must_divide_ffn_hidden():
    config = TransformerConfig(layers=2, hidden=16, heads=4, vocab=10, seq_len=8, ffn_hidden=30)
    with pytest.raises(ValueError, match="tp must divide ffn_hidden"):
        memory_per_rank(config, Layout(tp=4))


@pytest.mark.parametrize("kwargs, message", [
    (dict(dp=0), "dp must be an integer ≥ 1, got 0"),
    (dict(tp=-2), "tp must be an integer ≥ 1, got -2"),
    (dict(micro_batch=0), "micro_batch must be"),
    (dict(microbatches=1.5), "microbatches must be"),
    (dict(recompute="some"), "recompute must be one of"),
    (dict(precision="fp8"), "precision must be one of"),
    (dict(schedule="interleaved"), "schedule must be one of"),
])
def test_layout_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Layout(**kwargs)


# ---------------------------------------------------------------- configurations, bad input

@pytest.mark.parametrize("kwargs, message", [
    (dict(hidden=100, heads=12), "hidden must be divisible by heads: hidden=100, heads=12"),
    (dict(heads=12, kv_heads=5), "heads must be divisible by kv_heads"),
    (dict(layers=0), "layers must be an integer ≥ 1, got 0"),
    (dict(hidden=-64), "hidden must be an integer ≥ 1"),
    (dict(vocab=0), "vocab must be an integer ≥ 1"),
    (dict(seq_len=True), "seq_len must be an integer ≥ 1"),
    (dict(kv_heads=0), "kv_heads must be an integer ≥ 1"),
    (dict(ffn_hidden=0), "ffn_hidden must be an integer ≥ 1"),
    (dict(norm="batchnorm"), "norm must be one of"),
    (dict(mlp="relu"), "mlp must be one of"),
    (dict(positions="alibi"), "positions must be one of"),
    (dict(hidden=36, heads=12, positions="rotary"), "head_dim = hidden / heads must be even"),
])
def test_bad_configs(kwargs, message):
    base = dict(layers=2, hidden=48, heads=12, vocab=100, seq_len=16)
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**{**base, **kwargs})


def test_unknown_preset_lists_the_valid_names():
    with pytest.raises(ValueError) as error:
        preset("gpt3")
    assert "gpt3" in str(error.value)
    for name in PUBLISHED:
        assert name in str(error.value)


def test_config_is_frozen_and_defaults_are_filled():
    c = TransformerConfig(layers=2, hidden=16, heads=4, vocab=10, seq_len=8)
    assert c.kv_heads == 4 and c.ffn_hidden == 64
    with pytest.raises(AttributeError):
        c.layers = 3


# ---------------------------------------------------------------- FLOPs, the step model, Table 1, search

@pytest.mark.parametrize("name", GPT_NAMES)
def test_training_flops_match_narayanan(name):
    c = preset(name)
    B, s, l, h, V = 8, c.seq_len, c.layers, c.hidden, c.vocab
    eq3 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    without = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    assert training_flops(c, B, "full") == pytest.approx(eq3, rel=1e-12)
    assert training_flops(c, B) == pytest.approx(without, rel=1e-12)
    assert training_flops(c, B) < training_flops(c, B, "selective") < training_flops(c, B, "full")
    assert 3 * B * forward_flops_per_sequence(c) == training_flops(c, B)


@pytest.mark.parametrize("pp, m, v", [(1, 1, 1), (2, 3, 1), (4, 8, 1), (8, 5, 1), (4, 8, 2),
                                      (2, 6, 5)])
def test_step_bubble_fraction(pp, m, v):
    c = preset("llama2-13b")          # 40 layers: 10 per stage at pp 4, 20 at pp 2
    step = estimate_step(c, Layout(dp=2, tp=2, pp=pp, microbatches=m, chunks=v))
    pipeline = (step.compute_seconds + step.tensor_comm_seconds + step.pipeline_comm_seconds)
    # Narayanan et al. 2021: bubble ÷ ideal time = (p − 1)/(v·m)
    assert step.bubble_seconds / pipeline == pytest.approx((pp - 1) / (v * m), rel=1e-12)
    assert step.seconds == pytest.approx(pipeline + step.bubble_seconds + step.data_comm_seconds
                                         + step.optimizer_seconds, rel=1e-12)
    assert 0 < step.mfu < 1
    assert (step.pipeline_comm_seconds > 0) == (pp > 1)


def test_interleaving_pays_v_times_the_sends():
    c = preset("llama2-13b")
    plain = estimate_step(c, Layout(dp=2, tp=2, pp=4, microbatches=8))
    interleaved = estimate_step(c, Layout(dp=2, tp=2, pp=4, microbatches=8, chunks=2))
    assert interleaved.pipeline_comm_seconds == pytest.approx(2 * plain.pipeline_comm_seconds)
    assert interleaved.bubble_seconds < plain.bubble_seconds
    with pytest.raises(ValueError, match="chunks must divide the layers per stage"):
        estimate_step(c, Layout(pp=4, microbatches=8, chunks=3))     # 10 layers a stage
    with pytest.raises(ValueError, match="microbatches a multiple of pp=4"):
        Layout(pp=4, microbatches=6, chunks=2)
    with pytest.raises(ValueError, match="needs pp > 1"):
        Layout(chunks=2)


def test_zero_is_charged_per_microbatch():
    """The old proxy charged ZeRO-2/3 once per step: ZeRO-3 on 64 ranks cost the same at m = 2
    and m = 16. Per micro-batch, m = 16 must cost more, and ZeRO-3 more than ZeRO-1."""
    c = preset("llama2-7b")
    z3 = [estimate_step(c, Layout(dp=64, zero=3, microbatches=m)) for m in (2, 16)]
    assert z3[1].data_comm_seconds > 4 * z3[0].data_comm_seconds
    z2 = [estimate_step(c, Layout(dp=64, zero=2, microbatches=m)) for m in (2, 16)]
    assert z2[1].data_comm_seconds > z2[0].data_comm_seconds
    z1 = [estimate_step(c, Layout(dp=64, zero=1, microbatches=m)) for m in (2, 16)]
    assert z1[1].data_comm_seconds == z1[0].data_comm_seconds       # once per step
    assert z3[1].data_comm_seconds > z2[1].data_comm_seconds > z1[1].data_comm_seconds


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_2_3_with_pipelines_refused(zero):
    with pytest.raises(ValueError, match=f"zero={zero} with pp=8 is refused.*DeepSpeed"):
        Layout(dp=4, tp=2, pp=8, zero=zero)
    results = search_layouts(preset("llama2-70b"), 64, 1024, 80e9, only_fitting=False)
    assert not any(r.layout.zero >= 2 and r.layout.pp > 1 for r in results)
    assert any(r.layout.zero >= 2 for r in results)


def test_data_parallel_allreduce_overlaps_backward_only_without_pipeline():
    c = preset("gpt2-xl")
    psi = params_per_rank(c)
    ring = 2 * 15 / 16 * 2 * psi / 25e9 + 2 * 15 * 1.5e-6     # 16 ranks over InfiniBand
    overlapped = estimate_step(c, Layout(dp=16, micro_batch=8, microbatches=4))
    assert overlapped.data_comm_seconds < ring / 2            # hidden behind the backward
    piped = estimate_step(c, Layout(dp=16, pp=2, micro_batch=8, microbatches=4))
    psi_piped = max(params_per_rank(c, 1, 2, 0), params_per_rank(c, 1, 2, 1))
    assert piped.data_comm_seconds == pytest.approx(
        2 * 15 / 16 * 2 * psi_piped / 25e9 + 2 * 15 * 1.5e-6, rel=1e-12)   # after the flush


def test_small_matrices_fall_below_peak():
    big = achieved_fraction(8192, 8192, 8192)
    thin = achieved_fraction(2048, 64, 2048, batch=32)       # attention scores, head dim 64
    tiny = achieved_fraction(16, 16, 16)
    assert big == pytest.approx(GEMM_EFFICIENCY)
    assert tiny < 1e-3 < thin < big
    assert matmul_seconds(16, 16, 16) == KERNEL_SECONDS
    small = estimate_step(TINY_GPT, Layout(microbatches=4))
    large = estimate_step(preset("gpt2-xl"), Layout(microbatches=4))
    assert small.mfu < 0.01 < large.mfu < GEMM_EFFICIENCY
    # with short sequences a micro-batch of one leaves the products memory-bound: larger
    # micro-batches fill the GPU better (the old proxy always preferred b = 1)
    short = TransformerConfig.gpt_style(layers=12, hidden=768, heads=12, vocab=50257, seq_len=64)
    mfus = [estimate_step(short, Layout(micro_batch=b, microbatches=64 // b)).mfu
            for b in (1, 2, 4, 8)]
    assert mfus == sorted(mfus) and mfus[0] < mfus[-1]


def test_step_terms_vanish_and_scale_where_they_should():
    c = preset("gpt2-xl")
    alone = estimate_step(c, Layout(microbatches=4))
    assert alone.tensor_comm_seconds == alone.data_comm_seconds == alone.bubble_seconds == 0
    assert alone.pipeline_comm_seconds == 0 and 0 < alone.mfu < GEMM_EFFICIENCY
    full = estimate_step(c, Layout(recompute="full", microbatches=4))
    selective = estimate_step(c, Layout(recompute="selective", microbatches=4))
    assert alone.seconds < selective.seconds < full.seconds
    tp = estimate_step(c, Layout(tp=5, microbatches=4))
    assert tp.tensor_comm_seconds > 0 and tp.compute_seconds < alone.compute_seconds


def test_megatron_table1_rows():
    rows = megatron_table1()
    published = [137, 138, 142, 135, 138, 140, 148, 155, 163, 163]     # the paper's Table 1
    assert [r.published_tflops for r in rows] == published
    assert [r.layout.devices for r in rows] == [32, 64, 128, 256, 512, 1024, 1536, 1920, 2520,
                                                 3072]
    assert [r.layout.global_batch for r in rows] == [512, 512, 512, 1024, 1536, 1792, 2304,
                                                      2160, 2520, 3072]
    billions = [1.7, 3.6, 7.5, 18.4, 39.1, 76.1, 145.6, 310.1, 529.6, 1008.0]
    for row, size in zip(rows, billions):
        assert narayanan_params(row.config) / 1e9 == pytest.approx(size, abs=0.06)
        assert row.layout.recompute == "full"
        assert abs(row.predicted_tflops / row.published_tflops - 1) <= 0.10
        assert memory_per_rank(row.config, row.layout).total <= 80e9
        step = estimate_step(row.config, row.layout)
        eq3 = training_flops(row.config, row.layout.global_batch, "full")
        assert row.predicted_tflops == pytest.approx(eq3 / (row.layout.devices * step.seconds)
                                                     / 1e12, rel=1e-12)


def _independent_enumeration(config, devices, global_batch, micro_batches):
    count = 0
    for tp in range(1, devices + 1):
        for pp in range(1, devices + 1):
            if devices % (tp * pp):
                continue
            dp = devices // (tp * pp)
            if (config.heads % tp or config.kv_heads % tp or config.ffn_hidden % tp
                    or config.layers % pp):
                continue
            for b in micro_batches:
                if global_batch % (dp * b) == 0:
                    stages = (4 if pp == 1 else 2) if dp > 1 else 1   # ZeRO-2/3 only at pp 1
                    count += stages * 3 * (2 if tp > 1 else 1)
    return count


@pytest.mark.parametrize("name, devices, batch", [("llama2-70b", 64, 1024), ("gpt2-xl", 24, 48),
                                                   ("llama2-7b", 7, 14)])
def test_search_enumerates_and_filters(name, devices, batch):
    c = preset(name)
    everything = search_layouts(c, devices, batch, 80e9, only_fitting=False)
    assert len(everything) == _independent_enumeration(c, devices, batch, (1, 2, 4, 8))
    for result in everything:
        layout = result.layout
        assert layout.devices == devices and layout.global_batch == batch
        assert c.heads % layout.tp == 0 and c.layers % layout.pp == 0
        assert result.fits == (result.memory.total <= 80e9)
        assert result.memory == memory_per_rank(c, layout)
    fitting = search_layouts(c, devices, batch, 80e9)
    assert fitting == [r for r in everything if r.fits]
    assert [r.step.seconds for r in fitting] == sorted(r.step.seconds for r in fitting)
    if name == "llama2-70b":
        assert max(r.layout.tp for r in everything) == 8            # kv_heads = 8
        assert not any(r.layout.zero == 0 and r.layout.dp == 64 for r in fitting)


def test_pareto_frontier_is_not_dominated():
    results = search_layouts(preset("llama2-70b"), 64, 1024, 80e9)
    frontier = pareto_frontier(results)
    assert frontier
    for point in frontier:
        assert not any(r.memory.total <= point.memory.total and r.step.mfu > point.step.mfu
                       for r in results)
    for r in results:
        assert any(p.memory.total <= r.memory.total and p.step.mfu >= r.step.mfu
                   for p in frontier)
    for lower, higher in zip(frontier, frontier[1:]):      # strictly more memory, strictly faster
        assert lower.memory.total < higher.memory.total and lower.step.mfu < higher.step.mfu


def test_nothing_fits_a_tiny_device():
    assert search_layouts(preset("llama2-7b"), 8, 8, 1e9) == []


@pytest.mark.parametrize("kwargs, message", [
    (dict(devices=0), "devices must be an integer ≥ 1, got 0"),
    (dict(global_batch=-1), "global_batch must be an integer ≥ 1"),
    (dict(device_bytes=0), "device_bytes must be > 0"),
    (dict(zero_stages=(0, 5)), "zero_stages must hold stages 0–3"),
])
def test_search_bad_input(kwargs, message):
    args = dict(devices=8, global_batch=8, device_bytes=80e9)
    with pytest.raises(ValueError, match=message):
        search_layouts(preset("gpt2"), **{**args, **kwargs})


@pytest.mark.parametrize("pp, m, v", [(4, 8, 2), (4, 4, 3), (2, 8, 4), (8, 16, 2), (4, 12, 2)])
def test_interleaved_inflight_against_the_schedule(pp, m, v):
    """The accountant's in-flight count for the interleaved schedule, against the peak of
    forwards-not-yet-backwarded read from week 5's own interleaved op lists."""
    from dsml.pipeline import schedule

    for stage, ops in enumerate(schedule("interleaved", pp, m, chunks=v)):
        held = peak = 0
        for op in ops:
            held += 1 if op.kind == "F" else -1
            peak = max(peak, held)
        assert inflight_microbatches(pp, stage, m, chunks=v) == pytest.approx(peak / v)


def test_bf16_holds_the_bytes_of_fp16_mixed_precision():
    """bf16 drops the loss scale, not bytes: 2 + 2 + 12 per parameter, 16-bit activations."""
    c = preset("llama2-7b")
    for layout in (Layout(dp=8, zero=1, micro_batch=2), Layout(tp=2, pp=2, microbatches=4)):
        fp16 = memory_per_rank(c, layout)
        bf16 = memory_per_rank(c, Layout(**{**layout.__dict__, "precision": "bf16"}))
        assert bf16 == fp16
    assert zero_model_state_bytes(1000, 1, 0, "bf16").total == 16 * 1000


def test_zero_1_pays_the_weights_all_gather_and_zero_3_none_after_the_step():
    """ZeRO-1 and 2 all-gather the updated 16-bit weights after the optimizer step, where no
    backward hides it; ZeRO-1 is not plain DDP. ZeRO-3 gathers in the next forward instead."""
    from dsml.step_model import ring_seconds
    from dsml.net.presets import LINKS
    c = preset("llama2-7b")
    weights = 2 * params_per_rank(c)
    gather = ring_seconds("all_gather", weights, 64, LINKS["ib_hdr"].alpha,
                          LINKS["ib_hdr"].bandwidth)
    z0, z1, z2 = (estimate_step(c, Layout(dp=64, zero=z)).data_comm_seconds for z in (0, 1, 2))
    assert z1 >= gather > z0
    assert z1 == z2                 # one micro-batch: the same reduce-scatter and all-gather
    z3 = [estimate_step(c, Layout(dp=64, zero=3, microbatches=m)).data_comm_seconds
          for m in (1, 2)]
    assert z3[1] == pytest.approx(2 * z3[0], rel=1e-12)     # nothing charged once per step
