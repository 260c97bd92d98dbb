"""Tests for week 5's checkers: each reference solution passes, each named plausible mistake
fails with a hint, untouched stubs are "not attempted", a learner's crash becomes a ✗ instead
of an exception, and the notebook's exercise cells match the checkers. The contract every
week keeps is in exercise_contract; this module adds week 5's mistakes, other right answers,
hints and cases."""
from __future__ import annotations

import math

import pytest

import exercise_contract as contract
from dsml.exercises import grade
from dsml.exercises.week5 import (TP_CASES, bubble_cases, bubble_reference, gpt_shapes,
                                  measured_tp_bytes, one_f_one_b_reference, peak_reference,
                                  zero_reference)

solution = contract.solution_module(5)
NOTEBOOK = contract.ROOT / "notebooks" / "week5_model_and_pipeline_parallelism.ipynb"
COUNT = 11


# --- 5.1: tensor-parallel bytes ----------------------------------------------------------------

def tp_one_allreduce(batch, seq, hidden, tp, itemsize):
    return 2 * (tp - 1) * batch * seq * hidden * itemsize / tp


def tp_whole_tensor_each_step(batch, seq, hidden, tp, itemsize):
    return 2 * 2 * (tp - 1) * batch * seq * hidden * itemsize


def tp_elements_not_bytes(batch, seq, hidden, tp, itemsize):
    return 2 * 2 * (tp - 1) * batch * seq * hidden / tp


def tp_ring_without_2(batch, seq, hidden, tp, itemsize):
    return 2 * (tp - 1) * batch * seq * hidden * itemsize / tp     # (t − 1)/t · n per all-reduce


# --- 5.2: bubble fraction ----------------------------------------------------------------------

def bubble_over_busy(busy):
    start = min(s for st in busy for s, _ in st)
    end = max(e for st in busy for _, e in st)
    work = sum(e - s for st in busy for s, e in st)
    return (len(busy) * (end - start) - work) / work


def bubble_per_stage_span(busy):
    return sum(1 - sum(e - s for s, e in st) / (st[-1][1] - st[0][0]) for st in busy) / len(busy)


def bubble_busy_share(busy):
    return 1 - solution.bubble_fraction(busy)


# --- 5.3: 1F1B order ---------------------------------------------------------------------------

def one_f_one_b_warmup_p_minus_i(stage, stages, microbatches):
    warmup = min(stages - stage, microbatches)
    ops, done = [("F", j) for j in range(warmup)], 0
    for j in range(warmup, microbatches):
        ops += [("F", j), ("B", done)]
        done += 1
    return ops + [("B", j) for j in range(done, microbatches)]


def one_f_one_b_warmup_uncapped(stage, stages, microbatches):
    warmup = stages - stage - 1                     # forgets that m may be smaller
    ops, done = [("F", j) for j in range(warmup)], 0
    for j in range(warmup, microbatches):
        ops += [("F", j), ("B", done)]
        done += 1
    return ops + [("B", j) for j in range(done, microbatches)]


def one_f_one_b_gpipe(stage, stages, microbatches):
    return [("F", j) for j in range(microbatches)] + [("B", j) for j in range(microbatches)]


# --- 5.4: peak in flight -----------------------------------------------------------------------

def peak_counts_forwards(ops):
    return sum(kind == "F" for kind, _ in ops)


def peak_before_first_backward(ops):
    return next(k for k, (kind, _) in enumerate(ops) if kind == "B")


# --- 5.5: ZeRO bytes ---------------------------------------------------------------------------

def zero_stage2_keeps_gradients(psi, nd, stage, k):
    return zero_reference(psi, nd, 1 if stage == 2 else stage, k)


def zero_k_includes_weights_and_grads(psi, nd, stage, k):
    return zero_reference(psi, nd, stage, k + 4)


def zero_fixed_k(psi, nd, stage, k):
    return zero_reference(psi, nd, stage, 12)


