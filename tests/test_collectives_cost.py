"""Plumbing (hand-written): the closed-form costs of dsml.collectives against the simulator.

The simulator never calls `cost`: it follows events over the α–β–γ network. Where a formula's
assumptions hold (p a power of two, n divisible by p) the two must agree to rounding, α, β and
γ all non-zero. Where they do not hold, the simulator must depart from the formula in the
direction, and by the amount, that the algorithm explains (notebook week 2, section 10).
`best_algorithm` must return the argmin of `cost`.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import dsml
from dsml.collectives import (COLLECTIVE_ALGORITHMS, allgather, allreduce, alltoall,
                              best_algorithm, broadcast, cost, reduce, reduce_scatter)
from dsml.collectives.buffers import lg
from dsml.comm.api import SizeOnly

# Non-zero, unrelated to one another, so that no term can hide behind another.
ALPHA, BETA, GAMMA = 2.3e-6, 1.1e-10, 3.7e-11      # s, s/B, s/B
REL_TOL = 1e-12

POWERS_OF_TWO = [1, 2, 4, 8, 16, 32, 64]
NOT_POWERS_OF_TWO = [3, 5, 6, 7, 9, 11, 12, 13, 17, 24, 31, 33]
# Bytes, divisible by every p above that is a power of two and by every `chunks` used (1…8 and
# 3): 0 (latency only), small (latency-bound), large (bandwidth-bound), huge (placeholders only).
SIZES = [0, 192, 19_200, 3 << 20, 3 << 30]

PAIRS = [(op, algorithm) for op, algorithms in COLLECTIVE_ALGORITHMS.items()
         for algorithm in algorithms]
PAIR_IDS = [f"{op}-{algorithm}" for op, algorithm in PAIRS]
FUNCTIONS = {"broadcast": broadcast, "reduce": reduce, "allreduce": allreduce,
             "allgather": allgather, "reduce_scatter": reduce_scatter}


def collective_program(comm, op, x, kwargs):
    if op == "alltoall":
        return (yield from alltoall(comm, [x] * comm.size))
    return (yield from FUNCTIONS[op](comm, x, **kwargs))


def simulated_time(op, algorithm, p, nbytes, network, payload="size_only", chunks=4):
    """Simulated seconds of one collective; `nbytes` means what it means in `cost`: the vector
    each rank holds, the gathered total (allgather) or a rank's whole send buffer (alltoall)."""
    per_rank = nbytes // p if op in ("allgather", "alltoall") else nbytes
    if payload == "size_only":
        x = SizeOnly(per_rank)
    else:
        assert per_rank % 8 == 0
        x = np.ones(per_rank // 8)                 # float64
    kwargs = {} if op == "alltoall" else {"algorithm": algorithm}
    if algorithm == "chain":
        kwargs["chunks"] = chunks
    return dsml.run(collective_program, p, network=network, args=(op, x, kwargs),
                    trace=False).time


def close(a, b):
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=0.0)


def overlaps_additions(op, algorithm):
    """The naive reduce (and the naive all-reduce built on it) add while the next vector
    streams in, so with γ > 0 and p ≥ 3 they beat their formula (see the departure tests)."""
    return algorithm == "naive" and op in ("reduce", "allreduce")


# --- exactness where the formula's assumptions hold -------------------------------------------

@pytest.mark.parametrize("op, algorithm", PAIRS, ids=PAIR_IDS)
def test_simulated_time_equals_the_closed_form_for_powers_of_two(op, algorithm):
    network = dsml.net.AlphaBeta(ALPHA, BETA, GAMMA)
    gamma_free = dsml.net.AlphaBeta(ALPHA, BETA, 0.0)
    wrong = []
    for p in POWERS_OF_TWO:
        for nbytes in SIZES:
            for chunks in ((1, 3, 4, 8) if algorithm == "chain" else (4,)):
                if chunks > max(1, nbytes):
                    continue      # the chain cuts at most one piece an element (byte, here)
                if overlaps_additions(op, algorithm) and p >= 3:
                    net, gamma = gamma_free, 0.0          # exact only without γ (see below)
                else:
                    net, gamma = network, GAMMA
                t = simulated_time(op, algorithm, p, nbytes, net, chunks=chunks)
                c = cost(op, algorithm, p, nbytes, ALPHA, BETA, gamma, chunks=chunks)
                if not close(t, c):
                    wrong.append(f"p={p} n={nbytes} chunks={chunks}: simulated {t!r}, "
                                 f"formula {c!r}")
    assert not wrong, f"{op}/{algorithm}: simulator and closed form disagree:\n  " + \
        "\n  ".join(wrong)


