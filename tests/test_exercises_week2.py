"""Tests for week 2's checkers: each reference solution passes, each named plausible mistake
fails with a hint, untouched stubs are "not attempted", a learner's crash or deadlock becomes
a ✗ instead of an exception, and the notebook's exercise cells match the checkers. The
contract every week keeps is in exercise_contract; this module adds week 2's mistakes, other
right answers, hints and cases."""
from __future__ import annotations

import functools
import math
import re

import numpy as np
import pytest

import exercise_contract as contract
from dsml.collectives import (allgather, allreduce, best_algorithm, broadcast, busbw_factor,
                              cost, reduce)
from dsml.exercises import FAILED, grade

solution = contract.solution_module(2)
NOTEBOOK = contract.ROOT / "notebooks" / "week2_collective_communication.ipynb"
CELLS = contract.ROOT / "build" / "week2_exercise_cells.py"


# --- plausible wrong answers, one named function per mistake --------------------------------

# 2.1: gathers every block on rank 0, which sends the whole result to each rank: right
# values, but rank 0's port carries everything (slower than the ring).
def allgather_gather_then_broadcast(comm, x):
    p, r = comm.size, comm.rank
    if r != 0:
        yield comm.send(0, x)
        return (yield comm.recv(0))
    blocks = [x]
    for src in range(1, p):
        blocks.append((yield comm.recv(src)))
    out = np.concatenate(blocks)
    for dst in range(1, p):
        yield comm.send(dst, out)
    return out


# 2.1: appends blocks in the order they arrive (own, left, left of left, …), not rank order.
def allgather_arrival_order(comm, x):
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    blocks, passing = [x], x
    for _ in range(p - 1):
        passing = yield comm.sendrecv(right, passing, left)
        blocks.append(passing)
    return np.concatenate(blocks)


# 2.1: sends its own block in every step, so only the left neighbour's block ever arrives.
def allgather_forwards_own_block(comm, x):
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    blocks = [None] * p
    blocks[r] = x
    for step in range(p - 1):
        blocks[(r - step - 1) % p] = yield comm.sendrecv(right, x, left)
    return np.concatenate(blocks)


# 2.1: recursive doubling with partner r XOR 2^k: no such partner unless p is a power of two.
def allgather_xor_partners(comm, x):
    p, r = comm.size, comm.rank
    blocks = {r: x}
    mask = 1
    while mask < p:
        partner = r ^ mask
        theirs = yield comm.sendrecv(partner, dict(blocks), partner)
        blocks.update(theirs)
        mask <<= 1
    return np.concatenate([blocks[i] for i in range(p)])


# 2.1: every rank receives from its left before sending: deadlock.
def allgather_receive_first(comm, x):
    p, r = comm.size, comm.rank
    blocks = [None] * p
    blocks[r] = x
    for step in range(p - 1):
        blocks[(r - step - 1) % p] = yield comm.recv((r - 1) % p)
        yield comm.send((r + 1) % p, blocks[(r - step - 1) % p])
    return np.concatenate(blocks)


# 2.1: a plain function, not a generator.
def allgather_not_generator(comm, x):
    return np.concatenate([x] * comm.size)


# 2.2: forgets the (p − 1)/p: as if each phase moved the whole vector once.
def ring_bw_without_fraction(p, nbytes, beta):
    return 2 * nbytes * beta


# 2.2: sends the whole vector in each of the 2(p − 1) steps instead of an n/p block.
def ring_bw_whole_vector_each_step(p, nbytes, beta):
    return 2 * (p - 1) * nbytes * beta


# 2.2: counts only the reduce-scatter phase.
def ring_bw_one_phase(p, nbytes, beta):
    return (p - 1) / p * nbytes * beta


# 2.3: np.split instead of np.array_split: fails when p does not divide n.
def reduce_scatter_np_split(comm, x):
    p, r = comm.size, comm.rank
    blocks = [b.copy() for b in np.split(x, p)]
    for step in range(p - 1):
        got = yield comm.sendrecv((r + 1) % p, blocks[(r - step - 1) % p], (r - 1) % p)
        blocks[(r - step - 2) % p] += got
    return blocks[r]


# 2.3: the schedule shifted by one (sends block r − s): block r + 1 is completed on rank r,
# and it returns the partial sum of block r.
def reduce_scatter_off_by_one(comm, x):
    p, r = comm.size, comm.rank
    blocks = [b.copy() for b in np.array_split(x, p)]
    for step in range(p - 1):
        got = yield comm.sendrecv((r + 1) % p, blocks[(r - step) % p], (r - 1) % p)
        blocks[(r - step - 1) % p] += got
    return blocks[r]


