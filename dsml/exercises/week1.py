"""Plumbing (hand-written): the checkers of week 1's exercises (foundations and communication).

Each checker calls the learner's function on inputs different from the worked example in
the notebook and raises `Wrong` with a hint that says what was tried, what came back, what was
expected and what to reconsider. Where the expected values would add up to a table of answers
(1.1, 1.6: closed forms with no simulation behind them), a hint says instead which way the
answer is off and which plausible mistake gives that number, phrased as a possibility. Where the answer is a claim about the simulator
(a message across a two-level network, the shifted exchange, the ring pass on a star, the
torus bisection), the checker measures the truth with the engines and topologies of the
lower layers rather than assuming a formula.

This module imports from the lower layers only (`dsml.sim`, `dsml.net`, `dsml.comm`), never
the top-level `dsml` package, which sits above it.
"""
from __future__ import annotations

import functools
import math
import numbers

import numpy as np

from dsml.comm.api import Comm, RankError, Recv, SizeOnly
from dsml.comm.run import run
from dsml.exercises import (Wrong, _not_implemented, as_float, checker, expect_close,
                            expect_rank_program, fresh_rng)
from dsml.net.alphabeta import AlphaBeta
from dsml.net.topology import bisection_bandwidth, star, torus2d, two_level
from dsml.sim import DeadlockError


def _store_and_forward_time(nbytes, hops, alpha, beta):
    """h(α + nβ) s: a whole message crosses each of `hops` links in turn."""
    return hops * (alpha + nbytes * beta)


def _pipelined_time(nbytes, hops, chunks, alpha, beta):
    """(h + k − 1)(α + nβ/k) s: k equal chunks pipelined over `hops` links."""
    return (hops + chunks - 1) * (alpha + nbytes * beta / chunks)


# --- 1.1 ----------------------------------------------------------------------------------

@checker("1.1", "size for a fraction of the peak")
def check_size_for_fraction(size_for_fraction):
    # The first case tells the plausible mistakes apart (at f = 0.9: f·α/β, (1 − f)/f·α/β and
    # α/β all differ from the answer and from each other); f = 0.5 comes last, since there
    # f/(1 − f) = (1 − f)/f = 1. A hint says what the returned size achieves and which way it
    # is off, never the size expected: the hints cannot be collected into a table of answers.
    for alpha, beta, fraction in [(3e-6, 8e-11, 0.9), (1.5e-4, 1e-9, 0.25),
                                  (2e-6, 5e-11, 0.5)]:
        what = f"size_for_fraction(alpha={alpha:g}, beta={beta:g}, fraction={fraction:g})"
        got = as_float(size_for_fraction(alpha, beta, fraction), what)
        expected = fraction / (1 - fraction) * alpha / beta
        if np.isclose(got, expected, rtol=1e-9, atol=0.0):
            continue
        solve = "Set n/(α + nβ) = f/β and solve for n: collect the terms in n on one side."
        if not (got > 0 and math.isfinite(got)):
            raise Wrong(f"{what} returned {got:.6g} B; a message size is a finite number > 0 "
                        f"(and a larger share of the peak needs a larger message). {solve}")
        achieved = got / (alpha + got * beta) * beta
        way = "too small" if got < expected else "too large"
        hint = (f"{what} returned {got:.6g} B. At that size the bandwidth n/(α + nβ) is "
                f"{achieved:.4g} of the peak 1/β, not {fraction:g}: your size is {way}. ")
        if np.isclose(got, fraction * alpha / beta, rtol=1e-9):
            hint += ("It is f·α/β: perhaps the nβ in the denominator was dropped, or moved "
                     "to the other side without its factor f? ")
        elif np.isclose(got, (1 - fraction) / fraction * alpha / beta, rtol=1e-9):
            hint += "It looks as if f and 1 − f changed places somewhere in the solving. "
        elif np.isclose(got, alpha / beta, rtol=1e-9):
            hint += "It is n½ = α/β, the answer for f = ½ only: where does f enter? "
        raise Wrong(hint + solve)


# --- 1.2 ----------------------------------------------------------------------------------

