"""Plumbing (hand-written): the checkers of week 5's exercises (model parallelism and memory).

Each checker calls the learner's function on inputs different from the worked example in the
notebook and raises `Wrong` with a hint that says what was tried, what was expected, what came
back and what to reconsider. Where the truth can be measured it is: the bytes a tensor-parallel
rank sends are read from the simulator's trace of the two ring all-reduces a Megatron MLP makes;
a parameter count is the sum of the sizes of the tensors a GPT-2-style model allocates, listed
shape by shape. The rest are held against exact references written here: the bubble fraction
of a timeline, the 1F1B order of one stage (warm-up, steady state, cool-down), the peak number
of micro-batches in flight, the ZeRO bytes per rank, and the activation bytes of Korthikanti et
al. (2022). The layout that fits is found by trying every tensor-parallel size with the week's
memory accountant (`dsml.memory`). ZB-H1's order is the library's schedule-as-data
(`dsml.pipeline.schedule`); ZeRO-3's step time with and without prefetch is the prediction
(`dsml.zero.fsdp_step_prediction`) the notebook holds against the simulator; the bytes a
data-parallel rank sends per step are read from the step model (`dsml.step_model.estimate_step`)
run on a 1 B/s link with free compute.

This module imports from the lower layers only (`dsml.comm`, `dsml.net`, `dsml.collectives`,
`dsml.model_config`, `dsml.memory`, `dsml.step_model`, `dsml.pipeline`, `dsml.zero`),
never the top-level `dsml` package, which sits above it.
"""
from __future__ import annotations

import math

import numpy as np

from dsml.collectives.allreduce import allreduce
from dsml.comm.api import SizeOnly
from dsml.comm.run import run
from dsml.exercises import Wrong, as_float, checker, fresh_rng
from dsml.model_config import preset
from dsml.memory import GB, Layout, memory_per_rank, params_per_rank, zero_model_state_bytes
from dsml.step_model import estimate_step
from dsml.net.alphabeta import AlphaBeta
from dsml.pipeline import schedule
from dsml.zero import fsdp_step_prediction


# --- 5.1: the bytes of tensor parallelism ----------------------------------------------------

# (batch, sequence, hidden, tensor-parallel size, bytes per element): b·s·h divisible by t.
# The first case has 4-byte elements, so that leaving out the bytes (÷ 4) and leaving out a
# factor 2 (÷ 2) give different numbers and different hints.
TP_CASES = [(2, 16, 64, 4, 4), (1, 8, 48, 3, 2), (4, 32, 256, 8, 2), (3, 10, 20, 2, 8),
            (2, 4, 8, 1, 2)]


def _two_ring_allreduces(comm, nbytes):
    """What one Megatron MLP moves in a forward and a backward pass: two ring all-reduces of
    the b·s·h activations (forward: after the row-parallel layer; backward: before the
    column-parallel one)."""
    for _ in range(2):
        yield from allreduce(comm, SizeOnly(nbytes), algorithm="ring")
    return None


def measured_tp_bytes(batch: int, seq: int, hidden: int, tp: int, itemsize: int) -> int:
    """Bytes rank 0 sends in the MLP's two all-reduces, read from the simulator's trace."""
    nbytes = batch * seq * hidden * itemsize
    result = run(_two_ring_allreduces, tp, network=AlphaBeta(1e-6, 1e-9), args=(nbytes,))
    return sum(r.nbytes for r in result.trace.of_rank(0) if r.op in ("send", "sendrecv"))


def fresh_tp_cases(rng, count: int = 3) -> list:
    """`count` cases drawn from `rng` (t = 2 … 8, hidden a multiple of t), so that answers
    remembered from earlier checks do not pass."""
    cases = []
    for _ in range(count):
        tp = int(rng.integers(2, 9))
        cases.append((int(rng.integers(1, 5)), int(rng.integers(2, 65)),
                      tp * int(rng.integers(1, 33)), tp, int(rng.choice([2, 4, 8]))))
    return cases


@checker("5.1", "the bytes a tensor-parallel rank sends",
         builds=("dsml.tensor_parallel.tp_block_bytes_per_rank",))