@pytest.mark.parametrize("op, algorithm", PAIRS, ids=PAIR_IDS)
def test_real_arrays_cost_what_placeholders_cost(op, algorithm):
    """The same sweep with float64 arrays (smaller: they are allocated): equal to the formula."""
    network = dsml.net.AlphaBeta(ALPHA, BETA, 0.0 if overlaps_additions(op, algorithm) else GAMMA)
    for p in (1, 2, 4, 8, 16):
        for nbytes in (0, 8 * 48, 8 * 48_000):         # 48 elements: divisible by p and chunks
            if algorithm == "chain" and nbytes == 0:
                continue      # the chain cuts at most one piece an element: one, not 4, here
            t = simulated_time(op, algorithm, p, nbytes, network, payload="float64")
            c = cost(op, algorithm, p, nbytes, ALPHA, BETA, network.gamma)
            assert close(t, c), f"{op}/{algorithm} p={p} n={nbytes}: simulated {t}, formula {c}"


# Algorithms whose every step is a synchronized exchange or a fixed sequence of sends: their
# formula holds for any p (n divisible by p), not only for powers of two.
EXACT_FOR_ANY_P = [("broadcast", "naive"), ("broadcast", "binomial"),
                   ("broadcast", "scatter_allgather"), ("broadcast", "chain"),
                   ("allreduce", "ring"), ("allgather", "ring"),
                   ("allgather", "recursive_doubling"),      # Bruck: ⌈lg p⌉ rounds, any p
                   ("reduce_scatter", "ring"), ("alltoall", "pairwise")]


@pytest.mark.parametrize("op, algorithm", EXACT_FOR_ANY_P,
                         ids=[f"{o}-{a}" for o, a in EXACT_FOR_ANY_P])
def test_closed_form_is_exact_for_any_p_where_nothing_folds(op, algorithm):
    network = dsml.net.AlphaBeta(ALPHA, BETA, GAMMA)
    for p in NOT_POWERS_OF_TWO:
        for nbytes in (0, 8 * 9240 * p, 3 << 30):     # divisible by p and by chunks = 4
            nbytes -= nbytes % (4 * p)
            if algorithm == "chain" and nbytes == 0:
                continue      # the chain cuts at most one piece an element: one, not 4, here
            t = simulated_time(op, algorithm, p, nbytes, network)
            c = cost(op, algorithm, p, nbytes, ALPHA, BETA, GAMMA)
            assert close(t, c), f"{op}/{algorithm} p={p} n={nbytes}: simulated {t}, formula {c}"


def test_a_single_rank_costs_nothing():
    network = dsml.net.AlphaBeta(ALPHA, BETA, GAMMA)
    for op, algorithm in PAIRS:
        assert simulated_time(op, algorithm, 1, 1 << 20, network) == 0.0
        assert cost(op, algorithm, 1, 1 << 20, ALPHA, BETA, GAMMA) == 0.0


# --- where measurement departs from the formula, and by how much ------------------------------

@pytest.mark.parametrize("op", ["reduce", "allreduce"])
@pytest.mark.parametrize("gamma", [GAMMA, 1e-8], ids=["adding is fast", "adding is slow"])
def test_naive_reduce_overlaps_additions_with_arrivals(op, gamma):
    """The formula charges (p − 1)·nγ as if the root added each vector before the next began
    to arrive; eager sends stream vector i + 1 in while vector i is added. Root's timeline:
    first arrival at m = α + nβ, then p − 2 steps of max(m, nγ) (the slower of the next
    arrival and the current addition), then the last addition nγ. So the simulator beats the
    formula by exactly (p − 2)·min(α + nβ, nγ) — the additions (or arrivals) it hides."""
    network = dsml.net.AlphaBeta(ALPHA, BETA, gamma)
    for p in (2, 3, 4, 7, 8, 16, 33):
        for nbytes in (8 * 64, 8 * 64_000, 8 * 6_400_000):
            t = simulated_time(op, "naive", p, nbytes, network)
            formula = cost(op, "naive", p, nbytes, ALPHA, BETA, gamma)
            hidden = (p - 2) * min(ALPHA + nbytes * BETA, nbytes * gamma)
            assert t <= formula * (1 + REL_TOL)
            assert math.isclose(formula - t, hidden, rel_tol=1e-9, abs_tol=1e-15 * formula), \
                f"{op} naive p={p} n={nbytes}: formula − simulated = {formula - t}, " \
                f"expected (p − 2)·min(α + nβ, nγ) = {hidden}"


def test_recursive_doubling_on_other_p_pays_exactly_one_extra_message():
    """p not a power of two: fold_in (a whole vector and its addition) replaces the extra round
    that ⌈lg p⌉ counts, and fold_out — sending the result back — is one message of n bytes
    the formula does not have: simulated = formula + α + nβ, exactly."""
    network = dsml.net.AlphaBeta(ALPHA, BETA, GAMMA)
    for p in NOT_POWERS_OF_TWO:
        for nbytes in (0, 8 * 1000, 8 * 1_000_000):
            t = simulated_time("allreduce", "recursive_doubling", p, nbytes, network)
            formula = cost("allreduce", "recursive_doubling", p, nbytes, ALPHA, BETA, GAMMA)
            extra = ALPHA + nbytes * BETA
            assert t > formula
            assert math.isclose(t - formula, extra, rel_tol=1e-9), \
                f"p={p} n={nbytes}: simulated − formula = {t - formula}, " \
                f"expected α + nβ = {extra}"