@checker("1.2", "when pipelining pays")
def check_pipelining_break_even(pipelining_break_even):
    fresh = fresh_rng()       # two more cases, drawn afresh for every check
    cases = [(case, False) for case in [(4, 8, 3e-6, 1e-10), (2, 2, 1e-5, 1e-9),
                                        (7, 3, 2e-6, 5e-11)]]
    cases += [((int(fresh.integers(2, 9)), int(fresh.integers(2, 17)),
                float(f"{10 ** fresh.uniform(-6.5, -4.5):.3g}"),
                float(f"{10 ** fresh.uniform(-11, -9):.3g}")), True) for _ in range(2)]
    for (hops, chunks, alpha, beta), drawn in cases:
        what = (f"pipelining_break_even(hops={hops}, chunks={chunks}, alpha={alpha:g}, "
                f"beta={beta:g})")
        got = as_float(pipelining_break_even(hops, chunks, alpha, beta), what)
        expected = chunks * alpha / ((hops - 1) * beta)
        if drawn:             # say the inputs, not the answer
            what += " (a case drawn afresh for this check)"
        derive = ("Write store-and-forward h(α + nβ) and pipelined (h + k − 1)(α + nβ/k), "
                  "subtract, and solve for the n at which they are equal.")
        shown = "" if drawn else f", expected {expected:.6g} B"
        if not got > 0:
            raise Wrong(f"{what} returned {got:.6g} B{shown}: a message "
                        f"size is > 0 (with h ≥ 2 and k ≥ 2 a tiny message always loses by "
                        f"pipelining: it pays α more often). {derive}")
        # Just above the returned size pipelining must win, just below it must lose.
        for side, n, should_win in [("above", got * (1 + 1e-6), True),
                                    ("below", got * (1 - 1e-6), False)]:
            piped = _pipelined_time(n, hops, chunks, alpha, beta)
            whole = _store_and_forward_time(n, hops, alpha, beta)
            if (piped < whole) != should_win:
                verdict = "is still slower" if should_win else "already wins"
                raise Wrong(f"{what} returned {got:.6g} B{shown}: at "
                            f"n = {n:.9g} B, just {side} your answer, pipelining {verdict} "
                            f"(pipelined {piped:.9g} s, store-and-forward {whole:.9g} s, "
                            f"difference {piped - whole:+.3g} s). {derive}")
        expect_close(got, expected, what, derive, unit="B", drawn=drawn)


# --- 1.3 ----------------------------------------------------------------------------------

def _one_message(comm, nbytes, dst):
    """Rank 0 sends one n-byte message to rank `dst`; every other rank idles."""
    if comm.rank == 0:
        yield comm.send(dst, SizeOnly(nbytes))
    elif comm.rank == dst:
        yield comm.recv(0)


def simulate_two_level_message(nodes: int, per_node: int, nbytes: int, intra_latency: float,
                               intra_bandwidth: float, inter_latency: float,
                               inter_bandwidth: float) -> float:
    """Simulated time (s) of one n-byte message from rank 0 to rank `per_node` (the first
    rank of the next machine) on `two_level(nodes, per_node, ...)`, store-and-forward."""
    network = two_level(nodes, per_node, intra_latency, intra_bandwidth, inter_latency,
                        inter_bandwidth)
    result = run(_one_message, nodes * per_node, engine="sim", network=network,
                 args=(nbytes, per_node), trace=False)
    return result.time


@checker("1.3", "across a two-level network")
def check_two_level_time(two_level_time):
    measured = []
    # (nodes, per_node, nbytes, intra latency s, intra B/s, inter latency s, inter B/s)
    for nodes, per_node, nbytes, ai, bi, ao, bo in [
            (3, 2, 4_096, 2e-7, 300e9, 3e-6, 25e9),
            (4, 3, 250_000, 5e-7, 200e9, 2e-6, 12.5e9),
            (2, 1, 10_000_000, 1e-6, 50e9, 1e-5, 5e9)]:
        simulated = simulate_two_level_message(nodes, per_node, nbytes, ai, bi, ao, bo)
        expect_close(two_level_time(nbytes, ai, bi, ao, bo), simulated,
                     f"two_level_time(nbytes={nbytes}, intra_latency={ai:g}, "
                     f"intra_bandwidth={bi:g}, inter_latency={ao:g}, inter_bandwidth={bo:g})",
                     f"(The expected time was measured by sending the message from rank 0 to "
                     f"rank {per_node} of two_level({nodes}, {per_node}, ...) in the "
                     f"simulator.) List the links on the route, from the sending rank to its "
                     f"machine's switch and on to the other rank; each hop costs its own "
                     f"latency + n/bandwidth, and store-and-forward adds them up.", unit="s")
        measured.append((nodes, per_node, nbytes, simulated))
    nodes, per_node, nbytes, simulated = measured[0]
    return (f"the simulator sent {nbytes} B across two_level({nodes}, {per_node}, ...) in "
            f"{simulated * 1e6:.6g} µs, as you predicted")