def check_tp_mlp_bytes(tp_mlp_bytes):
    cases = [(case, False) for case in TP_CASES]
    cases += [(case, True) for case in fresh_tp_cases(fresh_rng())]
    for (batch, seq, hidden, tp, itemsize), fresh in cases:
        expected = measured_tp_bytes(batch, seq, hidden, tp, itemsize)
        call = (f"tp_mlp_bytes(batch={batch}, seq={seq}, hidden={hidden}, tp={tp}, "
                f"itemsize={itemsize})")
        got = as_float(tp_mlp_bytes(batch, seq, hidden, tp, itemsize), call)
        if math.isclose(got, expected, rel_tol=1e-12, abs_tol=1e-9):
            continue
        n = batch * seq * hidden * itemsize
        if expected and math.isclose(got, expected / 2):
            advice = ("That is half the bytes. Perhaps one all-reduce only: the backward pass "
                      "needs a second one (the gradient with respect to the MLP's input is a "
                      "sum over the ranks too). Or perhaps the ring's factor 2: a ring "
                      "all-reduce is a reduce-scatter and then an all-gather, and each sends.")
        elif math.isclose(got, 2 * 2 * (tp - 1) * n):
            advice = ("A ring all-reduce does not send the whole tensor p − 1 times: it sends "
                      "p − 1 blocks of n/p in its reduce-scatter and p − 1 in its all-gather.")
        elif math.isclose(got, 2 * n):
            advice = "Each rank sends 2(t − 1)/t of n per all-reduce, not n; and nothing if t = 1."
        elif math.isclose(got * itemsize, expected):
            advice = "Count bytes, not elements: multiply by the itemsize."
        else:
            advice = ("Two ring all-reduces of the b·s·h activations per MLP (one forward, one "
                      "backward), each 2(t − 1)/t · n bytes from every rank.")
        if fresh:      # say the inputs, so the learner can rerun them; not the answer
            raise Wrong(f"{call} returned {got:g}, not the bytes the simulator measured rank 0 "
                        f"sending (a case drawn afresh for this check: call your function with "
                        f"these inputs to reproduce it). {advice}")
        raise Wrong(f"{call} returned {got:g}; the simulator measured {expected} B sent by "
                    f"rank 0. {advice}")
    return "matches the bytes read from the simulator's trace, t = 1 to 8, fixed and fresh cases"


# --- 5.2: the bubble fraction of a timeline -------------------------------------------------

def bubble_reference(busy) -> float:
    """Idle time ÷ total stage time: p stages × the span from the first start to the last end."""
    starts = [start for stage in busy for start, _ in stage]
    ends = [end for stage in busy for _, end in stage]
    span = max(ends) - min(starts)
    work = sum(end - start for stage in busy for start, end in stage)
    return 1.0 - work / (len(busy) * span)


def pipeline_timeline(stages: int, microbatches: int, t_forward, t_backward) -> list:
    """The busy intervals of a GPipe step (all forwards, then all backwards), each operation
    as early as its dependencies allow; `t_forward[i]`, `t_backward[i]` per stage."""
    p, m = stages, microbatches
    f_end = [[0.0] * m for _ in range(p)]
    b_end = [[0.0] * m for _ in range(p)]
    busy = [[] for _ in range(p)]
    free = [0.0] * p
    for j in range(m):
        for i in range(p):
            start = max(free[i], f_end[i - 1][j] if i else 0.0)
            f_end[i][j] = free[i] = start + t_forward[i]
            busy[i].append((start, f_end[i][j]))
    for j in range(m):
        for i in reversed(range(p)):
            start = max(free[i], b_end[i + 1][j] if i < p - 1 else f_end[i][j])
            b_end[i][j] = free[i] = start + t_backward[i]
            busy[i].append((start, b_end[i][j]))
    return busy


def bubble_cases() -> list:
    """Timelines with equal and unequal stages, and a hand-made one with a gap in the middle."""
    cases = [pipeline_timeline(4, 6, [1.0] * 4, [2.0] * 4),
             pipeline_timeline(3, 2, [1.0, 3.0, 2.0], [2.0, 6.0, 4.0]),
             pipeline_timeline(5, 9, [0.5] * 5, [1.0] * 5),
             pipeline_timeline(2, 1, [1.0, 1.0], [1.0, 1.0]),
             [[(0.0, 2.0), (5.0, 6.0)], [(1.0, 3.0)], [(2.5, 4.0), (4.0, 5.5)]]]
    return cases


@checker("5.2", "the bubble fraction of a timeline")
def check_bubble_fraction(bubble_fraction):
    for busy in bubble_cases():
        expected = bubble_reference(busy)
        shown = [stage[:2] + (["…"] if len(stage) > 2 else []) for stage in busy]
        call = f"bubble_fraction({shown})"
        got = as_float(bubble_fraction([list(stage) for stage in busy]), call)
        if math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12):
            continue
        work = sum(end - start for stage in busy for start, end in stage)
        span = max(e for s in busy for _, e in s) - min(s0 for s in busy for s0, _ in s)
        idle = len(busy) * span - work
        own = np.mean([1 - sum(e - s for s, e in stage) / (stage[-1][1] - stage[0][0])
                       for stage in busy])
        if math.isclose(got, idle / work):
            advice = ("That is idle ÷ busy (Megatron's bubble relative to the ideal time); the "
                      "GPipe definition divides by the total: p × the span of the whole step.")
        elif math.isclose(got, own):
            advice = ("Each stage's idle time counts from the start of the whole step to its "
                      "end, not from that stage's own first operation: waiting to begin is "
                      "the bubble too.")
        elif math.isclose(got, 1 - expected):
            advice = "That is the busy fraction; the bubble is the idle share, 1 minus it."
        else:
            advice = ("Total stage time = number of stages × (last end − first start); idle = "
                      "that minus the sum of every interval's length.")
        raise Wrong(f"{call} returned {got:.6g}, expected {expected:.6g}. {advice}")
    return "idle ÷ total stage time, on even, uneven and gapped timelines"


