"""Plumbing (hand-written): the checkers of week 2's exercises (collective communication).

Each checker calls the learner's function on inputs different from the worked example in
the notebook and raises `Wrong` with a hint that says what was tried, what was expected,
what came back and what to reconsider. Rank programs are run on the simulator and held
against NumPy for their values and against the library's own collectives for their time;
claims about time (the ring's bandwidth term, folding for p not a power of two, the
crossover size, which algorithm is fastest) are measured with the simulator rather than
taken from `dsml.collectives.cost`, which is a closed form and can be wrong where its
assumptions fail.

This module imports from the lower layers only (`dsml.sim`, `dsml.net`, `dsml.comm`,
`dsml.collectives`), never the top-level `dsml` package, which sits above it.
"""
from __future__ import annotations

import math

import numpy as np

from dsml.collectives import allgather, allreduce, broadcast, busbw_factor, reduce_scatter
from dsml.comm.api import Comm, RankError, Recv, SizeOnly
from dsml.comm.run import run
from dsml.exercises import (Wrong, _not_implemented, as_float, checker, expect_close,
                            expect_rank_program, fresh_rng)
from dsml.net.alphabeta import AlphaBeta
from dsml.sim import DeadlockError

# A tolerance for "no slower than": simulated times are sums of the same floating-point
# terms, so an equally fast program can differ from the reference in the last bits only.
_TIME_RTOL = 1e-9


# --- running a learner's rank program ---------------------------------------------------

def _advice_for(failure: str) -> str:
    """A pointer for errors that learners commonly meet in this week's rank programs."""
    if "must be a rank in" in failure:
        return (" A partner outside 0..p−1 usually means a partner formula that only works "
                "when p is a power of two (r XOR 2^k), or a neighbour computed without "
                "`% p`.")
    if "equal division" in failure:
        return (" np.split insists on equal blocks; np.array_split makes the first n mod p "
                "blocks one element longer, which is how the blocks are cut here.")
    if "itself" in failure:
        return " With p = 1 there is nobody to talk to: skip the exchange loop."
    return ""


def _run_rank_program(answer, name: str, p: int, inputs: list, network, context: str):
    """Run `answer(comm, inputs[rank].copy())` on p simulated ranks; return the RunResult.

    A plain function instead of a generator, a deadlock, or a failing rank becomes Wrong
    (in `context`); an untouched stub's NotImplementedError is passed on to the harness.
    """
    expect_rank_program(answer(Comm(0, p), inputs[0].copy()), f"{name}(comm, x)",
                        "got = yield comm.sendrecv(right, block, left)")

    def program(comm):
        return (yield from answer(comm, inputs[comm.rank].copy()))

    try:
        return run(program, p, engine="sim", network=network, trace=False)
    except DeadlockError as deadlock:
        waits = [process.waiting_for for process in deadlock.waiting]
        if len(waits) == p and all(isinstance(w, Recv) for w in waits):
            raise Wrong(f"{context}: the simulator found a deadlock — every rank waits to "
                        f"receive and no message is on its way. Exchange with "
                        f"comm.sendrecv(dst, block, src), or send before receiving (sends "
                        f"are eager).") from None
        lines = str(deadlock).splitlines()
        detail = "; ".join(line.strip() for line in lines[1:3])
        raise Wrong(f"{context}: your rank program deadlocked ({lines[0].rstrip(':')} "
                    f"{detail}). Every receive needs a matching send from the rank it names, "
                    f"and every rank must run the same number of exchanges.") from None
    except RankError as failure:
        if _not_implemented(failure):      # an untouched stub: let the harness say so
            raise
        first = str(failure).splitlines()[0].rstrip(":")
        raise Wrong(f"{context}: your rank program failed: {first}.{_advice_for(first)}") \
            from None


def _reference_time(collective, p: int, inputs: list, network, **options) -> float:
    """Simulated time (s) of one of the library's collectives on the same inputs."""
    def program(comm):
        return (yield from collective(comm, inputs[comm.rank].copy(), **options))
    return run(program, p, engine="sim", network=network, trace=False).time