# --- 5.6: parameter count ----------------------------------------------------------------------

def gpt_narayanan(layers, hidden, vocab, positions):
    l, h = layers, hidden
    return 12 * l * h * h * (1 + 13 / (12 * h) + (vocab + positions) / (12 * l * h))


def gpt_without_final_norm(layers, hidden, vocab, positions):
    return solution.gpt_num_params(layers, hidden, vocab, positions) - 2 * hidden


def gpt_untied_head(layers, hidden, vocab, positions):
    return solution.gpt_num_params(layers, hidden, vocab, positions) + vocab * hidden


def gpt_without_biases(layers, hidden, vocab, positions):
    return solution.gpt_num_params(layers, hidden, vocab, positions) - 9 * hidden * layers


def gpt_mlp_2h(layers, hidden, vocab, positions):
    return solution.gpt_num_params(layers, hidden, vocab, positions) - 4 * hidden * hidden * layers


# --- 5.7: activation bytes ---------------------------------------------------------------------

def activations_keep_attention(seq, batch, hidden, heads, tp, sequence_parallel, selective):
    return solution.activation_bytes(seq, batch, hidden, heads, tp, sequence_parallel, False)


def activations_attention_not_split(seq, batch, hidden, heads, tp, sequence_parallel, selective):
    linear = 34 / tp if sequence_parallel else 10 + 24 / tp
    attention = 0 if selective else 5 * heads * seq / hidden
    return seq * batch * hidden * (linear + attention)


def activations_ignore_sequence_parallel(seq, batch, hidden, heads, tp, sequence_parallel,
                                         selective):
    return solution.activation_bytes(seq, batch, hidden, heads, tp, False, selective)


# --- 5.8: the layout that fits -------------------------------------------------------------------

def _tp_loop(model, dp, pp, zero, micro_batch, microbatches, device_gb, sizes, fits):
    from dsml.model_config import preset
    config = preset(model)
    for tp in sizes:
        if config.heads % tp or config.kv_heads % tp or config.ffn_hidden % tp:
            continue
        if fits(config, tp):
            return tp
    return None


def fit_model_state_only(model, dp, pp, zero, micro_batch, microbatches, device_gb):
    from dsml.memory import GB, params_per_rank, zero_model_state_bytes
    return _tp_loop(model, dp, pp, zero, micro_batch, microbatches, device_gb, range(1, 9),
                    lambda c, tp: zero_model_state_bytes(params_per_rank(c, tp, pp, 0), dp,
                                                         zero).total <= device_gb * GB)


def fit_powers_of_two(model, dp, pp, zero, micro_batch, microbatches, device_gb):
    from dsml.memory import GB, Layout, memory_per_rank
    return _tp_loop(model, dp, pp, zero, micro_batch, microbatches, device_gb, (1, 2, 4, 8),
                    lambda c, tp: memory_per_rank(c, Layout(
                        dp=dp, tp=tp, pp=pp, zero=zero, micro_batch=micro_batch,
                        microbatches=microbatches, recompute="selective",
                        sequence_parallel=True)).total <= device_gb * GB)


def fit_largest(model, dp, pp, zero, micro_batch, microbatches, device_gb):
    answer = solution.smallest_fitting_tp(model, dp, pp, zero, micro_batch, microbatches,
                                          device_gb)
    return None if answer is None else 8 if model.startswith("llama") else answer


# --- 5.9: ZB-H1 order --------------------------------------------------------------------------

def _zb(stage, stages, microbatches, deferred, warmup_extra=0):
    warmup = min(stages - stage - 1 + warmup_extra, microbatches)
    ops, waiting = [("F", j) for j in range(warmup)], []
    for k in range(microbatches):
        if warmup + k < microbatches:
            ops.append(("F", warmup + k))
        ops.append(("B", k))
        waiting.append(k)
        if k >= deferred:
            ops.append(("W", waiting.pop(0)))
    return ops + [("W", j) for j in waiting]