# 2.3: passes the running sums on but never adds what arrives: keeps the newest one.
def reduce_scatter_replaces(comm, x):
    p, r = comm.size, comm.rank
    blocks = [b.copy() for b in np.array_split(x, p)]
    for step in range(p - 1):
        got = yield comm.sendrecv((r + 1) % p, blocks[(r - step - 1) % p], (r - 1) % p)
        blocks[(r - step - 2) % p] = got
    return blocks[r]


# 2.3: reduces everything on rank 0, which sends each rank its block: right values, but
# rank 0's port carries (p − 1) whole vectors.
def reduce_scatter_via_root(comm, x):
    p, r = comm.size, comm.rank
    if r != 0:
        yield comm.send(0, x)
        return (yield comm.recv(0))
    total = x.copy()
    for src in range(1, p):
        total = total + (yield comm.recv(src))
    blocks = np.array_split(total, p)
    for dst in range(1, p):
        yield comm.send(dst, blocks[dst])
    return blocks[0]


# 2.4: plain recursive doubling with partner r XOR 2^k: fails when p is not a power of two.
def allreduce_xor_only(comm, x):
    data, mask = x.copy(), 1
    while mask < comm.size:
        partner = comm.rank ^ mask
        data = data + (yield comm.sendrecv(partner, data, partner))
        mask <<= 1
    return data


# 2.4: skips partners that do not exist: some sums miss ranks, others count them twice.
def allreduce_skips_missing_partners(comm, x):
    data, mask = x.copy(), 1
    while mask < comm.size:
        partner = comm.rank ^ mask
        if partner < comm.size:
            data = data + (yield comm.sendrecv(partner, data, partner))
        mask <<= 1
    return data


# 2.4: folds in and doubles, but never sends the result back to the ranks that sat out.
def allreduce_forgets_unfold(comm, x):
    p, r = comm.size, comm.rank
    core = 1 << (p.bit_length() - 1)
    extra = p - core
    data = x.copy()
    if r < 2 * extra and r % 2 == 0:
        yield comm.send(r + 1, data)
        return data
    if r < 2 * extra:
        data = data + (yield comm.recv(r - 1))
    index = r // 2 if r < 2 * extra else r - extra
    mask = 1
    while mask < core:
        i = index ^ mask
        partner = 2 * i + 1 if i < extra else i + extra
        data = data + (yield comm.sendrecv(partner, data, partner))
        mask <<= 1
    return data


# 2.4: the library's ring all-reduce: right sums, but 2(p − 1) rounds.
def allreduce_by_ring(comm, x):
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    blocks = [b.copy() for b in np.array_split(x, p)]
    for step in range(p - 1):                      # reduce-scatter: rank r completes block r
        got = yield comm.sendrecv(right, blocks[(r - step - 1) % p], left)
        blocks[(r - step - 2) % p] = blocks[(r - step - 2) % p] + got
    for step in range(p - 1):                      # all-gather
        blocks[(r - step - 1) % p] = yield comm.sendrecv(right, blocks[(r - step) % p], left)
    return np.concatenate(blocks)


# 2.4: a binomial-tree reduce to rank 0, then a binomial broadcast: 2⌈lg p⌉ rounds.
def allreduce_reduce_then_broadcast(comm, x):
    total = yield from reduce(comm, x, root=0, algorithm="binomial")
    return (yield from broadcast(comm, x if total is None else total, root=0,
                                 algorithm="binomial"))


# 2.5: the closed form ⌈lg p⌉(α + nβ + nγ), which leaves out folding.
def folded_time_closed_form(p, nbytes, alpha, beta, gamma):
    return cost("allreduce", "recursive_doubling", p, nbytes, alpha, beta, gamma)


# 2.5: counts the fold but forgets to send the result back.
def folded_time_no_unfold(p, nbytes, alpha, beta, gamma):
    m = p.bit_length() - 1
    extra = 0 if p == 1 << m else 1
    return (m + extra) * (alpha + nbytes * (beta + gamma))


# 2.5: adds the two folding steps even when p is a power of two.
def folded_time_always_folds(p, nbytes, alpha, beta, gamma):
    m = p.bit_length() - 1
    return (m + 2) * (alpha + nbytes * beta) + (m + 1) * nbytes * gamma