# --- 5.3 and 5.4: 1F1B and what it holds ----------------------------------------------------

def one_f_one_b_reference(stage: int, stages: int, microbatches: int) -> list:
    """PipeDream-Flush: min(p − i − 1, m) warm-up forwards, then one forward and one backward
    in turn, then the remaining backwards."""
    warmup = min(stages - stage - 1, microbatches)
    ops = [("F", j) for j in range(warmup)]
    backward = 0
    for j in range(warmup, microbatches):
        ops += [("F", j), ("B", backward)]
        backward += 1
    ops += [("B", j) for j in range(backward, microbatches)]
    return ops


# (0, 6, 3) and (1, 8, 2): fewer micro-batches than the warm-up p − i − 1 would want.
ONE_F_ONE_B_CASES = [(0, 4, 8), (2, 4, 8), (3, 4, 8), (0, 3, 2), (0, 6, 3), (1, 5, 3), (0, 1, 4),
                     (4, 6, 6), (1, 8, 2)]


def _as_ops(got, call) -> list:
    try:
        return [(str(kind), int(j)) for kind, j in got]
    except (TypeError, ValueError):
        raise Wrong(f"{call} returned {got!r}; expected a list of (\"F\" or \"B\", "
                    f"micro-batch) pairs") from None


@checker("5.3", "the order of operations of one 1F1B stage",
         builds=("dsml.pipeline.one_f_one_b_ops", "dsml.pipeline.interleaved_ops"))
def check_one_f_one_b(one_f_one_b):
    for stage, stages, m in ONE_F_ONE_B_CASES:
        expected = one_f_one_b_reference(stage, stages, m)
        call = f"one_f_one_b(stage={stage}, stages={stages}, microbatches={m})"
        got = _as_ops(one_f_one_b(stage, stages, m), call)
        if got == expected:
            continue
        first_b = next((k for k, (kind, _) in enumerate(got) if kind == "B"), len(got))
        want_first_b = next(k for k, (kind, _) in enumerate(expected) if kind == "B")
        if any(j >= m for _, j in got) and m < stages - stage - 1:
            advice = (f"Micro-batch numbers run past m − 1 = {m - 1}: here m is smaller than "
                      f"p − i − 1 = {stages - stage - 1}, so the warm-up runs out of "
                      f"micro-batches before it is done.")
        elif sorted(got) != sorted(expected):
            advice = "Each micro-batch needs exactly one F and one B on every stage."
        elif got == [("F", j) for j in range(m)] + [("B", j) for j in range(m)]:
            advice = ("That is GPipe's order (all forwards, then all backwards), which holds all "
                      "m micro-batches; 1F1B starts backwards as soon as it can.")
        elif first_b == want_first_b + 1:
            advice = (f"One warm-up forward too many: stage {stage} runs p − i − 1 = "
                      f"{stages - stage - 1} forwards before its steady state, whose first "
                      f"forward is followed at once by the first backward.")
        elif first_b == want_first_b - 1:
            advice = (f"One warm-up forward too few: stage {stage} runs p − i − 1 = "
                      f"{stages - stage - 1} forwards (at most m) before its steady state.")
        else:
            advice = ("Warm-up: min(p − i − 1, m) forwards; steady state: F then B, in turn; "
                      "cool-down: the remaining backwards, in micro-batch order.")
        raise Wrong(f"{call} returned {got}, expected {expected}. {advice}")
    return "warm-up, steady state and cool-down on first, middle and last stages"


def peak_reference(ops) -> int:
    """The most micro-batches whose forward has run and whose backward has not."""
    held = peak = 0
    for kind, _ in ops:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


def peak_cases() -> list:
    """GPipe and 1F1B orders, and seeded random orders in which each backward follows its
    forward, backwards in micro-batch order."""
    cases = [one_f_one_b_reference(0, 4, 8), one_f_one_b_reference(3, 4, 8),
             [("F", j) for j in range(5)] + [("B", j) for j in range(5)]]
    rng = np.random.default_rng(5004)
    for m in (4, 7, 10):
        ops, forwards, backwards = [], 0, 0
        while backwards < m:
            if forwards < m and (forwards == backwards or rng.random() < 0.55):
                ops.append(("F", forwards))
                forwards += 1
            else:
                ops.append(("B", backwards))
                backwards += 1
        cases.append(ops)
    return cases