def zb_h1_w_after_each_b(stage, stages, microbatches):
    return _zb(stage, stages, microbatches, deferred=0)


def zb_h1_every_w_at_the_end(stage, stages, microbatches):
    return _zb(stage, stages, microbatches, deferred=microbatches)


def zb_h1_defers_one_more(stage, stages, microbatches):
    return _zb(stage, stages, microbatches, deferred=stage + 1)


def zb_h1_warmup_one_more(stage, stages, microbatches):
    return _zb(stage, stages, microbatches, deferred=stage, warmup_extra=1)


def zb_h1_gpipe(stage, stages, microbatches):
    return ([("F", j) for j in range(microbatches)]
            + [op for j in range(microbatches) for op in (("B", j), ("W", j))])


# --- 5.10: FSDP prefetch -----------------------------------------------------------------------

def _forward_with_prefetch(g, f):
    return g[0] + sum(max(f[i], g[i + 1]) for i in range(len(g) - 1)) + f[-1]


def prefetch_hides_every_gather(gather, scatter, forward, backward, prefetch):
    if not prefetch:
        return solution.fsdp_step_time(gather, scatter, forward, backward, prefetch)
    return (sum(max(f, g) for f, g in zip(forward, gather))
            + sum(max(b, g) + s for b, g, s in zip(backward, gather, scatter)))


def prefetch_hides_the_scatters(gather, scatter, forward, backward, prefetch):
    if not prefetch:
        return solution.fsdp_step_time(gather, scatter, forward, backward, prefetch)
    g, s, b = gather, scatter, backward
    last = len(g) - 1
    return (_forward_with_prefetch(g, forward) + g[last]
            + sum(max(b[i], g[i - 1] + s[i]) for i in range(last, 0, -1)) + b[0] + s[0])


def prefetch_backward_fetches_the_wrong_layer(gather, scatter, forward, backward, prefetch):
    if not prefetch:
        return solution.fsdp_step_time(gather, scatter, forward, backward, prefetch)
    g, s, b = gather, scatter, backward
    last = len(g) - 1
    return (_forward_with_prefetch(g, forward) + g[last] + b[0] + s[0]
            + sum(max(b[i], g[i + 1] if i < last else 0) + s[i] for i in range(last, 0, -1)))


def no_prefetch_gathers_once(gather, scatter, forward, backward, prefetch):
    if prefetch:
        return solution.fsdp_step_time(gather, scatter, forward, backward, prefetch)
    return sum(gather) + sum(forward) + sum(backward) + sum(scatter)


def prefetch_overlaps_everything(gather, scatter, forward, backward, prefetch):
    if not prefetch:
        return solution.fsdp_step_time(gather, scatter, forward, backward, prefetch)
    return max(sum(forward) + sum(backward), 2 * sum(gather) + sum(scatter))


# --- 5.11: the step model's ZeRO bytes ----------------------------------------------------------

def _zero_bytes(psi, nd, collectives):
    return collectives * 2 * psi * (nd - 1) / nd


def zero_once_per_step(psi, nd, stage, microbatches):
    return _zero_bytes(psi, nd, {0: 2, 1: 2, 2: 2, 3: 3}[stage])       # the first edition's model


def zero3_gathers_once(psi, nd, stage, microbatches):
    return _zero_bytes(psi, nd, {0: 2, 1: 2, 2: microbatches + 1, 3: 2 * microbatches}[stage])


def zero1_every_microbatch(psi, nd, stage, microbatches):
    return _zero_bytes(psi, nd, {0: 2, 1: microbatches + 1, 2: microbatches + 1,
                                 3: 3 * microbatches}[stage])


def zero_forgets_the_weights_gather(psi, nd, stage, microbatches):
    return _zero_bytes(psi, nd, {0: 2, 1: 1, 2: microbatches, 3: 3 * microbatches}[stage])