# 2.5: forgets the addition after the fold (γ only in the doubling rounds).
def folded_time_no_fold_addition(p, nbytes, alpha, beta, gamma):
    m = p.bit_length() - 1
    if p == 1 << m:
        return m * (alpha + nbytes * (beta + gamma))
    return (m + 2) * (alpha + nbytes * beta) + m * nbytes * gamma


# 2.6: drops γ from both sides.
def crossover_without_gamma(p, alpha, beta, gamma):
    L = math.log2(p)
    return (2 * (p - 1) - L) * alpha / ((L - 2 * (p - 1) / p) * beta)


# 2.6: section 18's crossover, against halving–doubling instead of the ring.
def crossover_against_halving_doubling(p, alpha, beta, gamma):
    L = math.log2(p)
    return L * alpha / (L * (beta + gamma) - (p - 1) / p * (2 * beta + gamma))


# 2.6: (p − 1)/p taken as 1 in the ring's byte terms (as if the ring moved 2n and added n).
def crossover_fraction_as_one(p, alpha, beta, gamma):
    L = math.log2(p)
    return (2 * (p - 1) - L) * alpha / (L * (beta + gamma) - (2 * beta + gamma))


# 2.7: reports algbw, without the correction factor.
def busbw_is_algbw(collective, p, nbytes, seconds):
    return nbytes / seconds


# 2.7: the all-reduce factor 2(p − 1)/p for every collective.
def busbw_allreduce_factor_everywhere(collective, p, nbytes, seconds):
    return nbytes / seconds * 2 * (p - 1) / p


# 2.7: divides by the factor instead of multiplying.
def busbw_divides_by_factor(collective, p, nbytes, seconds):
    factor = {"allreduce": 2 * (p - 1) / p, "allgather": (p - 1) / p,
              "reduce_scatter": (p - 1) / p, "broadcast": 1.0}[collective]
    return nbytes / seconds / factor


# 2.8: trusts the closed forms (best_algorithm among the three candidates).
def pick_by_closed_form(p, nbytes, alpha, beta, gamma):
    candidates = ("recursive_doubling", "ring", "halving_doubling")
    return min(candidates, key=lambda a: cost("allreduce", a, p, nbytes, alpha, beta, gamma))


# 2.8: the ring, always.
def pick_always_ring(p, nbytes, alpha, beta, gamma):
    return "ring"


# 2.8: MPICH's default threshold: recursive doubling up to 2 KiB, halving–doubling above.
def pick_mpich_threshold(p, nbytes, alpha, beta, gamma):
    return "recursive_doubling" if nbytes <= 2048 else "halving_doubling"


# 2.8: a rule that measures nothing: the ring whenever p is not a power of two, otherwise
# MPICH's 2 KiB threshold. It fits every long-vector case but not the short ones on p = 6, 12.
def pick_by_power_of_two(p, nbytes, alpha, beta, gamma):
    if p & (p - 1):
        return "ring"
    return "recursive_doubling" if nbytes <= 2048 else "halving_doubling"


WRONG = {
    "2.1": [allgather_gather_then_broadcast, allgather_arrival_order,
            allgather_forwards_own_block, allgather_xor_partners, allgather_receive_first,
            allgather_not_generator],
    "2.2": [ring_bw_without_fraction, ring_bw_whole_vector_each_step, ring_bw_one_phase],
    "2.3": [reduce_scatter_np_split, reduce_scatter_off_by_one, reduce_scatter_replaces,
            reduce_scatter_via_root],
    "2.4": [allreduce_xor_only, allreduce_skips_missing_partners, allreduce_forgets_unfold,
            allreduce_by_ring, allreduce_reduce_then_broadcast],
    "2.5": [folded_time_closed_form, folded_time_no_unfold, folded_time_always_folds,
            folded_time_no_fold_addition],
    "2.6": [crossover_without_gamma, crossover_against_halving_doubling,
            crossover_fraction_as_one],
    "2.7": [busbw_is_algbw, busbw_allreduce_factor_everywhere, busbw_divides_by_factor],
    "2.8": [pick_by_closed_form, pick_always_ring, pick_mpich_threshold, pick_by_power_of_two],
}