HALVING = [("reduce_scatter", "recursive_halving"), ("reduce", "rabenseifner"),
           ("allreduce", "halving_doubling")]


@pytest.mark.parametrize("op, algorithm", HALVING, ids=[f"{o}-{a}" for o, a in HALVING])
@pytest.mark.parametrize("alpha, beta, gamma", [(ALPHA, BETA, GAMMA), (1e-5, 1e-9, 1e-8),
                                                (1e-4, 1e-12, 1e-12), (0.0, 1e-9, 2.5e-10)])
def test_halving_on_other_p_is_slower_by_at_least_the_fold(op, algorithm, alpha, beta, gamma):
    """p not a power of two: the first 2·rem ranks fold in pairs — one whole vector sent (and
    added) that the formula never charges — and the blocks of folded pairs make the halving
    rounds uneven. So simulated − formula ≥ α + nβ, and stays below one more full step
    (α + nβ + nγ) per round, ⌈lg p⌉ + 1 of them (ports contend after the unfold)."""
    network = dsml.net.AlphaBeta(alpha, beta, gamma)
    for p in NOT_POWERS_OF_TWO:
        for nbytes in (8 * p, 8000 * p, 800_000 * p):
            t = simulated_time(op, algorithm, p, nbytes, network)
            formula = cost(op, algorithm, p, nbytes, alpha, beta, gamma)
            fold = alpha + nbytes * beta
            step = alpha + nbytes * (beta + gamma)
            departure = t - formula
            assert departure >= fold * (1 - 1e-9), \
                f"{op}/{algorithm} p={p} n={nbytes}: simulated − formula = {departure}, " \
                f"less than the fold's message α + nβ = {fold}"
            assert departure <= (lg(p) + 1) * step, \
                f"{op}/{algorithm} p={p} n={nbytes}: simulated − formula = {departure} > " \
                f"(⌈lg p⌉ + 1)·(α + nβ + nγ) = {(lg(p) + 1) * step}"


@pytest.mark.parametrize("op, algorithm", [("reduce_scatter", "recursive_halving"),
                                           ("reduce", "rabenseifner"),
                                           ("allreduce", "recursive_doubling")])
def test_on_latency_alone_folding_costs_exactly_one_message(op, algorithm):
    """β = γ = 0: time counts messages on the critical path. fold_in + ⌊lg p⌋ rounds + one
    message back (fold_out or unfold) is ⌈lg p⌉ + 1 steps where the formula counts ⌈lg p⌉:
    exactly one α more."""
    network = dsml.net.AlphaBeta(1.0, 0.0, 0.0)
    for p in NOT_POWERS_OF_TWO:
        t = simulated_time(op, algorithm, p, 8 * p, network)
        formula = cost(op, algorithm, p, 8 * p, 1.0, 0.0, 0.0)
        assert t - formula == pytest.approx(1.0, rel=1e-12), \
            f"{op}/{algorithm} p={p}: {t - formula} extra latencies, expected exactly 1"


@pytest.mark.parametrize("op, algorithm", [("reduce", "binomial"), ("allreduce", "tree")])
def test_binomial_reduce_on_other_p_never_loses_and_saves_at_most_the_hidden_additions(
        op, algorithm):
    """p not a power of two: a subtree smaller than its slot finishes early and its eager send
    streams in while the root still adds the previous one, so the simulator is at most as
    slow as the formula, and faster by at most the ⌈lg p⌉ − 1 additions that can hide."""
    network = dsml.net.AlphaBeta(ALPHA, BETA, GAMMA)
    for p in NOT_POWERS_OF_TWO:
        for nbytes in (8 * p, 8000 * p, 800_000 * p):
            t = simulated_time(op, algorithm, p, nbytes, network)
            formula = cost(op, algorithm, p, nbytes, ALPHA, BETA, GAMMA)
            saved = formula - t
            assert saved >= -REL_TOL * formula, f"p={p} n={nbytes}: slower than the formula"
            assert saved <= (lg(p) - 1) * nbytes * GAMMA * (1 + 1e-9), \
                f"p={p} n={nbytes}: saved {saved}, more than (⌈lg p⌉ − 1)·nγ"
    # ...and at p = 3 the saving is exactly one hidden addition.
    t = simulated_time(op, algorithm, 3, 8000 * 3, network)
    assert math.isclose(cost(op, algorithm, 3, 8000 * 3, ALPHA, BETA, GAMMA) - t,
                        8000 * 3 * GAMMA, rel_tol=1e-9)