# --- 1.4 ----------------------------------------------------------------------------------

@checker("1.4", "optimal chunk count")
def check_optimal_chunks(optimal_chunks):
    cases = [(1 << 24, 5, 2e-5, 1e-10),     # k* ≈ 18.3
             (1_000_000, 1, 1e-6, 1e-9),     # one hop: nothing to overlap, k = 1
             (1_000_000, 3, 1e-6, 1e-9),     # k* ≈ 44.7
             (1_000, 8, 1e-5, 1e-9),         # latency-bound: k = 1
             (61_000, 2, 1e-5, 1e-9)]        # k* ≈ 2.47, yet k = 3 beats k = 2
    for nbytes, hops, alpha, beta in cases:
        what = f"optimal_chunks(nbytes={nbytes}, hops={hops}, alpha={alpha:g}, beta={beta:g})"
        got = optimal_chunks(nbytes, hops, alpha, beta)
        if got is None:
            raise Wrong(f"{what} returned None; did you forget a `return`?")
        if isinstance(got, (bool, np.bool_)) or not isinstance(got, numbers.Real) \
                or not float(got).is_integer():
            raise Wrong(f"{what} returned {got!r}; a number of chunks is a whole number. "
                        f"The continuous optimum is rarely an integer: compare the times of "
                        f"the integers on either side of it and return the better one.")
        k = int(got)
        if k < 1:
            raise Wrong(f"{what} returned {k}; a message is cut into at least 1 chunk.")
        continuous = math.sqrt((hops - 1) * nbytes * beta / alpha)
        bound = int(4 * continuous) + 16
        times = {j: _pipelined_time(nbytes, hops, j, alpha, beta) for j in range(1, bound + 1)}
        best_k = min(times, key=times.get)
        best = times[best_k]
        mine = _pipelined_time(nbytes, hops, k, alpha, beta)
        if mine > best * (1 + 1e-12):
            raise Wrong(f"{what} returned {k} (pipelined time {mine:.6g} s), but k = {best_k} "
                        f"takes {best:.6g} s. Write T(k) = (h + k − 1)(α + nβ/k), set "
                        f"dT/dk = 0, and mind which terms depend on k; then round to the "
                        f"better neighbouring integer, never below 1.")


# --- 1.5 ----------------------------------------------------------------------------------

def shifted_exchange(comm, x):
    """The checker's all-to-all: in step i = 1 … p−1, send x to rank (r + i) mod p and
    receive from rank (r − i) mod p, in one sendrecv. Returns what arrived, by source."""
    p, r = comm.size, comm.rank
    received = {}
    for i in range(1, p):
        received[(r - i) % p] = yield comm.sendrecv((r + i) % p, x, (r - i) % p)
    return received


def simulate_shifted_exchange(p: int, nbytes: int, alpha: float, beta: float) -> float:
    """Simulated time (s) of `shifted_exchange` with n-byte messages on AlphaBeta."""
    result = run(shifted_exchange, p, engine="sim", network=AlphaBeta(alpha, beta),
                 args=(SizeOnly(nbytes),), trace=False)
    return result.time