def zero_whole_buffer_per_ring(psi, nd, stage, microbatches):
    return solution.zero_step_bytes(psi, nd, stage, microbatches) * nd / max(nd - 1, 1)


WRONG = {
    "5.1": [tp_one_allreduce, tp_whole_tensor_each_step, tp_elements_not_bytes,
            tp_ring_without_2],
    "5.2": [bubble_over_busy, bubble_per_stage_span, bubble_busy_share],
    "5.3": [one_f_one_b_warmup_p_minus_i, one_f_one_b_gpipe, one_f_one_b_warmup_uncapped],
    "5.4": [peak_counts_forwards, peak_before_first_backward],
    "5.5": [zero_stage2_keeps_gradients, zero_k_includes_weights_and_grads, zero_fixed_k],
    "5.6": [gpt_narayanan, gpt_without_final_norm, gpt_untied_head, gpt_without_biases,
            gpt_mlp_2h],
    "5.7": [activations_keep_attention, activations_attention_not_split,
            activations_ignore_sequence_parallel],
    "5.8": [fit_model_state_only, fit_powers_of_two, fit_largest],
    "5.9": [zb_h1_w_after_each_b, zb_h1_every_w_at_the_end, zb_h1_defers_one_more,
            zb_h1_warmup_one_more, zb_h1_gpipe],
    "5.10": [prefetch_hides_every_gather, prefetch_hides_the_scatters,
             prefetch_backward_fetches_the_wrong_layer, no_prefetch_gathers_once,
             prefetch_overlaps_everything],
    "5.11": [zero_once_per_step, zero3_gathers_once, zero1_every_microbatch,
             zero_forgets_the_weights_gather, zero_whole_buffer_per_ring],
}

HINT_WORDS = {
    tp_one_allreduce: "backward", tp_whole_tensor_each_step: "blocks",
    tp_elements_not_bytes: "itemsize", tp_ring_without_2: "factor 2",
    bubble_over_busy: "idle ÷ busy", bubble_per_stage_span: "waiting to begin",
    bubble_busy_share: "busy fraction",
    one_f_one_b_warmup_p_minus_i: "warm-up forward too many", one_f_one_b_gpipe: "GPipe",
    one_f_one_b_warmup_uncapped: "runs out of micro-batches",
    peak_counts_forwards: "counts every forward", peak_before_first_backward: "not always",
    zero_stage2_keeps_gradients: "also shards the gradients",
    zero_k_includes_weights_and_grads: "counted apart", zero_fixed_k: "k given",
    gpt_narayanan: "approximation", gpt_without_final_norm: "final LayerNorm",
    gpt_untied_head: "ties", gpt_without_biases: "biases", gpt_mlp_2h: "tensor by tensor",
    activations_keep_attention: "Selective", activations_attention_not_split: "a/t heads",
    activations_ignore_sequence_parallel: "34/t",
    fit_model_state_only: "activations", fit_powers_of_two: "not only powers of two",
    fit_largest: "smaller t fits",
    zb_h1_w_after_each_b: "postpones some W", zb_h1_every_w_at_the_end: "Every W is at the end",
    zb_h1_defers_one_more: "off by one", zb_h1_warmup_one_more: "one forward too many",
    zb_h1_gpipe: "GPipe",
    prefetch_hides_every_gather: "own weights arrive", prefetch_hides_the_scatters: "scatter",
    prefetch_backward_fetches_the_wrong_layer: "reverse", no_prefetch_gathers_once: "again",
    prefetch_overlaps_everything: "everything with everything",
    zero_once_per_step: "once per step", zero3_gathers_once: "needs them again",
    zero1_every_microbatch: "accumulate them locally",
    zero_forgets_the_weights_gather: "whole weights back", zero_whole_buffer_per_ring: "(N_d − 1)/N_d",
}


