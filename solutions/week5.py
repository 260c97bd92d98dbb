"""Reference solutions of week 5's exercises (model parallelism and memory).

Each function has the name of the notebook stub it solves; `check(id, f)` passes for each.
All of them are short: the point of each exercise is the reasoning in its statement.
"""
from __future__ import annotations

from dsml.memory import GB, Layout, memory_per_rank, preset


def tp_mlp_bytes(batch, seq, hidden, tp, itemsize):
    """Exercise 5.1: a Megatron MLP all-reduces the b·s·h activations once forward and once
    backward; a ring all-reduce of n bytes sends 2(t − 1)/t · n from every rank."""
    n = batch * seq * hidden * itemsize
    return 2 * 2 * (tp - 1) * n / tp


def bubble_fraction(busy):
    """Exercise 5.2: idle ÷ total stage time, the total being p × (last end − first start)."""
    start = min(s for stage in busy for s, _ in stage)
    end = max(e for stage in busy for _, e in stage)
    work = sum(e - s for stage in busy for s, e in stage)
    return 1 - work / (len(busy) * (end - start))


def one_f_one_b(stage, stages, microbatches):
    """Exercise 5.3: min(p − i − 1, m) warm-up forwards, then F and B in turn, then the
    remaining backwards."""
    warmup = min(stages - stage - 1, microbatches)
    ops = [("F", j) for j in range(warmup)]
    done = 0
    for j in range(warmup, microbatches):
        ops += [("F", j), ("B", done)]
        done += 1
    return ops + [("B", j) for j in range(done, microbatches)]


def peak_inflight(ops):
    """Exercise 5.4: +1 at every forward, −1 at every backward; the largest count."""
    held = peak = 0
    for kind, _ in ops:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


def zero_bytes(psi, nd, stage, k):
    """Exercise 5.5: 2Ψ parameters + 2Ψ gradients + KΨ optimizer state; stage 1 divides the
    optimizer state by N_d, stage 2 the gradients too, stage 3 the parameters too."""
    params = 2 * psi / (nd if stage >= 3 else 1)
    grads = 2 * psi / (nd if stage >= 2 else 1)
    optimizer = k * psi / (nd if stage >= 1 else 1)
    return params + grads + optimizer


def gpt_num_params(layers, hidden, vocab, positions):
    """Exercise 5.6: per layer 12h² + 13h (attention 4h² + 4h, MLP 8h² + 5h, two LayerNorms
    4h), embeddings (V + s)h with the head tied to them, and the final LayerNorm 2h."""
    h = hidden
    return layers * (12 * h * h + 13 * h) + (vocab + positions) * h + 2 * h


def activation_bytes(seq, batch, hidden, heads, tp, sequence_parallel, selective):
    """Exercise 5.7: sbh(10 + 24/t + 5as/(ht)) (Korthikanti et al. 2022); 34/t in place of
    10 + 24/t with sequence parallelism; no 5as/(ht) with selective recomputation."""
    linear = 34 / tp if sequence_parallel else 10 + 24 / tp
    attention = 0 if selective else 5 * heads * seq / (hidden * tp)
    return seq * batch * hidden * (linear + attention)


def smallest_fitting_tp(model, dp, pp, zero, micro_batch, microbatches, device_gb):
    """Exercise 5.8: try t = 1 … 8 that divide the heads, key/value heads and MLP width; the
    first whose most loaded rank fits (selective recomputation, sequence parallelism)."""
    config = preset(model)
    for tp in range(1, 9):
        if config.heads % tp or config.kv_heads % tp or config.ffn_hidden % tp:
            continue
        layout = Layout(dp=dp, tp=tp, pp=pp, zero=zero, micro_batch=micro_batch,
                        microbatches=microbatches, recompute="selective", sequence_parallel=True)
        if memory_per_rank(config, layout).total <= device_gb * GB:
            return tp
    return None