# The words each mistake's hint must contain: it names what went wrong, not just "wrong".
HINT_WORDS = {
    allgather_gather_then_broadcast: "the values are right, but",
    allgather_arrival_order: "not in the order it arrived",
    allgather_forwards_own_block: "not its own again",
    allgather_xor_partners: "power of two",
    allgather_receive_first: "every rank waits to receive",
    allgather_not_generator: "not a generator",
    reduce_scatter_np_split: "np.array_split",
    reduce_scatter_off_by_one: "returned its own input unchanged",
    reduce_scatter_replaces: "times (each should count once)",
    reduce_scatter_via_root: "the values are right, but",
    allreduce_xor_only: "power of two",
    allreduce_skips_missing_partners: "times (each should count once)",
    allreduce_forgets_unfold: "returned its own input unchanged",
    allreduce_by_ring: "the sums are right, but",
    allreduce_reduce_then_broadcast: "the checker allows one more",
    folded_time_closed_form: "does not count the folding",
    pick_by_closed_form: "leave out",
    pick_by_power_of_two: "a rule that looks only at p",
}


# --- other right answers, which must pass too ------------------------------------------------

# 2.1: every rank sends its own block i ranks ahead in step i (a shifted exchange): p − 1
# steps with distinct ports, as fast as the ring.
def allgather_shifted_exchange(comm, x):
    p, r = comm.size, comm.rank
    blocks = [None] * p
    blocks[r] = x
    for i in range(1, p):
        blocks[(r - i) % p] = yield comm.sendrecv((r + i) % p, x, (r - i) % p)
    return np.concatenate(blocks)


# 2.1 and 2.3: the ring with an eager send followed by the receive instead of sendrecv.
def allgather_send_then_receive(comm, x):
    p, r = comm.size, comm.rank
    blocks = [None] * p
    blocks[r] = x
    for step in range(p - 1):
        yield comm.send((r + 1) % p, blocks[(r - step) % p])
        blocks[(r - step - 1) % p] = yield comm.recv((r - 1) % p)
    return np.concatenate(blocks)


# 2.1, refused: the library's own all-gather (Bruck's ⌈lg p⌉ rounds, faster than the ring on
# short blocks), and its ring.
def allgather_bruck(comm, x):
    return (yield from allgather(comm, x, algorithm="recursive_doubling"))


def allgather_library_ring(comm, x):
    return (yield from allgather(comm, x, algorithm="ring"))


# 2.3: the ring charging γ through comm.combine, as the library does.
def reduce_scatter_with_combine(comm, x):
    p, r = comm.size, comm.rank
    blocks = [b.copy() for b in np.array_split(x, p)]
    for step in range(p - 1):
        got = yield comm.sendrecv((r + 1) % p, blocks[(r - step - 1) % p], (r - 1) % p)
        yield comm.combine(got.nbytes)
        blocks[(r - step - 2) % p] += got
    return blocks[r]


# 2.4: folding the top ranks (r ≥ 2^m hands its vector to r − 2^m) instead of pairs.
def allreduce_fold_top_ranks(comm, x):
    p, r = comm.size, comm.rank
    core = 1 << (p.bit_length() - 1)
    data = x.copy()
    if r >= core:
        yield comm.send(r - core, data)
        return (yield comm.recv(r - core))
    if r + core < p:
        data = data + (yield comm.recv(r + core))
    mask = 1
    while mask < core:
        partner = r ^ mask
        data = data + (yield comm.sendrecv(partner, data, partner))
        mask <<= 1
    if r + core < p:
        yield comm.send(r + core, data)
    return data


# 2.4: gather every vector in ⌈lg p⌉ rounds (Bruck), then add locally.
def allreduce_gather_then_add(comm, x):
    gathered = yield from allgather(comm, x[None, :], algorithm="recursive_doubling")
    return gathered.sum(axis=0)


# 2.4, refused: the library's own recursive doubling.
def allreduce_library_doubling(comm, x):
    return (yield from allreduce(comm, x, algorithm="recursive_doubling"))


# 2.7: the notebook's table of factors, as a learner might reuse it.
def busbw_from_table(collective, p, nbytes, seconds):
    table = {"allreduce": lambda q: 2 * (q - 1) / q, "allgather": lambda q: (q - 1) / q,
             "reduce_scatter": lambda q: (q - 1) / q, "broadcast": lambda q: 1.0}
    return nbytes / seconds * table[collective](p)


RIGHT = {
    "2.1": [allgather_shifted_exchange, allgather_send_then_receive],
    "2.3": [reduce_scatter_with_combine],
    "2.4": [allreduce_fold_top_ranks, allreduce_gather_then_add],
    "2.7": [busbw_from_table],
}