# Other right answers: the same quantities computed another way.
def tp_from_blocks(batch, seq, hidden, tp, itemsize):
    n = batch * seq * hidden * itemsize
    return 2 * (2 * (tp - 1) * (n // tp))


def gpt_from_shapes(layers, hidden, vocab, positions):
    return sum(math.prod(s) for s in gpt_shapes(layers, hidden, vocab, positions))


RIGHT = {"5.1": [tp_from_blocks], "5.6": [gpt_from_shapes]}

globals().update(contract.contract_tests(5, COUNT, solution, WRONG, not_attempted_id="5.5",
                                         right=RIGHT, hint_words=HINT_WORDS))


# --- the references themselves -------------------------------------------------------------------

def test_the_measured_bytes_are_two_ring_allreduces():
    assert measured_tp_bytes(2, 8, 16, 4, 2) == 2 * 2 * 3 * (2 * 8 * 16 * 2) // 4
    assert measured_tp_bytes(2, 8, 16, 1, 2) == 0


def test_gpt2_small_from_its_shapes_is_the_published_count():
    assert sum(math.prod(s) for s in gpt_shapes(12, 768, 50257, 1024)) == 124_439_808


def test_the_gpipe_timeline_has_the_gpipe_bubble():
    p, m = 4, 6
    assert bubble_reference(bubble_cases()[0]) == pytest.approx((p - 1) / (m + p - 1), rel=1e-12)


def test_one_f_one_b_holds_p_minus_i():
    for p, m in [(4, 8), (4, 2), (1, 3)]:
        for i in range(p):
            assert peak_reference(one_f_one_b_reference(i, p, m)) == min(p - i, m)


def test_the_zb_h1_reference_is_the_library_schedule_and_holds_no_more_than_1f1b():
    from dsml.exercises.week5 import zb_h1_reference
    from dsml.pipeline import check_schedule, schedule
    for p, m in [(4, 6), (5, 2), (1, 3)]:
        ops = [zb_h1_reference(i, p, m) for i in range(p)]
        check_schedule(schedule("zb-h1", p, m), m)
        assert all(peak_reference([op for op in stage if op[0] != "B"]) <= min(p, m)
                   for stage in ops)


def test_the_step_model_bytes_are_the_collectives_of_the_statement():
    from dsml.exercises.week5 import step_model_data_bytes
    from dsml.model_config import preset
    from dsml.memory import params_per_rank
    psi = params_per_rank(preset("gpt2"))
    one = 2 * psi * 3 / 4
    assert step_model_data_bytes("gpt2", 4, 2, 4) == pytest.approx(5 * one, rel=1e-9)
    assert step_model_data_bytes("gpt2", 4, 3, 4) == pytest.approx(12 * one, rel=1e-9)
    assert step_model_data_bytes("gpt2", 1, 3, 4) == 0


# --- the notebook's exercise cells ------------------------------------------------------------

def test_no_stub_shadows_a_name_the_notebook_body_defines():
    contract.assert_no_stub_shadows_the_body(
        5, NOTEBOOK, {"tp_allreduce_bytes", "PP_STAGES", "zero_model", "DEVICE_BYTES",
                      "memory_per_rank", "Layout", "preset"})


def test_exercise_cells_match_the_checkers():
    contract.assert_exercise_cells_match_checkers(5, contract.stub_cells(NOTEBOOK), solution)


def notebook_namespace() -> dict:
    """The names the exercise cells use from the notebook above them (section 4's accountant)."""
    from dsml.model_config import preset
    from dsml.memory import GB, Layout, memory_per_rank
    return {"math": math, "GB": GB, "Layout": Layout, "memory_per_rank": memory_per_rank,
            "preset": preset}


def test_exercise_stub_cells_print_not_attempted():
    lines = contract.run_exercise_cells(contract.stub_cells(NOTEBOOK), notebook_namespace())
    contract.assert_cells_print_not_attempted(5, lines)


def test_exercise_cells_with_solutions_print_correct():
    lines = contract.run_exercise_cells(contract.stub_cells(NOTEBOOK), notebook_namespace(),
                                        solution)
    contract.assert_cells_print_correct(5, lines)


def test_examples_in_the_statements_hold():
    # The worked examples quote numbers; recompute them with the reference solutions.
    assert solution.tp_mlp_bytes(1, 4, 8, 2, 2) == 128
    assert solution.bubble_fraction([[(0, 1), (2, 3)], [(1, 2)]]) == 0.5
    assert solution.one_f_one_b(1, 3, 3) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1),
                                             ("B", 2)]
    assert solution.peak_inflight(solution.one_f_one_b(1, 3, 3)) == 2
    assert solution.zero_bytes(1e9, 4, 1, 12) == 7e9
    assert solution.gpt_num_params(1, 4, 10, 3) == 304
    assert solution.activation_bytes(8, 1, 16, 2, 1, False, False) == 4992
    assert solution.smallest_fitting_tp("llama2-13b", 4, 1, 1, 1, 8, 80) == 2
    from dsml.model_config import preset
    from dsml.memory import GB, Layout, memory_per_rank
    held = [memory_per_rank(preset("llama2-13b"), Layout(
        dp=4, tp=tp, zero=1, microbatches=8, recompute="selective", sequence_parallel=True)).total
        for tp in (1, 2)]
    assert [round(h / GB, -1) for h in held] == [120, 60]
    assert solution.zb_h1(1, 2, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("W", 0),
                                       ("W", 1)]
    two_layers = ([1, 1], [0.5, 0.5], [2, 2], [4, 4])
    assert solution.fsdp_step_time(*two_layers, False) == 17
    assert solution.fsdp_step_time(*two_layers, True) == 15
    assert solution.zero_step_bytes(1e9, 4, 0, 8) == 3e9