@checker("5.4", "the peak number of micro-batches in flight")
def check_peak_inflight(peak_inflight):
    for ops in peak_cases():
        expected = peak_reference(ops)
        call = f"peak_inflight({ops if len(ops) <= 8 else ops[:8] + ['…']})"
        got = as_float(peak_inflight(list(ops)), call)
        if got == expected:
            continue
        forwards = sum(kind == "F" for kind, _ in ops)
        before_first_b = next(k for k, (kind, _) in enumerate(ops) if kind == "B")
        if got == forwards:
            advice = ("That counts every forward; a backward frees its micro-batch's "
                      "activations, so count forwards minus backwards as you go.")
        elif got == before_first_b:
            advice = ("The forwards before the first backward are not always the peak: later "
                      "forwards can come faster than backwards; track the count at every step.")
        elif got == expected - 1 or got == expected + 1:
            advice = ("Off by one: a micro-batch is held from the end of its forward to the end "
                      "of its backward; take the maximum after each forward.")
        else:
            advice = "Walk the list: +1 at each F, −1 at each B; return the largest count."
        raise Wrong(f"{call} returned {got:g}, expected {expected}. {advice}")
    return "on GPipe, 1F1B and irregular orders"


# --- 5.5: ZeRO's bytes per rank ----------------------------------------------------------------

def zero_reference(psi: float, nd: int, stage: int, k: float) -> float:
    """Model-state bytes per rank with mixed-precision Adam (2 B parameters, 2 B gradients,
    K B optimizer state per parameter), Rajbhandari et al. 2020."""
    params, grads, optimizer = 2 * psi, 2 * psi, k * psi
    if stage >= 1:
        optimizer /= nd
    if stage >= 2:
        grads /= nd
    if stage >= 3:
        params /= nd
    return params + grads + optimizer


ZERO_CASES = [(1e9, 8, 0, 12), (1e9, 8, 1, 12), (1e9, 8, 2, 12), (1e9, 8, 3, 12),
              (3e6, 3, 2, 12), (6e6, 12, 1, 16), (2.5e8, 4, 3, 12), (7e5, 7, 2, 8),
              (1e6, 1, 3, 12)]


@checker("5.5", "ZeRO's model-state bytes per rank", builds=("dsml.memory.zero_model_state_bytes",))
def check_zero_bytes(zero_bytes):
    fresh = fresh_rng()       # three more cases, drawn afresh for every check
    cases = [(case, "") for case in ZERO_CASES]
    cases += [((float(f"{10 ** fresh.uniform(5, 10):.3g}"), int(fresh.integers(2, 65)),
                int(fresh.integers(0, 4)), int(fresh.choice([8, 12, 16]))),
               " (a case drawn afresh for this check)") for _ in range(3)]
    for (psi, nd, stage, k), drawn in cases:
        expected = zero_reference(psi, nd, stage, k)
        call = f"zero_bytes(psi={psi:g}, nd={nd}, stage={stage}, k={k}){drawn}"
        got = as_float(zero_bytes(psi, nd, stage, k), call)
        if math.isclose(got, expected, rel_tol=1e-12):
            continue
        if stage in (2, 3) and math.isclose(got, zero_reference(psi, nd, stage - 1, k)):
            advice = (f"That is stage {stage - 1}'s figure: stage 2 also shards the gradients "
                      f"(reduce-scatter, each rank keeps 1/N_d), stage 3 the parameters too.")
        elif stage in (1, 2) and math.isclose(got, zero_reference(psi, nd, stage + 1, k)):
            advice = (f"Stage {stage} shards less than that: stage 1 only the optimizer state, "
                      f"stage 2 also the gradients, and only stage 3 the parameters.")
        elif math.isclose(got, zero_reference(psi, nd, stage, 12)) and k != 12:
            advice = "Use the k given: the optimizer's bytes per parameter is an argument."
        elif math.isclose(got, zero_reference(psi, nd, stage, k + 4)):
            advice = ("Parameters (2 B) and gradients (2 B) are counted apart from the "
                      "optimizer state: K covers the fp32 master copy, momentum and variance.")
        else:
            advice = ("Per parameter: 2 B of fp16 weights, 2 B of fp16 gradients, K B of "
                      "optimizer state; each stage divides one more of them by N_d.")
        shown = "" if drawn else f", expected {expected:.6g} B"
        raise Wrong(f"{call} returned {got:.6g} B{shown}. {advice}")
    return "every stage, K = 8, 12 and 16, N_d = 1 to 12"


# --- 5.6: the exact parameter count of a GPT-2-style model ----------------------------------

def gpt_shapes(layers: int, hidden: int, vocab: int, positions: int) -> list:
    """Every parameter tensor of a GPT-2-style model (tied output head), as shapes."""
    h = hidden
    shapes = [(vocab, h), (positions, h)]
    for _ in range(layers):
        shapes += [(h,), (h,),                    # LayerNorm before attention
                   (h, 3 * h), (3 * h,),          # query, key, value
                   (h, h), (h,),                  # attention output
                   (h,), (h,),                    # LayerNorm before the MLP
                   (h, 4 * h), (4 * h,),          # MLP up
                   (4 * h, h), (h,)]              # MLP down
    shapes += [(h,), (h,)]                        # final LayerNorm; the head reuses (vocab, h)
    return shapes


GPT_CASES = [(12, 768, 50257, 1024), (2, 64, 1000, 128), (24, 1024, 50257, 1024),
             (1, 8, 11, 5), (6, 384, 32000, 256)]