RANK_PROGRAMS = ["2.1", "2.3", "2.4"]   # the exercises whose answer is a rank program


# --- the contract every week keeps -------------------------------------------------------------

globals().update(contract.contract_tests(
    2, 8, solution, WRONG, not_attempted_id="2.6", right=RIGHT, hint_words=HINT_WORDS,
    rank_programs=RANK_PROGRAMS))


# --- week 2's hints ----------------------------------------------------------------------------

def test_hint_states_input_expected_and_returned():
    message = grade("2.2", ring_bw_without_fraction).message
    assert "ring_bandwidth_time(p=3, nbytes=3145728, beta=1e-10)" in message   # the input
    assert "expected 0.000419430 s" in message or "expected 0.00041943 s" in message
    assert "returned 0.000629146 s" in message                                 # the answer


def test_arrival_order_hint_lists_the_block_owners():
    message = grade("2.1", allgather_arrival_order).message
    assert "returned the blocks of ranks [0, 2, 1] in that order" in message


def test_folding_hint_shows_double_counting():
    # On p = 3 the rank without a partner in round 1 ends with ranks 0 and 2 only.
    message = grade("2.4", allreduce_skips_missing_partners).message
    assert "p=3" in message
    assert re.search(r"inputs \[\d, \d, \d\] times", message)


def test_crossover_hint_says_which_side_is_wrong():
    message = grade("2.6", crossover_against_halving_doubling).message
    assert "the simulated ring still loses" in message
    late = grade("2.6", lambda p, alpha, beta, gamma:
                 1.1 * solution.ring_crossover_size(p, alpha, beta, gamma)).message
    assert "the simulated ring already wins" in late


def test_selector_wrong_type_is_named():
    message = grade("2.8", lambda p, nbytes, alpha, beta, gamma: 2).message
    assert "returned 2; return one of the names" in message


def test_pass_message_reports_the_simulation():
    assert "busbw" in grade("2.7", solution.bus_bandwidth).message
    assert "the closed form says" in grade("2.5", solution.folded_allreduce_time).message


# --- the checkers measure, and the measurement departs from the closed forms -------------------

def test_folding_departs_from_the_closed_form():
    # What 2.5 asks for is what the simulator measures, not what cost() says.
    from dsml.exercises.week2 import FOLDED_CASES, simulate_recursive_doubling
    departs = 0
    for p, nbytes, alpha, beta, gamma in FOLDED_CASES:
        simulated = simulate_recursive_doubling(p, nbytes, alpha, beta, gamma)
        closed = cost("allreduce", "recursive_doubling", p, nbytes, alpha, beta, gamma)
        assert math.isclose(simulated,
                            solution.folded_allreduce_time(p, nbytes, alpha, beta, gamma),
                            rel_tol=1e-12)
        departs += not math.isclose(simulated, closed, rel_tol=1e-9)
    assert departs >= 3


def pick_allreduce_by_time(p, nbytes, alpha, beta, gamma):
    from dsml.exercises.week2 import measured_allreduce_times
    times = measured_allreduce_times(p, nbytes, alpha, beta, gamma)
    return min(times, key=times.get)


def test_reduce_scatter_hints_nudge_without_the_schedule():
    # 2.3's hints may name the mistake but must not hand out the block index formula.
    for wrong in WRONG["2.3"]:
        message = grade("2.3", wrong).message
        assert "r − s − 1" not in message and "(r - s - 1)" not in message, message


def test_selector_cases_include_closed_form_mistakes_with_clear_margins():
    from dsml.exercises.week2 import SELECTOR_CASES, measured_allreduce_times
    closed_form_wrong = 0
    for p, nbytes, alpha, beta, gamma in SELECTOR_CASES:
        times = measured_allreduce_times(p, nbytes, alpha, beta, gamma)
        ordered = sorted(times.values())
        assert ordered[1] > 1.02 * ordered[0], (p, nbytes, times)      # no near-ties
        best = min(times, key=times.get)
        closed_form_wrong += best != pick_by_closed_form(p, nbytes, alpha, beta, gamma)
    assert closed_form_wrong >= 2
    # A rule that never measures (the ring for every p not a power of two) must fail: short
    # vectors on such p, where recursive doubling wins despite its folding steps.
    short_not_power = [case for case in SELECTOR_CASES if case[0] & (case[0] - 1)
                       and pick_allreduce_by_time(*case) == "recursive_doubling"]
    assert len(short_not_power) >= 2
    # The library's own selector (all five algorithms) is fooled the same way.
    assert best_algorithm("allreduce", 6, 1 << 20, 3e-6, 1e-10, 2e-11) == "halving_doubling"