# --- 5.1 draws fresh cases: a table of remembered answers does not pass ------------------------

def test_a_table_of_answers_remembered_from_hints_fails_5_1():
    # Before fresh cases, four tries filled such a table and the fifth passed.
    from dsml.exercises import fresh_seed
    for base in contract.FRESH_BASES:
        with fresh_seed(base):
            passed, table, message = contract.learn_from_hints(
                "5.1", r"tp_mlp_bytes\(batch=(\S+), seq=(\S+), hidden=(\S+), tp=(\S+), "
                       r"itemsize=(\S+)\)", r"measured (\S+) B")
        assert not passed
        # It learned the fixed cases (but t = 1's 0 B, which its default already gives), no more.
        assert len(table) == sum(tp > 1 for _, _, _, tp, _ in TP_CASES)
        assert "drawn afresh for this check" in message and " B sent by" not in message


def test_fresh_cases_5_1_hold_the_reference_and_refuse_the_named_mistakes():
    assert contract.passes_for_every_base("5.1", solution.tp_mlp_bytes) == []
    for right in RIGHT["5.1"]:
        assert contract.passes_for_every_base("5.1", right) == []
    for wrong in WRONG["5.1"]:
        assert contract.fails_for_every_base("5.1", wrong) == [], wrong.__name__


def test_fresh_cases_5_1_differ_from_check_to_check_and_repeat_under_a_base():
    from dsml.exercises import fresh_rng, fresh_seed
    from dsml.exercises.week5 import fresh_tp_cases
    seen = []
    with fresh_seed(7):
        for _ in range(3):
            grade("5.1", solution.tp_mlp_bytes)
            seen.append(fresh_tp_cases(fresh_rng()))
    assert seen[0] != seen[1] != seen[2]
    with fresh_seed(7):
        grade("5.1", solution.tp_mlp_bytes)
        assert fresh_tp_cases(fresh_rng()) == seen[0]
    for batch, seq, hidden, tp, itemsize in seen[0]:
        assert hidden % tp == 0 and 2 <= tp <= 8