@checker("5.6", "the exact parameter count of a GPT-2-style model")
def check_gpt_num_params(gpt_num_params):
    fresh = fresh_rng()       # two more cases, drawn afresh for every check
    cases = [(case, "") for case in GPT_CASES]
    cases += [((int(fresh.integers(1, 49)), 8 * int(fresh.integers(1, 257)),
                int(fresh.integers(10, 60_000)), int(fresh.integers(4, 4097))),
               " (a case drawn afresh for this check)") for _ in range(2)]
    for (layers, hidden, vocab, positions), drawn in cases:
        expected = sum(math.prod(shape) for shape in gpt_shapes(layers, hidden, vocab, positions))
        call = (f"gpt_num_params(layers={layers}, hidden={hidden}, vocab={vocab}, "
                f"positions={positions}){drawn}")
        got = as_float(gpt_num_params(layers, hidden, vocab, positions), call)
        if got == expected:
            continue
        l, h = layers, hidden
        approx = 12 * l * h * h * (1 + 13 / (12 * h) + (vocab + positions) / (12 * l * h))
        if math.isclose(got, approx, rel_tol=1e-9):
            advice = ("That is Narayanan et al.'s approximation; it leaves out the final "
                      "LayerNorm's 2h. Count the tensors one by one.")
        elif got == expected - 2 * h:
            advice = "The final LayerNorm (weight and bias, h each) is missing."
        elif got == expected + vocab * h:
            advice = ("GPT-2 ties the output head to the token embedding: the (V, h) matrix is "
                      "counted once.")
        elif got == expected - 9 * h * l:
            advice = ("The linear layers' biases are missing: 3h + h + 4h + h = 9h per layer "
                      "(GPT-2 has a bias on every linear layer).")
        else:
            advice = ("Count tensor by tensor: in each layer two LayerNorms, the attention's "
                      "input and output projections and the MLP's two matrices, each linear "
                      "layer with its bias; then the two embedding tables and the final "
                      "LayerNorm. Try layers=1 with a small hidden size by hand.")
        shown = "" if drawn else f", expected {expected}"
        raise Wrong(f"{call} returned {got:.0f}{shown}. {advice}")
    return "exact for GPT-2 small and medium and for small odd shapes"


# --- 5.7: activation bytes per layer ----------------------------------------------------------

def activation_reference(seq, batch, hidden, heads, tp, sequence_parallel, selective) -> float:
    """Korthikanti et al. 2022, 16-bit activations, one transformer layer, per rank."""
    s, b, h, a, t = seq, batch, hidden, heads, tp
    linear = 34 / t if sequence_parallel else 10 + 24 / t
    attention = 0.0 if selective else 5 * a * s / (h * t)
    return s * b * h * (linear + attention)


ACTIVATION_CASES = [(2048, 1, 12288, 96, 8, False, False), (2048, 1, 12288, 96, 8, True, False),
                    (2048, 1, 12288, 96, 8, True, True), (1024, 4, 4096, 32, 1, False, False),
                    (512, 2, 2048, 16, 4, False, True), (4096, 1, 8192, 64, 2, True, False)]


@checker("5.7", "activation bytes per transformer layer",
         builds=("dsml.memory.activation_bytes_per_layer",))
def check_activation_bytes(activation_bytes):
    for case in ACTIVATION_CASES:
        s, b, h, a, t, sp, sel = case
        expected = activation_reference(*case)
        call = (f"activation_bytes(seq={s}, batch={b}, hidden={h}, heads={a}, tp={t}, "
                f"sequence_parallel={sp}, selective={sel})")
        got = as_float(activation_bytes(*case), call)
        if math.isclose(got, expected, rel_tol=1e-12):
            continue
        if sel and math.isclose(got, activation_reference(s, b, h, a, t, sp, False)):
            advice = ("Selective recomputation recomputes the attention scores and softmax: "
                      "the 5as/h term is not stored.")
        elif not sel and math.isclose(got, s * b * h * ((34 / t if sp else 10 + 24 / t)
                                                        + 5 * a * s / h)):
            advice = ("The attention term splits across the tensor-parallel ranks too (each "
                      "holds a/t heads): 5as/(ht).")
        elif sp and math.isclose(got, activation_reference(s, b, h, a, t, False, sel)):
            advice = ("With sequence parallelism the LayerNorm and dropout activations (the "
                      "10 of 10 + 24/t) are split across ranks as well: 34/t.")
        elif not sp and t > 1 and math.isclose(got, activation_reference(s, b, h, a, t, True,
                                                                         sel)):
            advice = ("Without sequence parallelism the LayerNorms and dropouts are replicated "
                      "on every rank: 10 + 24/t, not 34/t.")
        else:
            advice = ("sbh(10 + 24/t + 5as/(ht)) with tensor parallelism; 34/t replaces "
                      "10 + 24/t with sequence parallelism; selective drops the 5as term.")
        raise Wrong(f"{call} returned {got:.6g} B, expected {expected:.6g} B. {advice}")
    return "with and without sequence parallelism and selective recomputation"


# --- 5.8: the smallest tensor-parallel size that fits ---------------------------------------------