def test_ring_bandwidth_cases_have_p_dividing_n():
    from dsml.exercises.week2 import BUSBW_CASES, RING_BANDWIDTH_CASES
    assert all(n % p == 0 for p, n, _ in RING_BANDWIDTH_CASES)
    assert all(n % p == 0 for _, p, n in BUSBW_CASES)


def test_rank_program_cases_include_awkward_sizes():
    from dsml.exercises.week2 import ALLGATHER_CASES, ANY_P_CASES, REDUCE_SCATTER_CASES
    assert 1 in ANY_P_CASES and any(p & (p - 1) for p in ANY_P_CASES)
    assert any(p == 1 for p, _ in ALLGATHER_CASES)
    assert any(n < p for p, n in REDUCE_SCATTER_CASES)            # shorter than p
    assert any(n % p for p, n in REDUCE_SCATTER_CASES)            # not divisible


# --- the notebook's exercise cells ------------------------------------------------------------

def test_no_stub_shadows_a_name_the_notebook_body_defines():
    contract.assert_no_stub_shadows_the_body(
        2, NOTEBOOK, {"allgather", "allreduce", "run_collective", "crossover_size", "busbw"})


def test_exercise_cells_match_the_checkers():
    contract.assert_exercise_cells_match_checkers(2, contract.stub_cells(NOTEBOOK, CELLS),
                                                  solution)


def notebook_namespace() -> dict:
    """The names the exercise cells use from the notebook above them."""
    import dsml
    from dsml.collectives import allreduce as library_allreduce
    from dsml.comm.api import SizeOnly
    from dsml.comm.sim_engine import simulate
    from dsml.net import AlphaBeta

    def run_collective(collective, p, xs, network=AlphaBeta(2e-6, 1e-10, 2.5e-11), **options):
        def program(comm):
            return (yield from collective(comm, xs[comm.rank].copy(), **options))
        return simulate(program, p, network)

    return {"np": np, "dsml": dsml, "AlphaBeta": AlphaBeta, "SizeOnly": SizeOnly,
            "allreduce": library_allreduce, "run_collective": run_collective}


def test_exercise_stub_cells_print_not_attempted():
    lines = contract.run_exercise_cells(contract.stub_cells(NOTEBOOK, CELLS),
                                        notebook_namespace())
    contract.assert_cells_print_not_attempted(2, lines)


def test_exercise_cells_with_solutions_print_correct():
    lines = contract.run_exercise_cells(contract.stub_cells(NOTEBOOK, CELLS),
                                        notebook_namespace(), solution)
    contract.assert_cells_print_correct(2, lines)


def test_examples_in_the_statements_hold():
    # The worked examples quote numbers; recompute them with the reference solutions.
    from dsml.comm.run import run
    from dsml.net import AlphaBeta
    assert math.isclose(solution.ring_bandwidth_time(4, 4_000_000, 1e-10), 600e-6)
    assert math.isclose(solution.folded_allreduce_time(12, 1_000_000, 5e-6, 1e-10, 5e-11),
                        725e-6)
    assert math.isclose(cost("allreduce", "recursive_doubling", 12, 1_000_000, 5e-6, 1e-10,
                             5e-11), 620e-6)
    assert math.isclose(solution.ring_crossover_size(8, 2e-6, 1e-10, 0.0), 176_000)
    assert math.isclose(solution.bus_bandwidth("allreduce", 8, 1e9, 0.2), 8.75e9)
    assert solution.pick_allreduce(16, 64, 2e-6, 1e-10, 2.5e-11) == "recursive_doubling"
    assert solution.pick_allreduce(16, 256 * 2**20, 2e-6, 1e-10, 2.5e-11) == "halving_doubling"
    assert solution.pick_allreduce(10, 64 * 2**20, 2e-6, 1e-10, 2.5e-11) == "ring"
    assert best_algorithm("allreduce", 10, 64 * 2**20, 2e-6, 1e-10, 2.5e-11) == \
        "halving_doubling"
    network = AlphaBeta(2e-6, 1e-10)

    def values(program, p, make):
        return run(lambda comm: (yield from program(comm, make(comm.rank))), p,
                   network=network, trace=False).values
    gathered = values(solution.ring_allgather, 4, lambda r: np.array([10 * r, 10 * r + 1]))
    assert all(np.array_equal(v, [0, 1, 10, 11, 20, 21, 30, 31]) for v in gathered)
    got = values(solution.ring_reduce_scatter, 3, lambda r: np.arange(5) * (r + 1))
    assert [v.tolist() for v in got] == [[0, 6], [12, 18], [24]]
    assert all(v.tolist() == [55, 55]
               for v in values(solution.allreduce_any_p, 10, lambda r: np.full(2, r + 1)))