# --- exercises that must be built: the library's own answer is refused ----------------------

def tp_bytes_from_the_block(batch, seq, hidden, tp, itemsize):
    from dsml.tensor_parallel import tp_block_bytes_per_rank
    return tp_block_bytes_per_rank(batch, seq, hidden, tp, itemsize) / 2   # the MLP's half


def _as_pairs(ops):
    return [(op.kind, op.microbatch) for op in ops]


def one_f_one_b_from_schedule(stage, stages, microbatches):
    from dsml.pipeline import schedule
    return _as_pairs(schedule("1f1b", stages, microbatches)[stage])


def one_f_one_b_from_interleaved(stage, stages, microbatches):
    from dsml.pipeline import schedule
    return _as_pairs(schedule("interleaved", stages, microbatches, chunks=1)[stage])


def zb_h1_from_schedule(stage, stages, microbatches):
    from dsml.pipeline import schedule
    return _as_pairs(schedule("zb-h1", stages, microbatches)[stage])


def zero_bytes_from_library(psi, nd, stage, k):
    from dsml.memory import zero_model_state_bytes
    return zero_model_state_bytes(psi, nd, stage).total


def fsdp_time_from_library(gather, scatter, forward, backward, prefetch):
    from dsml.zero import fsdp_step_prediction
    return fsdp_step_prediction({"gather": gather, "scatter": scatter, "forward": forward,
                                 "backward": backward}, prefetch)


LIBRARY_ANSWERS = [("5.1", tp_bytes_from_the_block), ("5.3", one_f_one_b_from_schedule),
                   ("5.3", one_f_one_b_from_interleaved), ("5.5", zero_bytes_from_library),
                   ("5.9", zb_h1_from_schedule), ("5.10", fsdp_time_from_library)]


@pytest.mark.parametrize("exercise_id, answer", LIBRARY_ANSWERS,
                         ids=[f"{i}-{a.__name__}" for i, a in LIBRARY_ANSWERS])
def test_an_answer_that_calls_the_library_is_refused(exercise_id, answer):
    result = grade(exercise_id, answer)
    assert result.status == "failed"
    assert result.message.startswith(f"exercise {exercise_id} asks you to build this yourself: "
                                     f"your code called dsml.")


def test_a_table_of_answers_copied_from_hints_fails_5_5_and_5_6():
    # On main, such a table passed 5.5 after 10 checks and 5.6 after 6.
    contract.copied_answers_never_pass(
        "5.5", r"zero_bytes\(psi=(\S+), nd=(\S+), stage=(\S+), k=(\S+)\)", r"expected (\S+) B")
    contract.copied_answers_never_pass(
        "5.6", r"gpt_num_params\(layers=(\S+), hidden=(\S+), vocab=(\S+), positions=(\S+)\)",
        r"expected (\d+)")


@pytest.mark.parametrize("exercise_id, reference", [("5.5", solution.zero_bytes),
                                                    ("5.6", solution.gpt_num_params)])
def test_fresh_cases_5_5_and_5_6_keep_the_contract_for_every_base(exercise_id, reference):
    contract.fresh_cases_keep_the_contract(exercise_id, reference, WRONG, RIGHT)


def activation_bytes_from_library(seq, batch, hidden, heads, tp, sequence_parallel, selective):
    from dsml.memory import TransformerConfig, activation_bytes_per_layer
    config = TransformerConfig(1, hidden, heads, 100, seq)
    return activation_bytes_per_layer(config, batch, tp, sequence_parallel,
                                      "selective" if selective else "none")


def test_an_answer_that_calls_the_library_accountant_is_refused():
    result = grade("5.7", activation_bytes_from_library)
    assert result.status == "failed"
    assert result.message.startswith("exercise 5.7 asks you to build this yourself: your code "
                                     "called dsml.memory.activation_bytes_per_layer")
