"""Reference solutions of week 5's exercises (model parallelism and memory).

Each function has the name of the notebook stub it solves; `check(id, f)` passes for each.
All of them are short: the point of each exercise is the reasoning in its statement.
"""
from __future__ import annotations

from dsml.model_config import preset
from dsml.memory import GB, Layout, memory_per_rank


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


def zb_h1(stage, stages, microbatches):
    """Exercise 5.9: 1F1B's order of F and B, each B followed by a W — except that stage i
    postpones its first i W's (at most m) to the end, where they fill the idle slots that the
    last backwards leave; from then on each B is followed by the oldest waiting W."""
    warmup = min(stages - stage - 1, microbatches)
    ops = [("F", j) for j in range(warmup)]
    waiting = []
    for k in range(microbatches):
        if warmup + k < microbatches:
            ops.append(("F", warmup + k))
        ops.append(("B", k))
        waiting.append(k)
        if k >= stage:
            ops.append(("W", waiting.pop(0)))
    return ops + [("W", j) for j in waiting]


def fsdp_step_time(gather, scatter, forward, backward, prefetch):
    """Exercise 5.10: without prefetch every gather, computation and scatter in turn (the
    backward gathers again); with it, a layer's compute and the next layer's gather run side
    by side and the next layer waits for the longer — in the backward the next layer is the
    one before; the first gather of each pass and every scatter stay exposed."""
    g, s, f, b = gather, scatter, forward, backward
    if not prefetch:
        return 2 * sum(g) + sum(f) + sum(b) + sum(s)
    last = len(g) - 1
    forward_pass = g[0] + sum(max(f[i], g[i + 1]) for i in range(last)) + f[last]
    backward_pass = g[last] + sum(max(b[i], g[i - 1]) for i in range(last, 0, -1)) + b[0]
    return forward_pass + backward_pass + sum(s)


def zero_step_bytes(psi, nd, stage, microbatches):
    """Exercise 5.11: one ring reduce-scatter or all-gather of 2Ψ bytes sends (N_d − 1)/N_d of
    them. ZeRO-0 all-reduces once (two of those); ZeRO-1 reduce-scatters once and all-gathers
    the updated weights once; ZeRO-2 reduce-scatters after every micro-batch, then
    all-gathers once; ZeRO-3 gathers the weights for every micro-batch's forward and again
    for its backward, and reduce-scatters its gradients."""
    ring = 2 * psi * (nd - 1) / nd
    collectives = {0: 2, 1: 2, 2: microbatches + 1, 3: 3 * microbatches}[stage]
    return collectives * ring