# --- exercises that must be built: the library's own answer is refused ----------------------

# 2.7: the library's factor, as `dsml bench` uses it.
def busbw_from_library(collective, p, nbytes, seconds):
    return nbytes / seconds * busbw_factor(collective, p)


def allreduce_library_folding(comm, x):
    return (yield from allreduce(comm, x))          # whatever the default algorithm is


def ring_bandwidth_from_cost(p, nbytes, beta):
    return cost("allreduce", "ring", p, nbytes, 0.0, beta)


def reduce_scatter_from_library(comm, x):
    from dsml.collectives import reduce_scatter
    return (yield from reduce_scatter(comm, x, algorithm="ring"))


def folded_time_by_simulating(p, nbytes, alpha, beta, gamma):
    import dsml
    from dsml.net import AlphaBeta

    def program(comm):
        return (yield from allreduce(comm, dsml.SizeOnly(nbytes), algorithm="recursive_doubling"))
    return dsml.run(program, p, network=AlphaBeta(alpha, beta, gamma), trace=False).time


LIBRARY_ANSWERS = [("2.2", ring_bandwidth_from_cost), ("2.3", reduce_scatter_from_library),
                   ("2.5", folded_time_by_simulating),
                   ("2.1", allgather_bruck), ("2.1", allgather_library_ring),
                   ("2.1", functools.partial(allgather, algorithm="ring")),
                   ("2.4", allreduce_library_doubling), ("2.4", allreduce_library_folding),
                   ("2.7", busbw_from_library)]


@pytest.mark.parametrize("exercise_id, answer", LIBRARY_ANSWERS,
                         ids=[f"{i}-{contract.case_name(getattr(a, 'func', a))}"
                              for i, a in LIBRARY_ANSWERS])
def test_an_answer_that_calls_the_library_is_refused(exercise_id, answer):
    result = grade(exercise_id, answer)
    assert result.status == FAILED
    assert result.message.startswith(f"exercise {exercise_id} asks you to build this yourself")
    assert "dsml.collectives." in result.message         # names what was called
    # and everything is back in place: the library and this module see the real functions.
    assert allgather.__name__ == "allgather" and "stand_in" not in repr(allgather)
    import dsml.collectives
    assert dsml.collectives.allgather is allgather and dsml.collectives.allreduce is allreduce


def test_fresh_cases_2_7_keep_the_contract_for_every_base():
    contract.fresh_cases_keep_the_contract("2.7", solution.bus_bandwidth, WRONG, RIGHT)


def test_a_fresh_case_of_2_7_says_its_inputs_not_the_factor():
    def right_on_the_fixed_cases_only(collective, p, nbytes, seconds):
        from dsml.exercises.week2 import BUSBW_CASES
        exact = solution.bus_bandwidth(collective, p, nbytes, seconds)
        return exact if (collective, p, nbytes) in BUSBW_CASES else 1.01 * exact

    message = grade("2.7", right_on_the_fixed_cases_only).message
    assert message.startswith("bus_bandwidth(") and "drawn afresh" in message
    assert "nccl-tests uses" not in message


def test_a_table_of_answers_copied_from_hints_fails_2_5():
    # On main, such a table passed after 6 checks.
    learned = contract.copied_answers_never_pass(
        "2.5", r"folded_allreduce_time\(p=(\S+), nbytes=(\S+), alpha=(\S+), beta=(\S+), "
               r"gamma=(\S+)\)", r"expected (\S+) s")
    from dsml.exercises.week2 import FOLDED_CASES
    assert learned <= len(FOLDED_CASES)


def test_fresh_cases_2_5_keep_the_contract_for_every_base():
    contract.fresh_cases_keep_the_contract("2.5", solution.folded_allreduce_time, WRONG, RIGHT)