def _as_result_array(got, rank: int, context: str) -> np.ndarray:
    if got is None:
        raise Wrong(f"{context}: rank {rank} returned None; `return` the result at the end of "
                    f"the rank program.")
    if not isinstance(got, np.ndarray):
        raise Wrong(f"{context}: rank {rank} returned a {type(got).__name__}; return one "
                    f"NumPy array (np.concatenate joins a list of blocks).")
    return got


def _counts(value: int, p: int) -> list[int]:
    """How often each rank's input entered an element: inputs are 16^r + 16^p·noise, so
    the base-16 digits of (value mod 16^p) count the contributions of ranks 0 … p−1."""
    value = int(value) % 16 ** p
    return [(value // 16 ** r) % 16 for r in range(p)]


def _counted_inputs(rng, p: int, length: int) -> list:
    """Rank r's vector: 16^r in every element, plus 16^p times a small random integer, so
    every partial or double-counted sum says which ranks went into it."""
    return [16 ** r + 16 ** p * rng.integers(0, 10, size=length).astype(np.int64)
            for r in range(p)]


def _explain_sum(got: np.ndarray, expected: np.ndarray, p: int, rank: int,
                 own: np.ndarray) -> str:
    """Say how a wrong sum came about: which ranks' inputs it contains, how often."""
    if got.shape == own.shape and np.array_equal(got, own):
        return f"rank {rank} returned its own input unchanged"
    wrong = np.flatnonzero(got != expected)
    if wrong.size == 0:
        return f"rank {rank} returned the right numbers with dtype {got.dtype}"
    i = int(wrong[0])
    value = got[i]
    if not (np.isfinite(value) and float(value).is_integer()):
        return (f"element {i} on rank {rank} is {float(value):g}, expected "
                f"{int(expected[i])}")
    return (f"element {i} on rank {rank} is {int(value)}, expected {int(expected[i])}: it "
            f"holds rank 0 … {p - 1}'s inputs {_counts(value, p)} times (each should count "
            f"once)")


# --- 2.1 ----------------------------------------------------------------------------------

ALLGATHER_CASES = [(3, 4), (5, 2), (2, 3), (6, 1), (1, 3)]      # (p, elements per rank)


@checker("2.1", "ring all-gather",
         builds=("dsml.collectives.allgather.allgather",
                 "dsml.collectives.allgather.allgather_ring_blocks",
                 "dsml.collectives.allgather.allgather_bruck_blocks"))
def check_ring_allgather(ring_allgather):
    rng = np.random.default_rng(2001)
    network = AlphaBeta(alpha=2e-6, beta=1e-9)
    for p, m in ALLGATHER_CASES:
        # Rank r's block starts at 1000·r, so every block says whose it is.
        inputs = [1000 * r + rng.integers(0, 100, size=m).astype(np.int64) for r in range(p)]
        expected = np.concatenate(inputs)
        context = (f"ring_allgather on p={p} ranks, each with {m} int64 element(s) (rank r's "
                   f"block starts near 1000·r)")
        result = _run_rank_program(ring_allgather, "ring_allgather", p, inputs, network,
                                   context)
        for rank, got in enumerate(result.values):
            got = _as_result_array(got, rank, context)
            if got.shape == expected.shape and np.array_equal(got, expected) \
                    and got.dtype == expected.dtype:
                continue
            if got.shape != expected.shape:
                raise Wrong(f"{context}: rank {rank} returned shape {got.shape}, expected "
                            f"{expected.shape}: all p blocks of {m} elements, one after the "
                            f"other.")
            owners = []
            for block in np.split(got, p):
                owners.append(next((r for r in range(p) if np.array_equal(block, inputs[r])),
                                   None))
            if got.dtype != expected.dtype and np.array_equal(got, expected):
                raise Wrong(f"{context}: rank {rank} returned dtype {got.dtype}, expected "
                            f"{expected.dtype}: keep the blocks' dtype (start from the "
                            f"received arrays, not from a new float array).")
            if None not in owners and sorted(owners) == list(range(p)):
                raise Wrong(f"{context}: rank {rank} returned the blocks of ranks {owners} in "
                            f"that order; expected ranks {list(range(p))}. Store each block "
                            f"at the position of the rank it came from, not in the order it "
                            f"arrived.")
            if None not in owners:
                missing = [r for r in range(p) if r not in owners]
                raise Wrong(f"{context}: rank {rank} returned the blocks of ranks {owners}; "
                            f"expected ranks {list(range(p))}: the blocks of ranks {missing} "
                            f"never reached it. In step s a rank must pass on the block it "
                            f"received in step s − 1 (not its own again), so that every block "
                            f"travels all the way round the ring.")
            raise Wrong(f"{context}: rank {rank} returned {got.tolist()}, expected "
                        f"{expected.tolist()}. In step s a rank must pass on the block it "
                        f"received in step s − 1 (not its own again), and keep track of "
                        f"whose block that is: rank (r − s − 1) mod p's.")
        ring = _reference_time(allgather, p, inputs, network, algorithm="ring")
        if result.time > ring * (1 + _TIME_RTOL):
            alpha, beta = network.alpha, network.beta
            raise Wrong(f"{context}: the values are right, but your program took "
                        f"{result.time * 1e6:.6g} µs of simulated time where the ring takes "
                        f"{ring * 1e6:.6g} µs = (p − 1)(α + mβ) with α = {alpha:g} s, "
                        f"β = {beta:g} s/B, m = {8 * m} B. A ring runs p − 1 steps in which "
                        f"every rank sends one block to its right and receives one from its "
                        f"left at the same time (comm.sendrecv, or an eager send followed by "
                        f"the receive). When several messages head for one rank, its port "
                        f"takes them one after the other: gathering on one rank makes it the "
                        f"bottleneck.")
    return "values equal np.concatenate and the simulated time is the ring's (p − 1)(α + mβ)"


# --- 2.2 ----------------------------------------------------------------------------------

def simulate_ring_allreduce(p: int, nbytes: int, alpha: float, beta: float,
                            gamma: float = 0.0) -> float:
    """Simulated time (s) of dsml's ring all-reduce of an n-byte vector on AlphaBeta."""
    def program(comm):
        return (yield from allreduce(comm, SizeOnly(nbytes), algorithm="ring"))
    return run(program, p, engine="sim", network=AlphaBeta(alpha, beta, gamma),
               trace=False).time


# (p, nbytes, beta); p divides n so that every block is n/p bytes.
RING_BANDWIDTH_CASES = [(3, 3 * 2 ** 20, 1e-10), (8, 8 * 1000, 2e-9), (2, 1_000_000, 1e-9),
                        (5, 5 * 4096, 4e-11)]


@checker("2.2", "the ring's bandwidth term", builds=("dsml.collectives.cost.cost",))
def check_ring_bandwidth_time(ring_bandwidth_time):
    for p, nbytes, beta in RING_BANDWIDTH_CASES:
        simulated = simulate_ring_allreduce(p, nbytes, alpha=0.0, beta=beta)
        expect_close(ring_bandwidth_time(p, nbytes, beta), simulated,
                     f"ring_bandwidth_time(p={p}, nbytes={nbytes}, beta={beta:g})",
                     f"(The expected time was measured by running a ring all-reduce in the "
                     f"simulator with α = 0 and γ = 0, so only bytes cost time.) Count the "
                     f"steps of both phases — reduce-scatter, then all-gather — and the size "
                     f"of the block each rank sends in one step; the steps run one after the "
                     f"other, and within a step all ranks send at once.", unit="s")
    p, nbytes, beta = RING_BANDWIDTH_CASES[0]
    return (f"on {p} ranks the ring moves 2(p−1)/p = {2 * (p - 1) / p:.3g} vectors through "
            f"every port, {2 * (p - 1) / p * nbytes / 2 ** 20:.3g} MiB for a "
            f"{nbytes / 2 ** 20:g} MiB vector")


# --- 2.3 ----------------------------------------------------------------------------------

REDUCE_SCATTER_CASES = [(4, 10), (5, 3), (3, 7), (6, 6), (1, 4)]   # (p, elements)


@checker("2.3", "ring reduce-scatter",
         builds=("dsml.collectives.reduce_scatter.reduce_scatter",
                 "dsml.collectives.reduce_scatter.reduce_scatter_ring_blocks"))
def check_ring_reduce_scatter(ring_reduce_scatter):
    rng = np.random.default_rng(2003)
    network = AlphaBeta(alpha=2e-6, beta=1e-9)
    for p, length in REDUCE_SCATTER_CASES:
        inputs = _counted_inputs(rng, p, length)
        total = np.sum(inputs, axis=0)
        blocks = np.array_split(total, p)
        context = (f"ring_reduce_scatter on p={p} ranks with {length} int64 elements each "
                   f"(rank r's input is 16^r + 16^{p}·noise, so a sum shows whose inputs are "
                   f"in it)")
        result = _run_rank_program(ring_reduce_scatter, "ring_reduce_scatter", p, inputs,
                                   network, context)
        for rank, got in enumerate(result.values):
            got = _as_result_array(got, rank, context)
            expected = blocks[rank]
            if got.shape == expected.shape and np.array_equal(got, expected):
                continue
            sizes = [len(b) for b in blocks]
            if got.shape != expected.shape:
                other = next((j for j, b in enumerate(blocks)
                              if b.shape == got.shape and np.array_equal(b, got)), None)
                if got.shape == total.shape:
                    raise Wrong(f"{context}: rank {rank} returned {got.size} elements — the "
                                f"whole vector — expected only its block {rank} of sizes "
                                f"{sizes} (np.array_split(sum, p)).")
                if other is not None:
                    raise Wrong(f"{context}: rank {rank} returned block {other} of the sum, "
                                f"expected block {rank}. Check which block a rank sends in "
                                f"step s: work backwards from the last step, in which rank r "
                                f"must add the final contribution to block r.")
                raise Wrong(f"{context}: rank {rank} returned shape {got.shape}, expected "
                            f"{expected.shape}: block {rank} of np.array_split(sum, p), whose "
                            f"blocks have sizes {sizes}.")
            other = next((j for j, b in enumerate(blocks)
                          if j != rank and b.shape == got.shape and np.array_equal(b, got)
                          and b.size), None)
            if other is not None:
                raise Wrong(f"{context}: rank {rank} returned block {other} of the sum, "
                            f"expected block {rank}. Which block does rank r receive in the "
                            f"last step, and is it the one it must end up holding? Shift the "
                            f"block each rank sends in step s until it is.")
            own = np.array_split(inputs[rank], p)[rank]
            raise Wrong(f"{context}: {_explain_sum(got, expected, p, rank, own)}. Two "
                        f"things to check: does every step add what arrives into your own "
                        f"copy of that block, and is that sum what you pass on next? And is "
                        f"the block rank r completes last the block it returns?")
        ring = _reference_time(reduce_scatter, p, inputs, network, algorithm="ring")
        if result.time > ring * (1 + _TIME_RTOL):
            raise Wrong(f"{context}: the values are right, but your program took "
                        f"{result.time * 1e6:.6g} µs of simulated time where the ring takes "
                        f"{ring * 1e6:.6g} µs: p − 1 steps in which every rank sends one block "
                        f"of about n/p elements to its right and receives one from its left "
                        f"at the same time. Reducing everything on one rank and then "
                        f"scattering funnels all the data through that rank's port; a step "
                        f"that waits for a receive before it sends doubles the step's time.")
    return "every rank holds its np.array_split block of the sum, in the ring's time"


# --- 2.4 ----------------------------------------------------------------------------------

ANY_P_CASES = [3, 6, 7, 5, 4, 1]


@checker("2.4", "all-reduce for any number of ranks",
         builds=("dsml.collectives.allreduce.allreduce",
                 "dsml.collectives.allreduce.allreduce_recursive_doubling",
                 "dsml.collectives.allreduce.allreduce_halving_doubling"))
def check_allreduce_any_p(allreduce_any_p):
    rng = np.random.default_rng(2004)
    # Latency-bound: 5 elements, α ≫ nβ, so the time counts message rounds.
    network = AlphaBeta(alpha=1e-5, beta=1e-9)
    for p in ANY_P_CASES:
        inputs = _counted_inputs(rng, p, 5)
        expected = np.sum(inputs, axis=0)
        context = (f"allreduce_any_p on p={p} ranks with 5 int64 elements each (rank r's "
                   f"input is 16^r + 16^{p}·noise)")
        result = _run_rank_program(allreduce_any_p, "allreduce_any_p", p, inputs, network,
                                   context)
        for rank, got in enumerate(result.values):
            got = _as_result_array(got, rank, context)
            if got.shape == expected.shape and np.array_equal(got, expected):
                continue
            if got.shape != expected.shape:
                raise Wrong(f"{context}: rank {rank} returned shape {got.shape}, expected "
                            f"{expected.shape}, the elementwise sum.")
            raise Wrong(f"{context}: {_explain_sum(got, expected, p, rank, inputs[rank])}. "
                        f"With p = 2^m + q, let q pairs of ranks merge first (one hands its "
                        f"vector to its partner and sits out), run recursive doubling on the "
                        f"2^m ranks left, then send the result back to the ranks that sat "
                        f"out.")
        folded = _reference_time(allreduce, p, inputs, network, algorithm="recursive_doubling")
        # One message more than the library's folding is allowed: where the folded ranks sit
        # decides whether a partner's eager message queues ahead of the fold at a port.
        one_round = network.alpha + inputs[0].nbytes * network.beta
        budget = folded + one_round
        if result.time > budget * (1 + _TIME_RTOL):
            rounds = p.bit_length() - 1 + (0 if p & (p - 1) == 0 else 2)
            raise Wrong(f"{context}: the sums are right, but your program took "
                        f"{result.time / one_round:.3g} message times "
                        f"({result.time * 1e6:.6g} µs of simulated time); recursive doubling "
                        f"with folding needs {rounds} rounds ({folded * 1e6:.6g} µs), and the "
                        f"checker allows one more (α = {network.alpha:g} s dominates at this "
                        f"size). "
                        f"A ring takes 2(p − 1) rounds and a reduce followed by a broadcast "
                        f"2⌈lg p⌉: fold to a power of two, double, unfold.")
    return "the sums are exact on 1, 3, 4, 5, 6 and 7 ranks, in the rounds folding needs"


# --- 2.5 ----------------------------------------------------------------------------------

def simulate_recursive_doubling(p: int, nbytes: int, alpha: float, beta: float,
                                gamma: float) -> float:
    """Simulated time (s) of dsml's recursive-doubling all-reduce of an n-byte vector."""
    def program(comm):
        return (yield from allreduce(comm, SizeOnly(nbytes), algorithm="recursive_doubling"))
    return run(program, p, engine="sim", network=AlphaBeta(alpha, beta, gamma),
               trace=False).time


# (p, nbytes, alpha, beta, gamma): non-powers of two with 1, 2 and 5 folded pairs, and two
# powers of two, where nothing is folded.
FOLDED_CASES = [(6, 48_000, 2e-6, 1e-10, 2.5e-11), (13, 130_000, 1e-6, 2e-10, 1e-10),
                (8, 32_768, 3e-6, 1e-10, 5e-11), (5, 1_000_000, 1e-5, 1e-9, 2e-10),
                (2, 4_096, 4e-6, 5e-10, 1e-10)]


@checker("2.5", "what folding costs",
         builds=("dsml.collectives.allreduce.allreduce",
                 "dsml.collectives.allreduce.allreduce_recursive_doubling"))
def check_folded_allreduce_time(folded_allreduce_time):
    fresh = fresh_rng()       # two more cases, drawn afresh for every check
    cases = [(case, False) for case in FOLDED_CASES]
    cases += [((int(fresh.integers(2, 17)), int(fresh.integers(1, 2_000_000)),
                float(f"{10 ** fresh.uniform(-6.5, -4.5):.3g}"),
                float(f"{10 ** fresh.uniform(-11, -9):.3g}"),
                float(f"{10 ** fresh.uniform(-12, -10):.3g}")), True) for _ in range(2)]
    for (p, nbytes, alpha, beta, gamma), drawn in cases:
        simulated = simulate_recursive_doubling(p, nbytes, alpha, beta, gamma)
        closed = math.ceil(math.log2(p)) * (alpha + nbytes * (beta + gamma))
        note = "" if math.isclose(simulated, closed, rel_tol=1e-9) else (
            f" (The closed form ⌈lg p⌉(α + nβ + nγ) = {closed:.6g} s of section 9 does not "
            f"count the folding.)")
        expect_close(folded_allreduce_time(p, nbytes, alpha, beta, gamma), simulated,
                     f"folded_allreduce_time(p={p}, nbytes={nbytes}, alpha={alpha:g}, "
                     f"beta={beta:g}, gamma={gamma:g})",
                     f"(The expected time was measured by running recursive doubling in the "
                     f"simulator.){note} Follow the slowest rank: a folded pair exchanges "
                     f"once before the doubling rounds (and the receiver adds), the 2^⌊lg p⌋ "
                     f"ranks left run ⌊lg p⌋ rounds, and the result goes back once after. "
                     f"Which of these steps exist when p is a power of two?", unit="s",
                     drawn=drawn)
    p, nbytes, alpha, beta, gamma = FOLDED_CASES[0]
    simulated = simulate_recursive_doubling(p, nbytes, alpha, beta, gamma)
    closed = math.ceil(math.log2(p)) * (alpha + nbytes * (beta + gamma))
    return (f"on {p} ranks the simulator took {simulated * 1e6:.4g} µs, the closed form "
            f"says {closed * 1e6:.4g} µs")


# --- 2.6 ----------------------------------------------------------------------------------

def simulate_allreduce(p: int, nbytes: int, network, algorithm: str) -> float:
    """Simulated time (s) of dsml's all-reduce of an n-byte vector with `algorithm`."""
    def program(comm):
        return (yield from allreduce(comm, SizeOnly(nbytes), algorithm=algorithm))
    return run(program, p, engine="sim", network=network, trace=False).time


def _nearest_multiple(n: float, p: int) -> int:
    return max(p, int(round(n / p)) * p)


CROSSOVER_CASES = [(8, 5e-6, 1e-10, 2.5e-11), (16, 1e-6, 4e-11, 0.0),
                   (4, 2e-5, 1e-9, 5e-10), (32, 3e-6, 2e-10, 1e-10)]


@checker("2.6", "recursive doubling or ring?")
def check_ring_crossover_size(ring_crossover_size):
    for p, alpha, beta, gamma in CROSSOVER_CASES:
        what = (f"ring_crossover_size(p={p}, alpha={alpha:g}, beta={beta:g}, "
                f"gamma={gamma:g})")
        got = as_float(ring_crossover_size(p, alpha, beta, gamma), what)
        L = math.log2(p)
        expected = ((2 * (p - 1) - L) * alpha
                    / (L * (beta + gamma) - (p - 1) / p * (2 * beta + gamma)))
        derive = ("Equate lg p(α + nβ + nγ) with 2(p − 1)α + 2(p − 1)/p·nβ + (p − 1)/p·nγ, "
                  "collect the terms in n on one side, and keep γ: recursive doubling adds "
                  "the whole vector lg p times, the ring only (p − 1)/p of it once.")
        if not got > 0:
            raise Wrong(f"{what} returned {got:.6g} B, expected {expected:.6g} B: a size is "
                        f"> 0 (for tiny vectors recursive doubling wins, for huge ones the "
                        f"ring). {derive}")
        network = AlphaBeta(alpha, beta, gamma)
        # Measure both algorithms in the simulator 2 % either side of the answer.
        for side, n, ring_should_win in [("above", _nearest_multiple(got * 1.02, p), True),
                                         ("below", _nearest_multiple(got * 0.98, p), False)]:
            doubling = simulate_allreduce(p, n, network, "recursive_doubling")
            ring = simulate_allreduce(p, n, network, "ring")
            if (ring < doubling) != ring_should_win:
                verdict = "still loses" if ring_should_win else "already wins"
                raise Wrong(f"{what} returned {got:.6g} B, expected {expected:.6g} B: at "
                            f"n = {n} B, 2 % {side} your answer, the simulated ring {verdict} "
                            f"(ring {ring * 1e6:.6g} µs, recursive doubling "
                            f"{doubling * 1e6:.6g} µs). {derive}")
        expect_close(got, expected, what, derive, unit="B")
    return "the simulator agrees: recursive doubling wins below it, the ring above"


# --- 2.7 ----------------------------------------------------------------------------------

def simulate_collective(collective: str, p: int, nbytes: int, network) -> float:
    """Simulated time (s) of a collective as nccl-tests sizes it: `nbytes` is the vector
    of all-reduce, reduce-scatter and broadcast, and the gathered total of all-gather."""
    if collective == "allgather":
        payload, program_of = SizeOnly(nbytes // p), allgather
    else:
        payload = SizeOnly(nbytes)
        program_of = {"allreduce": allreduce, "reduce_scatter": reduce_scatter,
                      "broadcast": broadcast}[collective]

    def program(comm):
        return (yield from program_of(comm, payload))
    return run(program, p, engine="sim", network=network, trace=False).time


# (collective, p, nbytes S); every S divisible by p.
BUSBW_CASES = [("allreduce", 6, 6 * 2 ** 20), ("allgather", 5, 5 * 2 ** 18),
               ("reduce_scatter", 3, 3 * 2 ** 20), ("broadcast", 4, 2 ** 20),
               ("allreduce", 3, 3 * 2 ** 16)]


@checker("2.7", "bus bandwidth", builds=("dsml.collectives.cost.busbw_factor",))
def check_bus_bandwidth(bus_bandwidth):
    network = AlphaBeta(alpha=5e-6, beta=1 / 12.5e9)
    measured = []
    fresh = fresh_rng()       # two more cases, drawn afresh for every check
    cases = [(case, False) for case in BUSBW_CASES]
    for _ in range(2):
        p = int(fresh.integers(2, 9))
        cases.append(((str(fresh.choice(["allreduce", "allgather", "reduce_scatter",
                                         "broadcast"])), p, p * 2 ** int(fresh.integers(10, 21))),
                      True))
    for (collective, p, nbytes), drawn in cases:
        seconds = simulate_collective(collective, p, nbytes, network)
        algbw = nbytes / seconds
        factor = busbw_factor(collective, p)
        got = bus_bandwidth(collective, p, nbytes, seconds)
        what = (f"bus_bandwidth({collective!r}, p={p}, nbytes={nbytes}, "
                f"seconds={seconds!r})")
        value = as_float(got, what)
        ratio = value / algbw if algbw else float("nan")
        if drawn and not np.isclose(value, algbw * factor, rtol=1e-9, atol=0.0):
            raise Wrong(f"{what} (a case drawn afresh for this check) returned {value:.6g} B/s, "
                        f"{ratio:.4g} × algbw = S/t; that is not nccl-tests' busbw for "
                        f"{collective} on {p} ranks. The factor is the bytes an optimal "
                        f"{collective} sends through each rank's port, as a multiple of S.")
        expect_close(value, algbw * factor, what,
                     f"(The time is a simulated {collective} on a 12.5 GB/s network.) "
                     f"algbw = S/t = {algbw:.6g} B/s; your answer is {ratio:.4g} × algbw, "
                     f"nccl-tests uses {factor:.4g} × for {collective} on {p} ranks: the "
                     f"bytes an optimal algorithm sends through each rank's port, as a "
                     f"multiple of S.", unit="B/s")
        measured.append((collective, p, nbytes, value))
    collective, p, nbytes, value = measured[0]
    return (f"a ring {collective} of {nbytes / 2 ** 20:g} MiB on {p} simulated ranks reaches "
            f"busbw {value / 1e9:.3g} GB/s of the link's 12.5 GB/s")


# --- 2.8 ----------------------------------------------------------------------------------

CANDIDATES = ("recursive_doubling", "ring", "halving_doubling")

# (p, nbytes, alpha, beta, gamma). Powers of two and not, short and long vectors; in the
# cases marked * the closed forms of `cost` pick the wrong algorithm (they leave out folding).
SELECTOR_CASES = [(8, 512, 3e-6, 1e-10, 2e-11),             # short: recursive doubling
                  (8, 1 << 22, 3e-6, 1e-10, 2e-11),          # long, 2^k: halving–doubling
                  (6, 1 << 20, 3e-6, 1e-10, 2e-11),          # * long, not 2^k: ring
                  (12, 3 << 18, 1e-6, 4e-11, 1e-11),         # * ring
                  (5, 40_000, 1e-5, 1e-9, 0.0),              # * ring
                  (6, 512, 3e-6, 1e-10, 2e-11),              # short, not 2^k: recursive doubling
                  (12, 512, 1e-6, 4e-11, 1e-11)]             # short, not 2^k: recursive doubling


def measured_allreduce_times(p: int, nbytes: int, alpha: float, beta: float,
                             gamma: float) -> dict:
    """Simulated time (s) of each candidate all-reduce on AlphaBeta(alpha, beta, gamma)."""
    network = AlphaBeta(alpha, beta, gamma)
    return {name: simulate_allreduce(p, nbytes, network, name) for name in CANDIDATES}


@checker("2.8", "tune by measuring")
def check_pick_allreduce(pick_allreduce):
    for p, nbytes, alpha, beta, gamma in SELECTOR_CASES:
        what = (f"pick_allreduce(p={p}, nbytes={nbytes}, alpha={alpha:g}, beta={beta:g}, "
                f"gamma={gamma:g})")
        got = pick_allreduce(p, nbytes, alpha, beta, gamma)
        if got is None:
            raise Wrong(f"{what} returned None; did you forget a `return`?")
        if not isinstance(got, str) or got not in CANDIDATES:
            raise Wrong(f"{what} returned {got!r}; return one of the names "
                        f"{', '.join(repr(c) for c in CANDIDATES)}.")
        times = measured_allreduce_times(p, nbytes, alpha, beta, gamma)
        best = min(times, key=times.get)
        if times[got] > times[best] * (1 + _TIME_RTOL):
            listed = ", ".join(f"{name} {t * 1e6:.4g} µs" for name, t in times.items())
            folding = ""
            if p & (p - 1) and best == "ring":
                folding = (f" p = {p} is not a power of two: recursive doubling and "
                           f"halving–doubling first fold the extra ranks in and at the end "
                           f"hand them their share of the result, steps the closed forms of "
                           f"`cost` leave out.")
            elif p & (p - 1):
                folding = (f" p = {p} is not a power of two, yet {best!r} wins: its folding "
                           f"steps cost extra messages too, but of a {nbytes}-byte vector — "
                           f"could a rule that looks only at p, not at what a step costs at "
                           f"this size, have chosen this?")
            raise Wrong(f"{what} returned {got!r}, but {best!r} is faster in the simulator "
                        f"({listed}).{folding} Time each candidate with dsml.run on "
                        f"AlphaBeta(alpha, beta, gamma) and keep the fastest, as real tuners "
                        f"do.")
    return "your choices are the fastest in the simulator, including where the closed forms " \
           "choose wrongly"