# (model, dp, pp, zero stage, micro-batch, micro-batches, device GB): answers 1, 2, 4, 5 and None.
FIT_CASES = [("llama2-7b", 8, 1, 1, 1, 8, 80), ("llama2-70b", 8, 4, 1, 1, 16, 80),
             ("gpt2-xl", 1, 1, 0, 8, 1, 40), ("llama2-70b", 1, 1, 0, 1, 1, 80),
             ("llama2-13b", 2, 1, 0, 2, 4, 80), ("gpt2-large", 2, 1, 0, 16, 2, 24),
             ("llama2-70b", 16, 8, 1, 1, 32, 80)]


def _allowed_tp(config) -> list:
    """Tensor-parallel sizes of one node (≤ 8) that split heads, key/value heads and MLP."""
    return [t for t in range(1, 9)
            if config.heads % t == 0 and config.kv_heads % t == 0 and config.ffn_hidden % t == 0]


def _fit_layout(dp, tp, pp, zero, micro_batch, microbatches) -> Layout:
    return Layout(dp=dp, tp=tp, pp=pp, zero=zero, micro_batch=micro_batch,
                  microbatches=microbatches, recompute="selective", sequence_parallel=True)


def smallest_fitting_tp_reference(model, dp, pp, zero, micro_batch, microbatches, device_gb):
    config = preset(model)
    for tp in _allowed_tp(config):
        layout = _fit_layout(dp, tp, pp, zero, micro_batch, microbatches)
        if memory_per_rank(config, layout).total <= device_gb * GB:
            return tp
    return None


def _state_only_answer(model, dp, pp, zero, micro_batch, microbatches, device_gb):
    """The mistake of counting model state alone (no activations, no buffers)."""
    config = preset(model)
    for tp in _allowed_tp(config):
        state = zero_model_state_bytes(params_per_rank(config, tp, pp, 0), dp, zero).total
        if state <= device_gb * GB:
            return tp
    return None


@checker("5.8", "the smallest tensor-parallel size that fits")
def check_smallest_fitting_tp(smallest_fitting_tp):
    for case in FIT_CASES:
        expected = smallest_fitting_tp_reference(*case)
        model, dp, pp, zero, b, m, gb = case
        call = (f"smallest_fitting_tp({model!r}, dp={dp}, pp={pp}, zero={zero}, micro_batch={b}, "
                f"microbatches={m}, device_gb={gb})")
        got = smallest_fitting_tp(*case)
        if got is not None:
            got = int(as_float(got, call))
        if got == expected:
            continue
        config = preset(model)
        if expected is None:
            advice = (f"No t ≤ 8 fits: even t = {_allowed_tp(config)[-1]} leaves the most loaded "
                      f"rank above {gb} GB; return None.")
        elif got is None:
            advice = (f"t = {expected} fits. Try every t ≤ 8 that divides the model's "
                      f"{config.heads} query heads, {config.kv_heads} key/value heads and "
                      f"{config.ffn_hidden} MLP columns — not only powers of two.")
        elif got not in _allowed_tp(config):
            advice = (f"t = {got} does not split the model: t must divide its {config.heads} query "
                      f"heads, {config.kv_heads} key/value heads and {config.ffn_hidden} MLP columns.")
        elif got == _state_only_answer(*case):
            advice = ("That t fits the model state alone; the activations (selective "
                      "recomputation, the in-flight micro-batches) and buffers count too: use "
                      "memory_per_rank's total.")
        elif got is not None and got > expected:
            advice = ("A smaller t fits already: try the sizes from the smallest up (every extra "
                      "tensor-parallel rank costs an all-reduce per layer).")
        else:
            advice = (f"Try t = 1, 2, … 8 that split the model; with t = {got} the most loaded rank "
                      f"holds more than {gb} GB (10⁹ B).")
        raise Wrong(f"{call} returned {got!r}, expected {expected!r}. {advice}")
    return "right on seven layouts, including one where nothing fits"


# --- 5.9: one stage of ZB-H1 -------------------------------------------------------------------

# (stage, stages, microbatches): the first case defers two W's on a middle stage, so the
# plausible mistakes (no deferral, deferral off by one, every W at the end) give different lists.
ZB_H1_CASES = [(2, 4, 6), (0, 4, 6), (3, 4, 6), (1, 3, 5), (2, 5, 2), (4, 6, 3), (0, 1, 3),
               (1, 2, 1)]


def zb_h1_reference(stage: int, stages: int, microbatches: int) -> list:
    """The library's schedule-as-data (`dsml.pipeline.schedule("zb-h1", …)`), as (kind, j)."""
    ops = schedule("zb-h1", stages, microbatches)[stage]
    return [(op.kind, op.microbatch) for op in ops]


def _without_w(ops) -> list:
    return [op for op in ops if op[0] != "W"]


def _first_w(ops) -> int:
    """How many B's come before the first W (the W's a stage deferred)."""
    kinds = [kind for kind, _ in ops if kind in "BW"]
    return kinds.index("W") if "W" in kinds else -1