@checker("1.5", "shifted exchange")
def check_shifted_exchange_time(shifted_exchange_time):
    measured = []
    for p, nbytes, alpha, beta in [(5, 250_000, 4e-6, 1e-10), (2, 4_096, 2e-6, 2.5e-10),
                                   (8, 65_536, 1e-5, 1e-9), (3, 0, 3e-6, 1e-10)]:
        simulated = simulate_shifted_exchange(p, nbytes, alpha, beta)
        expect_close(shifted_exchange_time(p, nbytes, alpha, beta), simulated,
                     f"shifted_exchange_time(p={p}, nbytes={nbytes}, alpha={alpha:g}, "
                     f"beta={beta:g})",
                     "(The expected time was measured by running the shifted exchange on "
                     "AlphaBeta in the simulator.) Count the steps, and ask in each step "
                     "which ports every rank uses: does any port carry two messages at "
                     "once, and does each message pay its own α?", unit="s")
        measured.append((p, simulated))
    p, simulated = measured[0]
    return (f"the simulator ran the exchange on {p} ranks in {simulated * 1e6:.6g} µs, "
            f"as you predicted")


# --- 1.6 ----------------------------------------------------------------------------------

def _loggp_time(nbytes, L, o, g, G):
    return o + (nbytes - 1) * G + L + o


@checker("1.6", "one message in LogGP")
def check_loggp_time(loggp_time):
    # The first case gives every single-term mistake its own difference: o = 1.5 µs,
    # L = 5 µs, g = 4 µs, 2o = 3 µs, G = 0.2 ns, (n − 1)G ≈ 0.2 µs.
    for nbytes, L, o, g, G in [(1024, 5e-6, 1.5e-6, 4e-6, 2e-10),
                               (65_536, 2e-6, 3e-7, 1e-6, 1e-9),
                               (1, 8e-6, 1e-6, 2e-6, 5e-10)]:
        what = f"loggp_time(nbytes={nbytes}, L={L:g}, o={o:g}, g={g:g}, G={G:g})"
        got = as_float(loggp_time(nbytes, L, o, g, G), what)
        expected = _loggp_time(nbytes, L, o, g, G)
        if np.isclose(got, expected, rtol=1e-9, atol=0.0):
            continue
        missing = expected - got              # > 0: a cost left out; < 0: one too many
        named = [(o, "one CPU overhead o is missing: does the receiving CPU pay one too?"),
                 (2 * o, "no CPU overhead is counted: what do sending and receiving cost "
                         "the processors?"),
                 (L, "the latency L is missing: how long does the last byte fly?"),
                 ((nbytes - 1) * G, "the bytes that follow the first are not counted: "
                                    "when does the last one leave?"),
                 (-G, "one G too many: does the first byte wait for a gap per byte?"),
                 (-g, "the gap g is counted: does a single message wait for it?"),
                 (-L, "L is counted twice: the bytes fly in a pipeline, not one after "
                      "another")]
        guesses = [text for amount, text in named
                   if amount != 0 and np.isclose(missing, amount, rtol=1e-6)]
        way = "short" if got < expected else "long"
        hint = (f"{what} returned {got:.6g} s, which is too {way}. "
                + (f"Perhaps {' Or perhaps '.join(guesses)} " if guesses else ""))
        raise Wrong(hint + "Follow one message from the sending CPU to the receiving CPU: "
                    "what does each CPU spend, when has the last byte left, and how long "
                    "does a byte fly? Which parameter matters only between two messages?")


# --- 1.7 ----------------------------------------------------------------------------------

def _rank_program_result(program, world_size: int, network, context: str):
    """Run a learner's rank program; turn a deadlock or failure into Wrong (in context)."""
    try:
        return run(program, world_size, engine="sim", network=network, trace=False)
    except DeadlockError as deadlock:
        waits = [process.waiting_for for process in deadlock.waiting]
        if len(waits) == world_size and all(isinstance(w, Recv) for w in waits):
            now = deadlock.waiting[0].sim.now
            raise Wrong(f"{context}: the simulator found a deadlock at t={now:.6g} s — every "
                        f"rank waits to receive before it has sent, so no message is ever "
                        f"sent. Use comm.sendrecv(right, x, left), or send before receiving "
                        f"(sends are eager: they do not wait for the receive).") from None
        first = str(deadlock).splitlines()[0].rstrip(":")
        raise Wrong(f"{context}: your rank program deadlocked ({first} "
                    f"{'; '.join(str(deadlock).splitlines()[1:3]).strip()}). Every receive "
                    f"needs a matching send from the rank it names.") from None
    except RankError as failure:
        if _not_implemented(failure):   # an untouched stub: let the harness say so
            raise
        raise Wrong(f"{context}: your rank program failed: "
                    f"{str(failure).splitlines()[0].rstrip(':')}") from None