# --- best_algorithm ---------------------------------------------------------------------------

NETWORKS = [(2e-6, 1e-10, 2.5e-11), (1e-5, 1e-9, 0.0), (5e-5, 1e-11, 1e-11), (0.0, 1e-9, 1e-10),
            (1e-6, 0.0, 0.0)]


@pytest.mark.parametrize("op", list(COLLECTIVE_ALGORITHMS))
def test_best_algorithm_is_the_argmin_of_cost_first_listed_on_ties(op):
    algorithms = COLLECTIVE_ALGORITHMS[op]
    for alpha, beta, gamma in NETWORKS:
        for p in [1, 2, 3, 4, 6, 8, 16, 17, 64, 100, 1024]:
            for nbytes in [0, 8, 1000, 1 << 20, 1 << 30]:
                best = best_algorithm(op, p, nbytes, alpha, beta, gamma)
                costs = [cost(op, a, p, nbytes, alpha, beta, gamma) for a in algorithms]
                index = algorithms.index(best)
                assert all(costs[index] <= c for c in costs), \
                    f"{op} p={p} n={nbytes}: {best} costs {costs[index]}, not the minimum of " \
                    f"{dict(zip(algorithms, costs))}"
                assert all(c > costs[index] for c in costs[:index]), \
                    f"{op} p={p} n={nbytes}: a tie must go to the first listed algorithm"


def test_best_algorithm_follows_the_latency_bandwidth_trade_off():
    """Hand-derived regimes: small vectors want the fewest rounds, large ones the fewest bytes."""
    alpha, beta = 1e-5, 1e-10
    assert best_algorithm("allreduce", 64, 8, alpha, beta) == "recursive_doubling"
    # 2 lg p α < 2 (p − 1) α with the same bandwidth terms: halving-doubling beats the ring.
    assert best_algorithm("allreduce", 64, 1 << 30, alpha, beta) == "halving_doubling"
    assert best_algorithm("broadcast", 64, 8, alpha, beta) == "binomial"
    assert best_algorithm("broadcast", 64, 1 << 30, alpha, beta) == "scatter_allgather"
    assert best_algorithm("allgather", 64, 1 << 30, alpha, beta) == "recursive_doubling"
    assert best_algorithm("alltoall", 64, 1 << 20, alpha, beta) == "pairwise"
    # One rank: every algorithm costs 0, the first listed wins.
    assert best_algorithm("reduce", 1, 1 << 20, alpha, beta) == COLLECTIVE_ALGORITHMS["reduce"][0]


def test_best_algorithm_is_fastest_in_the_simulator_too():
    """At powers of two the formulas are exact (naive excepted, γ = 0 here so it is exact too):
    the algorithm best_algorithm picks is also the fastest the simulator measures."""
    alpha, beta = 1e-5, 1e-10
    network = dsml.net.AlphaBeta(alpha, beta, 0.0)
    for op, algorithms in COLLECTIVE_ALGORITHMS.items():
        for p in (2, 8, 32):
            for nbytes in (64 * 3, 3 << 26):
                best = best_algorithm(op, p, nbytes, alpha, beta)
                measured = {a: simulated_time(op, a, p, nbytes, network) for a in algorithms}
                assert measured[best] <= min(measured.values()) * (1 + REL_TOL), \
                    f"{op} p={p} n={nbytes}: picked {best}, measured {measured}"


def test_best_algorithm_rejects_an_unknown_op():
    with pytest.raises(ValueError, match=r"unknown op 'allscatter'; choose one of broadcast"):
        best_algorithm("allscatter", 4, 1000, 1e-6, 1e-9)


# --- busbw factors (nccl-tests) ----------------------------------------------------------------

@pytest.mark.parametrize("p", [1, 2, 3, 8, 1000])
def test_busbw_factors_follow_nccl_tests(p):
    from dsml.collectives import BUSBW_FACTORS, busbw_factor
    expected = {"allreduce": 2 * (p - 1) / p, "allgather": (p - 1) / p,
                "reduce_scatter": (p - 1) / p, "alltoall": (p - 1) / p, "broadcast": 1.0,
                "reduce": 1.0}
    assert set(BUSBW_FACTORS) == set(expected)
    for collective, factor in expected.items():
        assert busbw_factor(collective, p) == factor


@pytest.mark.parametrize("collective,p,match", [("gather", 4, "unknown collective 'gather'"),
                                                ("allreduce", 0, "p must be"),
                                                ("allreduce", 2.0, "p must be")])
def test_busbw_factor_names_bad_input(collective, p, match):
    from dsml.collectives import busbw_factor
    with pytest.raises(ValueError, match=match):
        busbw_factor(collective, p)