@checker("5.9", "the order of operations of one ZB-H1 stage", builds=("dsml.pipeline.zb_h1_ops",))
def check_zb_h1(zb_h1):
    for stage, stages, m in ZB_H1_CASES:
        expected = zb_h1_reference(stage, stages, m)
        call = f"zb_h1(stage={stage}, stages={stages}, microbatches={m})"
        got = _as_ops(zb_h1(stage, stages, m), call)
        if got == expected:
            continue
        if sorted(got) != sorted(expected):
            advice = ("Each micro-batch needs exactly one F, one B and one W on every stage. "
                      "Perhaps W is missing, or a micro-batch number runs past m − 1.")
        elif _without_w(got) != _without_w(expected):
            forwards = [kind for kind, _ in _without_w(got)].index("B")
            want = [kind for kind, _ in _without_w(expected)].index("B")
            if forwards == want + 1:
                advice = ("Leave the W's aside: the F's and B's are 1F1B's, and your stage runs "
                          "one forward too many before its first B.")
            elif forwards == m:
                advice = ("All forwards come first: that is GPipe's order. ZB-H1 keeps 1F1B's "
                          "order of F and B and only places the W's.")
            else:
                advice = ("Without the W's, the order of F and B must be exactly 1F1B's "
                          "(exercise 5.3), warm-up included.")
        elif _first_w(got) == 1 and _first_w(expected) > 1:
            advice = ("Each W follows its B at once here. That is what stage 0 does; a later "
                      "stage postpones some W's, to fill the idle slots at the end of the step.")
        elif _first_w(got) == m and _first_w(expected) < m:
            advice = ("Every W is at the end: then a stage holds every micro-batch until the "
                      "end, more than 1F1B. How many W's must a stage postpone?")
        elif abs(_first_w(got) - _first_w(expected)) == 1:
            advice = (f"The number of W's stage {stage} postpones is off by one: count the "
                      f"idle slots the last backwards leave on this stage as they travel up.")
        else:
            advice = ("After the postponed W's, each B is followed by the W of the oldest "
                      "micro-batch still waiting for one; the postponed ones come at the end.")
        raise Wrong(f"{call} returned {got}, expected {expected}. {advice}")
    return "the split backward's W's placed on first, middle and last stages, m < p included"


# --- 5.10: FSDP prefetch -----------------------------------------------------------------------

# Per-layer seconds (gather, scatter, forward, backward), in forward order. The first case
# mixes layers where compute is longer and layers where the gather is, so that the mistakes
# below give different numbers; then one layer, compute-bound, communication-bound, no compute.
PREFETCH_CASES = [
    ([3.0, 2.0, 4.0, 1.0], [1.0, 0.5, 2.0, 0.25], [2.0, 3.0, 1.0, 5.0], [4.0, 6.0, 2.0, 9.0]),
    ([2.0], [1.0], [3.0], [5.0]),
    ([1.0, 1.0, 1.0], [0.5, 0.5, 0.5], [4.0, 4.0, 4.0], [8.0, 8.0, 8.0]),
    ([5.0, 7.0, 6.0, 5.0, 8.0], [2.0, 3.0, 2.0, 2.0, 3.0], [1.0, 2.0, 1.0, 1.0, 2.0],
     [2.0, 4.0, 2.0, 2.0, 4.0]),
    ([1.5, 2.5], [0.75, 1.25], [0.0, 0.0], [0.0, 0.0]),
]


def _prefetch_mistake(gather, scatter, forward, backward, got) -> str:
    g, s, f, b = gather, scatter, forward, backward
    last = len(g) - 1
    close = lambda value: math.isclose(got, value, rel_tol=1e-9, abs_tol=1e-12)  # noqa: E731
    every_gather_hidden = (sum(max(fi, gi) for fi, gi in zip(f, g))
                           + sum(max(bi, gi) + si for bi, gi, si in zip(b, g, s)))
    if close(every_gather_hidden):
        return ("Every gather is hidden, the first of each pass included, and each behind its "
                "own layer's compute. A layer cannot start before its own weights arrive.")
    hidden_scatter = (g[0] + sum(max(f[i], g[i + 1]) for i in range(last)) + f[last] + g[last]
                      + sum(max(b[i], g[i - 1] + s[i]) for i in range(last, 0, -1))
                      + b[0] + s[0])
    if close(hidden_scatter):
        return ("The reduce-scatters are hidden too. One collective at a time runs on a rank's "
                "communication stream, and the rank joins the prefetch before each scatter.")
    wrong_neighbour = (g[0] + sum(max(f[i], g[i + 1]) for i in range(last)) + f[last] + g[last]
                       + sum(max(b[i], g[i + 1] if i < last else 0) + s[i]
                             for i in range(last, 0, -1)) + b[0] + s[0])
    if close(wrong_neighbour):
        return ("In the backward the layers run in reverse: which layer's weights are needed "
                "next?")
    if close(max(sum(f) + sum(b), 2 * sum(g) + sum(s))):
        return ("That overlaps everything with everything. Each pass's first gather has "
                "nothing to hide behind, and a layer waits for the longer of two things.")
    return ("Go layer by layer: what must a layer wait for before it computes, and what can "
            "run while it does?")