def _ring_pass_diagnosis(p: int, rounds: int, rank: int, origin) -> str:
    """Which plausible mistakes move an array from rank `origin` to `rank` in `rounds` rounds
    on p ranks: named as possibilities, since on some (p, rounds) two give the same shift."""
    if origin is None:
        return ""
    shift = (rank - origin) % p
    mistakes = [((rounds - 1) % p, "the loop ran one round short (does it run `rounds` times?)"),
                ((-rounds) % p, "the arrays went the wrong way (to the left, not the right)"),
                ((rounds + 1) % p, "the loop ran one round too many"),
                (0, "each rank kept its own array (is what arrives kept?)")]
    matches = [text for moved, text in mistakes if moved == shift]
    if not matches:
        return ""
    return "Possibly " + "; or ".join(matches) + ". "


@checker("1.7", "ring pass")
def check_ring_pass(ring_pass):
    network = AlphaBeta(alpha=1e-6, beta=1e-9)
    # p = 5, two rounds first: one round short (shift 1), the wrong direction (shift 3)
    # and keeping one's own array (shift 0) then each end on a different array.
    for p, rounds in [(5, 2), (3, 2), (5, 1), (5, 3), (2, 1), (3, 4), (5, 7)]:
        start = [np.arange(4.0) + 10.0 * rank for rank in range(p)]
        context = f"ring_pass with p={p} ranks and rounds={rounds} (rank r starts with " \
                  f"np.arange(4.0) + 10·r)"
        # A rank program must be a generator function; say so before running it.
        expect_rank_program(ring_pass(Comm(0, p), start[0].copy(), rounds),
                            "ring_pass(comm, x, rounds)",
                            "got = yield comm.sendrecv(right, x, left)")

        def program(comm, start=start, rounds=rounds):
            return (yield from ring_pass(comm, start[comm.rank].copy(), rounds))

        values = _rank_program_result(program, p, network, context).values
        for rank in range(p):
            expected = start[(rank - rounds) % p]
            got = values[rank]
            if got is None:
                raise Wrong(f"{context}: rank {rank} returned None; `return` what the rank "
                            f"holds after the last round.")
            if not (isinstance(got, np.ndarray) and got.shape == expected.shape
                    and np.array_equal(got, expected)):
                origin = next((r for r in range(p) if isinstance(got, np.ndarray)
                               and got.shape == start[r].shape
                               and np.array_equal(got, start[r])), None)
                source = "" if origin is None else f", the array that started on rank {origin}"
                raise Wrong(f"{context}: rank {rank} ended with {got!r}{source}; expected "
                            f"the array that started on rank {(rank - rounds) % p}. "
                            + _ring_pass_diagnosis(p, rounds, rank, origin)
                            + "Each round a rank sends to its right neighbour (rank + 1) mod p "
                            "and keeps what arrives from its left neighbour (rank − 1) mod p.")


# --- 1.8 ----------------------------------------------------------------------------------

def reference_ring_pass(comm, x, rounds):
    """The checker's own ring pass: each round, send to the right, receive from the left."""
    right = (comm.rank + 1) % comm.size
    left = (comm.rank - 1) % comm.size
    for _ in range(rounds):
        x = yield comm.sendrecv(right, x, left)
    return x


def simulate_ring_pass_on_star(p: int, nbytes: int, rounds: int, overhead: float,
                               latency: float, bandwidth: float, chunks: int) -> float:
    """Simulated time (s) of `reference_ring_pass` with n-byte messages on
    star(p, latency, bandwidth, overhead=overhead) cutting messages into `chunks` pieces."""
    network = star(p, latency=latency, bandwidth=bandwidth,
                   overhead=overhead).with_chunks(chunks)
    result = run(reference_ring_pass, p, engine="sim", network=network,
                 args=(SizeOnly(nbytes), rounds), trace=False)
    return result.time