@checker("5.10", "the step time of ZeRO-3 with and without prefetch",
         builds=("dsml.zero.fsdp_step_prediction",))
def check_fsdp_step_time(fsdp_step_time):
    for gather, scatter, forward, backward in PREFETCH_CASES:
        seconds = {"gather": gather, "scatter": scatter, "forward": forward, "backward": backward}
        for prefetch in (False, True):
            expected = fsdp_step_prediction(seconds, prefetch)
            call = (f"fsdp_step_time(gather={gather}, scatter={scatter}, forward={forward}, "
                    f"backward={backward}, prefetch={prefetch})")
            got = as_float(fsdp_step_time(list(gather), list(scatter), list(forward),
                                          list(backward), prefetch), call)
            if math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12):
                continue
            g, s, f, b = gather, scatter, forward, backward
            if not prefetch and math.isclose(got, sum(g) + sum(f) + sum(b) + sum(s)):
                advice = ("ZeRO-3 frees a layer's gathered weights after its forward: the "
                          "backward must gather them again.")
            elif not prefetch:
                advice = ("Without prefetch nothing overlaps: add up every collective and "
                          "every computation of both passes.")
            else:
                advice = _prefetch_mistake(g, s, f, b, got)
            raise Wrong(f"{call} returned {got:.6g}, expected {expected:.6g}. {advice}")
    return "both passes, with and without prefetch, one layer to five, compute- or comm-bound"


# --- 5.11: the step model's data-parallel bytes -----------------------------------------------

# (model, N_d, ZeRO stage, micro-batches). The first case is ZeRO-2 with m = 4 > 1, where a
# model that charges once per step, or forgets the weights' all-gather, gives another number.
ZERO_STEP_CASES = [("gpt2", 4, 2, 4), ("gpt2", 6, 3, 3), ("gpt2-medium", 3, 1, 5),
                   ("gpt2", 5, 0, 2), ("gpt2-medium", 8, 2, 1), ("gpt2", 1, 3, 4),
                   ("gpt2-medium", 2, 3, 1)]


def step_model_data_bytes(model: str, dp: int, zero: int, microbatches: int) -> float:
    """The bytes the step model (`estimate_step`) charges a data-parallel rank per step: its
    data-parallel seconds on a 1 B/s link with no latency and compute made free (pp = tp = 1)."""
    layout = Layout(dp=dp, zero=zero, microbatches=microbatches)
    free = 1e30
    estimate = estimate_step(preset(model), layout, device_flops=free, memory_bandwidth=free,
                             intra_node_bandwidth=1.0, inter_node_bandwidth=1.0,
                             intra_node_alpha=0.0, inter_node_alpha=0.0)
    return estimate.data_comm_seconds


@checker("5.11", "the bytes a data-parallel rank sends per step, by ZeRO stage")
def check_zero_step_bytes(zero_step_bytes):
    for model, nd, stage, m in ZERO_STEP_CASES:
        psi = params_per_rank(preset(model))
        expected = step_model_data_bytes(model, nd, stage, m)
        call = f"zero_step_bytes(psi={psi}, nd={nd}, stage={stage}, microbatches={m})"
        got = as_float(zero_step_bytes(psi, nd, stage, m), call)
        if math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-6):
            continue
        one = 2 * psi * (nd - 1) / nd          # one ring reduce-scatter or all-gather, bytes
        if stage >= 2 and m > 1 and math.isclose(got, (3 if stage == 3 else 2) * one):
            advice = ("That charges ZeRO once per step, as if there were one micro-batch. With "
                      "gradient accumulation, what must a rank that keeps only its shard of "
                      "the gradients do after each micro-batch's backward?")
        elif stage == 3 and math.isclose(got, 2 * m * one):
            advice = ("ZeRO-3 frees a layer's weights after using them in the forward; the "
                      "backward needs them again.")
        elif stage == 1 and math.isclose(got, (m + 1) * one):
            advice = ("ZeRO-1 keeps whole gradients, so it can accumulate them locally and "
                      "reduce-scatter once per step.")
        elif stage in (1, 2) and math.isclose(got + one, expected):
            advice = ("After the optimizer step each rank holds only its shard of the updated "
                      "weights: something must bring the whole weights back.")
        elif nd > 1 and math.isclose(got * (nd - 1) / nd, expected):
            advice = "A ring collective sends (N_d − 1)/N_d of the buffer from each rank, not all of it."
        elif math.isclose(got * 2, expected):
            advice = "Count bytes, not elements: the gradients and weights are 16-bit."
        else:
            advice = ("List the collectives of one step: which run once per step and which "
                      "once per micro-batch, and how many bytes each ring sends from a rank.")
        raise Wrong(f"{call} returned {got:.6g}, expected {expected:.6g}. {advice}")
    return "ZeRO 0–3 with gradient accumulation, N_d from 1 to 8, as the step model charges"