# (p, nbytes, rounds, overhead s, latency s per hop, bandwidth B/s, chunks). k divides n in
# every case: the simulator makes the first n mod k chunks one byte larger, and then a round
# takes ⌈n/k⌉β − nβ/k longer than the closed form the exercise asks for. Overheads and hop
# latencies are section 11's cut-through values (1 µs, 0.3 µs) and neighbours, with o = 0 once.
RING_PASS_ON_STAR_CASES = [(5, 120_000, 3, 1e-6, 0.3e-6, 25e9, 4),
                           (2, 4_096, 2, 0.0, 1e-6, 10e9, 1),
                           (6, 1_000_000, 2, 1e-6, 0.3e-6, 12.5e9, 16),
                           (3, 30_000, 5, 2e-6, 0.5e-6, 5e9, 3)]


@checker("1.8", "ring pass through a switch")
def check_predict_ring_pass_time(predict_ring_pass_time):
    measured = []
    for p, nbytes, rounds, overhead, latency, bandwidth, chunks in RING_PASS_ON_STAR_CASES:
        simulated = simulate_ring_pass_on_star(p, nbytes, rounds, overhead, latency,
                                               bandwidth, chunks)
        expect_close(predict_ring_pass_time(p, nbytes, rounds, overhead, latency, bandwidth,
                                            chunks),
                     simulated,
                     f"predict_ring_pass_time(p={p}, nbytes={nbytes}, rounds={rounds}, "
                     f"overhead={overhead:g}, latency={latency:g}, bandwidth={bandwidth:g}, "
                     f"chunks={chunks})",
                     "(The expected time was measured by running a ring pass with sendrecv "
                     "on the star in the simulator.) Follow one message: how many links does "
                     "it cross, and how do k chunks flow over them? Is the overhead paid per "
                     "message, per chunk or per hop? Then ask whether the p messages of a "
                     "round share any directed link, and how many rounds there are.", unit="s")
        measured.append((p, chunks, simulated))
    p, chunks, simulated = measured[0]
    return (f"the simulator ran the ring pass on star({p}) with {chunks} chunks in "
            f"{simulated * 1e6:.6g} µs, as you predicted")


# --- 1.9 ----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def torus_bisection_truth(rows: int, cols: int) -> int:
    """Links cut by a minimum bisection of a rows × cols torus, by trying every split."""
    topology = torus2d(rows, cols, bandwidth=1.0)
    return round(bisection_bandwidth(topology, max_hosts=max(16, rows * cols)))


@checker("1.9", "torus bisection", builds=("dsml.net.topology.bisection_bandwidth",))
def check_torus_bisection_links(torus_bisection_links):
    # 3 × 6 has 18 hosts, beyond bisection_bandwidth's default limit of 16; it takes ~0.1 s
    # and is the smallest case where half the hosts (9) differs from the answer (6).
    # Every torus the exercise covers (the longer side even) that an exhaustive split can
    # measure has at most 18 hosts: too few to draw fresh cases from. Instead only the first
    # case's hint shows the expected count, so answers copied from hints cannot pass.
    for index, (rows, cols) in enumerate([(3, 4), (4, 4), (4, 3), (3, 6), (6, 3)]):
        expected = torus_bisection_truth(rows, cols)
        what = f"torus_bisection_links(rows={rows}, cols={cols})"
        got = as_float(torus_bisection_links(rows, cols), what)
        if got != expected and index > 0:
            raise Wrong(f"{what} returned {got:g}, not the links that the cheapest split of "
                        f"the {rows * cols} hosts cuts (trying every split, "
                        f"dsml.net.bisection_bandwidth, finds it). See "
                        f"the torus as rings: a straight cut across one dimension severs every "
                        f"ring running along it, each ring twice (once more at the wrap-around "
                        f"link). Count links, not hosts, and ask which dimension is cheaper to "
                        f"cut.")
        if got != expected:
            raise Wrong(f"{what} returned {got:g}, expected {expected}: trying every split "
                        f"of the {rows * cols} hosts into two halves "
                        f"(dsml.net.bisection_bandwidth) finds that the cheapest cuts "
                        f"{expected} links. See the torus as rings: a straight cut across one "
                        f"dimension severs every ring running along it, each ring twice "
                        f"(once more at the wrap-around link). Count links, not hosts, and ask "
                        f"which dimension is cheaper to cut.")
    return "dsml.net.bisection_bandwidth tried every split and agrees"
