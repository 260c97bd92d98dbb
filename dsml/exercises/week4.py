"""Plumbing (hand-written): the checkers of week 4's exercises (parameter servers and asynchrony).

Each checker calls the learner's function on inputs different from the worked example in
the notebook and raises `Wrong` with a hint that says what was tried, what was expected,
what came back and what to reconsider. The bytes into the busiest server are measured on the
simulator (section 2's `ps_exchange`, read from the trace); staleness from a log, the expected
synchronous step with stragglers and the SSP admission rule are held against exact references
(4.1–4.4), and so is the expected step with backup workers (4.7, the (W − b)-th fastest
finish). The sparse logistic step is held against the same step
computed on dense vectors (the gradient of the log-loss on a copy of w: every coordinate, so
that an untouched one that moved shows); the conflict probability against the exact count of
pairs of k-subsets that share nothing, C(d − k, k) / C(d, k), and, in the hint of a wrong
answer, against a seeded simulation that draws examples with `dsml.hogwild`'s own generator.

The exercise numbers are the constants below: when exercises on earlier sections of the week
come before these, change the numbers here (and in the notebook's headings and `check` calls);
the tests and solutions refer to the constants and the answers' names.

This module imports from the lower layers only (`dsml.comm`, `dsml.net`, `dsml.hogwild`,
`dsml.param_server`), never the top-level `dsml`
package, which sits above it.
"""
from __future__ import annotations

import math

import numpy as np

from dsml.comm.run import run
from dsml.exercises import Wrong, as_float, checker
from dsml.hogwild import distinct_coordinates
from dsml.net.alphabeta import AlphaBeta
from dsml.param_server import ps_exchange

SPARSE_STEP = "4.5"     # the sparse SGD step of logistic regression (section 5)
CONFLICT = "4.6"        # the probability that two sparse examples conflict (section 5)
BACKUP = "4.7"          # the expected step with backup workers (section 3)


# --- the sparse SGD step --------------------------------------------------------------------

# (d, coordinates of the example — distinct, not sorted —, label, lr): one touching a single
# coordinate, one touching all of them, and labels of both kinds.
STEP_CASES = [(9, [7, 2, 4], 1, 0.5), (6, [3, 0, 5, 1, 4, 2], 0, 0.2), (15, [11], 1, 1.5),
              (12, [5, 9, 0, 10], 0, 0.8)]


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def logistic_step_dense(w, idx, x, y, lr):
    """The truth: w − lr·(σ(x̃·w) − y)·x̃ with x̃ the example as a dense vector of length d."""
    dense = np.zeros_like(w)
    dense[idx] = x
    return w - lr * (_sigmoid(float(dense @ w)) - y) * dense


@checker(SPARSE_STEP, "the sparse SGD step of logistic regression")
def check_sparse_logistic_step(sparse_logistic_step):
    rng = np.random.default_rng(4001)
    for d, coordinates, y, lr in STEP_CASES:
        idx = np.array(coordinates)
        x = rng.standard_normal(len(idx))
        w = 0.5 * rng.standard_normal(d)
        expected = logistic_step_dense(w, idx, x, y, lr)
        mine = w.copy()
        call = (f"sparse_logistic_step(w of length {d}, idx={coordinates}, "
                f"x={np.round(x, 3).tolist()}, y={y}, lr={lr})")
        returned = sparse_logistic_step(mine, idx.copy(), x.copy(), y, lr)
        untouched = np.setdiff1d(np.arange(d), idx)
        if np.array_equal(mine, w):
            also = ""
            if isinstance(returned, np.ndarray) and returned.shape == w.shape and \
                    np.allclose(returned, expected, rtol=1e-12, atol=1e-15):
                also = (" It returned the right new w — but as a new array: the workers of "
                        "Hogwild! share one array, so the step must write into it.")
            raise Wrong(f"{call} left w unchanged.{also} Update w in place: `w[idx] -= …` "
                        f"writes through; `wi = w[idx]` with an index array is a copy, and "
                        f"changing the copy changes nothing in w.")
        if not np.array_equal(mine[untouched], w[untouched]):
            moved = untouched[mine[untouched] != w[untouched]]
            raise Wrong(f"{call} changed coordinates {moved.tolist()}, which the example does "
                        f"not touch: its gradient is zero there, and a Hogwild! step must leave "
                        f"them alone (writing them would collide with every other worker).")
        got, want = mine[idx], expected[idx]
        if np.allclose(got, want, rtol=1e-12, atol=1e-15):
            continue
        step = want - w[idx]
        if np.allclose(got - w[idx], -step, rtol=1e-9, atol=1e-15):
            raise Wrong(f"{call} stepped the wrong way: w[idx] moved by "
                        f"{np.round(got - w[idx], 4).tolist()}, expected "
                        f"{np.round(step, 4).tolist()}. The gradient of the log-loss with respect "
                        f"to z = x·w is σ(z) − y, and SGD subtracts lr × gradient.")
        residual = _sigmoid(float(x @ w[idx])) - y
        if np.allclose(got, w[idx] - lr * residual, rtol=1e-9, atol=1e-15):
            raise Wrong(f"{call}: every touched coordinate moved by the same amount, "
                        f"{-lr * residual:.4g}. By the chain rule ∂z/∂w_j = x_j, so coordinate j's "
                        f"gradient is (σ(z) − y)·x_j: multiply by the example's values.")
        raise Wrong(f"{call}: w[idx] became {np.round(got, 4).tolist()}, expected "
                    f"{np.round(want, 4).tolist()} = w[idx] − lr·(σ(x·w[idx]) − y)·x with "
                    f"σ(z) = 1/(1 + e^(−z)).")
    return "w[idx] −= lr·(σ(x·w[idx]) − y)·x, in place, nothing else touched"


# --- the probability of a conflict ----------------------------------------------------------

# (d, k): sparse, middling, more than half of d (a conflict is certain), a single coordinate,
# and a large d where k²/d and the exact answer differ visibly.
CONFLICT_CASES = [(1000, 10), (50, 7), (12, 7), (20, 1), (100_000, 300)]


def conflict_truth(d: int, k: int) -> float:
    """1 − C(d − k, k) / C(d, k): of the C(d, k) equally likely coordinate sets of the second
    example, C(d − k, k) avoid the first's k coordinates (0 when 2k > d)."""
    return 1.0 - math.comb(d - k, k) / math.comb(d, k)


def simulated_conflicts(d: int, k: int, pairs: int = 20_000, seed: int = 4002) -> float:
    """The share of `pairs` random pairs of examples (drawn as dsml.hogwild draws them) that
    share a coordinate."""
    rng = np.random.default_rng(seed)
    first = distinct_coordinates(pairs, d, k, rng)
    second = distinct_coordinates(pairs, d, k, rng)
    shared = (first[:, :, None] == second[:, None, :]).any(axis=(1, 2))
    return float(shared.mean())


@checker(CONFLICT, "the probability that two sparse examples conflict")
def check_conflict_probability(conflict_probability):
    for d, k in CONFLICT_CASES:
        call = f"conflict_probability(d={d}, k={k})"
        got = as_float(conflict_probability(d, k), call)
        expected = conflict_truth(d, k)
        if math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-15):
            continue
        if not 0.0 <= got <= 1.0:
            extra = (" That is k²/d, the expected *number* of shared coordinates — a mean, "
                     "which can exceed 1; a probability cannot."
                     if math.isclose(got, k * k / d, rel_tol=1e-9) else "")
            raise Wrong(f"{call} returned {got:.6g}, which is not a probability.{extra} "
                        f"Expected {expected:.6g}.")
        simulated = simulated_conflicts(d, k) if k * k <= d and k <= 50 else None
        seen = (f" (a seeded simulation of 20,000 random pairs: {simulated:.4f})"
                if simulated is not None else "")
        if math.isclose(got, 1.0 - expected, rel_tol=1e-9, abs_tol=1e-15):
            hint = ("that is the probability that they share *nothing*; a conflict is the "
                    "complement.")
        elif math.isclose(got, k * k / d, rel_tol=1e-9):
            hint = ("that is k²/d, the expected number of shared coordinates: it counts a pair "
                    "sharing two coordinates twice, so it overestimates the probability of at "
                    "least one.")
        elif math.isclose(got, 1.0 - (1.0 - k / d) ** k, rel_tol=1e-9):
            hint = ("that treats the second example's k coordinates as k independent draws, "
                    "each missing the first example with probability 1 − k/d. They are "
                    "distinct: once one has missed, one coordinate fewer is left to choose from. "
                    "Count the k-subsets that avoid the first example's coordinates.")
        else:
            hint = ("count the second example's possible coordinate sets, C(d, k), and those "
                    "that avoid the first example's k coordinates.")
        raise Wrong(f"{call} returned {got:.6g}, expected {expected:.6g}{seen}: {hint}")
    return "1 − C(d − k, k)/C(d, k): about k²/d when k²/d is small, 1 once 2k > d"


# --- parameter servers (sections 2–4) -------------------------------------------------------

# (workers, servers, nbytes): shards that divide evenly and shards that do not.
BOTTLENECK_CASES = [(3, 2, 1001), (8, 3, 1000), (5, 5, 7), (1, 1, 10), (6, 4, 2), (12, 5, 123_457)]


def measured_busiest_bytes(workers: int, servers: int, nbytes: int) -> int:
    """Bytes into the busiest server in one step of ps_exchange, read from the simulator's trace."""
    result = run(ps_exchange, servers + workers, network=AlphaBeta(1e-6, 1e-9),
                 args=(servers, nbytes))
    return max(sum(r.nbytes for r in result.trace.of_rank(s) if r.op == "recv")
               for s in range(servers))


@checker("4.1", "the bytes into the busiest server")
def check_busiest_server_bytes(busiest_server_bytes):
    for workers, servers, nbytes in BOTTLENECK_CASES:
        expected = measured_busiest_bytes(workers, servers, nbytes)
        call = f"busiest_server_bytes(workers={workers}, servers={servers}, nbytes={nbytes})"
        got = as_float(busiest_server_bytes(workers, servers, nbytes), call)
        if got == expected:
            continue
        if math.isclose(got, workers * nbytes / servers):
            advice = ("Bytes come in whole: the keys are cut as np.array_split cuts them, so the "
                      f"first {nbytes % servers} server(s) own one byte more, ⌈n/S⌉.")
        elif math.isclose(got, 2 * expected):
            advice = "Count what comes in only: the pushes, not the answers going out."
        elif math.isclose(got, workers * nbytes):
            advice = "Each server takes only its own keys' share of every gradient, not all of it."
        elif math.isclose(got, expected / workers):
            advice = "That is one worker's push; every worker pushes to every server each step."
        else:
            advice = ("Follow one server through a step: which ranks send to it, and how much "
                      "of the n bytes does each of them send it? Then take the server that owns "
                      "the most keys.")
        raise Wrong(f"{call} returned {got:g}; the simulator measured {expected} B into the "
                    f"busiest server. {advice}")
    return "matches the bytes the simulator measured, shards even and uneven"


def staleness_reference(events) -> list:
    """Staleness of each apply: the applies (by anyone) since that worker's latest read."""
    applied, read_at, out = 0, {}, []
    for kind, worker in events:
        if kind == "read":
            read_at[worker] = applied
        else:
            out.append(applied - read_at[worker])
            applied += 1
    return out


def staleness_counting_events(events) -> list:
    """A mistake: every event (reads too) since the worker's latest read."""
    read_at, out = {}, []
    for position, (kind, worker) in enumerate(events):
        if kind == "read":
            read_at[worker] = position
        else:
            out.append(position - read_at[worker] - 1)
    return out


def staleness_counting_reads(events) -> list:
    """A mistake: the other workers' reads since the worker's latest read."""
    reads, read_at, out = 0, {}, []
    for kind, worker in events:
        if kind == "read":
            read_at[worker] = reads
            reads += 1
        else:
            out.append(reads - read_at[worker] - 1)
    return out


def staleness_from_first_read(events) -> list:
    """A mistake: the applies since the worker's first read, never refreshed."""
    applied, read_at, out = 0, {}, []
    for kind, worker in events:
        if kind == "read":
            read_at.setdefault(worker, applied)
        else:
            out.append(applied - read_at[worker])
            applied += 1
    return out


def staleness_logs() -> list:
    """Seeded server logs: each worker reads, then applies, then reads again …, interleaved at
    random; workers of different speeds, so some of them fall far behind."""
    logs = []
    for seed, workers, rounds in [(1, 3, 4), (2, 5, 6), (3, 2, 10), (4, 8, 3), (5, 1, 5)]:
        rng = np.random.default_rng(seed)
        weights = rng.uniform(0.2, 1.0, workers)
        next_kind = ["read"] * workers
        left = [2 * rounds] * workers
        events = []
        while any(left):
            alive = [w for w in range(workers) if left[w]]
            p = weights[alive] / weights[alive].sum()
            w = int(rng.choice(alive, p=p))
            events.append((next_kind[w], w))
            next_kind[w] = "apply" if next_kind[w] == "read" else "read"
            left[w] -= 1
        logs.append(events)
    return logs


@checker("4.2", "staleness from a server's log")
def check_staleness_from_log(staleness_from_log):
    for events in staleness_logs():
        expected = staleness_reference(events)
        shown = events if len(events) <= 12 else events[:12] + ["…"]
        call = f"staleness_from_log({shown})"
        got = staleness_from_log(list(events))
        try:
            got = [int(v) for v in got]
        except (TypeError, ValueError):
            raise Wrong(f"{call} returned {got!r}; expected a list of integers, one per apply")
        if got == expected:
            continue
        if len(got) != len(expected):
            raise Wrong(f"{call} returned {len(got)} values for {len(expected)} applies: one "
                        f"staleness per ('apply', worker) event, in order.")
        diff = np.array(got) - np.array(expected)
        if np.all(diff == 1):
            advice = ("Every value is one too large: a worker's own apply is not stale — count "
                      "the applies *before* it since the read, not including it.")
        elif got == staleness_counting_events(events):
            advice = ("These count every event since the worker's read, reads included. A read "
                      "changes no parameter; only applies make what the worker read out of date.")
        elif got == staleness_counting_reads(events):
            advice = ("These count the other workers' reads since this worker's read. A read "
                      "changes no parameter; staleness counts the updates applied meanwhile.")
        elif got == staleness_from_first_read(events):
            advice = ("Some values are too large: count from the worker's *latest* read, not its "
                      "first — every answer it got refreshed its parameters.")
        else:
            advice = ("Count applies (by any worker) between the worker's latest read and this "
                      "apply; reads by other workers do not change anything.")
        first = int(np.argmax(diff != 0))
        raise Wrong(f"{call}: apply #{first} should have staleness {expected[first]}, got "
                    f"{got[first]}. {advice}")
    return "every apply's staleness, on logs of 1 to 8 workers of different speeds"


def bsp_step_reference(seconds, speeds, straggle_prob, straggle_factor) -> float:
    """E[max over workers of seconds·speed·(factor with probability p, else 1)], exactly."""
    values = sorted({seconds * s * f for s in speeds for f in (1.0, straggle_factor)})
    expected, below = 0.0, 0.0
    for x in values:
        cdf = 1.0
        for s in speeds:
            cdf *= ((1 - straggle_prob) * (seconds * s <= x)
                    + straggle_prob * (seconds * s * straggle_factor <= x))
        expected += x * (cdf - below)
        below = cdf
    return expected


BSP_CASES = [(2e-3, [1.0, 1.3, 1.7], 0.1, 10.0), (1.0, [1.0] * 16, 0.05, 20.0),
             (0.5, [1.0, 2.0], 0.0, 5.0), (1e-3, [1.2, 1.0, 1.1, 3.0], 0.2, 2.0),
             (3.0, [1.0], 0.5, 4.0)]


@checker("4.3", "the expected time of a synchronous step")
def check_bsp_expected_step(bsp_expected_step):
    for seconds, speeds, p, factor in BSP_CASES:
        expected = bsp_step_reference(seconds, speeds, p, factor)
        call = f"bsp_expected_step({seconds:g}, {speeds}, straggle_prob={p}, straggle_factor={factor})"
        got = as_float(bsp_expected_step(seconds, list(speeds), p, factor), call)
        if math.isclose(got, expected, rel_tol=1e-9):
            continue
        mean_each = [seconds * s * (1 + p * (factor - 1)) for s in speeds]
        if math.isclose(got, float(np.mean(mean_each)), rel_tol=1e-9):
            advice = ("That is the average worker's time; a synchronous step waits for the "
                      "slowest, so it is the expected *maximum* over the workers.")
        elif math.isclose(got, max(mean_each), rel_tol=1e-9):
            advice = ("That is the slowest worker's expected time, but any worker may straggle: "
                      "E[max] is larger than the max of the expectations.")
        elif math.isclose(got, seconds * max(speeds), rel_tol=1e-9):
            advice = "The stragglers are missing: each worker is slowed with probability p."
        else:
            advice = ("P(step ≤ x) = Π over workers of P(worker ≤ x); the step time takes only "
                      "the values seconds·speed·{1, factor}, so E[max] is a finite sum.")
        raise Wrong(f"{call} returned {got:.6g}, expected {expected:.6g}. {advice}")
    return "E[max] over workers, exactly, with and without stragglers"


SSP_CASES = [([3, 3, 3], 0, 0), ([4, 3, 3], 0, 0), ([4, 3, 3], 0, 1), ([5, 3, 4], 2, 0),
             ([5, 3, 4], 1, 0), ([6, 3, 4], 2, 0), ([2, 9, 9], 0, 1), ([0, 0], 0, 0),
             ([10, 1, 5], math.inf, 0), ([7, 7, 2], 4, 1), ([7, 7, 2], 5, 1)]


def may_start_reference(clocks, worker, bound) -> bool:
    return clocks[worker] - min(clocks) <= bound


@checker("4.4", "the SSP admission rule")
def check_may_start(may_start):
    for clocks, bound, worker in SSP_CASES:
        expected = may_start_reference(clocks, worker, bound)
        call = f"may_start(clocks={clocks}, worker={worker}, bound={bound})"
        got = may_start(list(clocks), worker, bound)
        if not isinstance(got, (bool, np.bool_)):
            raise Wrong(f"{call} returned {got!r}; expected True or False")
        if bool(got) == expected:
            continue
        ahead = clocks[worker] - min(clocks)
        if ahead == bound:
            advice = (f"The worker is exactly {bound} clock(s) ahead of the slowest, which the "
                      f"bound allows: ≤, not <.")
        elif worker == int(np.argmin(clocks)) or clocks[worker] == min(clocks):
            advice = ("This worker is the slowest (or tied with it); the slowest may always go on, "
                      "or nobody ever would.")
        else:
            advice = ("Compare the worker's clock with the *slowest* worker's (the minimum over "
                      "all, itself included), not with the fastest or the others' average.")
        raise Wrong(f"{call} returned {got}, expected {expected}: the worker is {ahead} clock(s) "
                    f"ahead of the slowest. {advice}")
    return "admits exactly the workers at most s clocks ahead of the slowest"


# --- backup workers (section 3) ---------------------------------------------------------------

def backup_step_reference(seconds, speeds, straggle_prob, straggle_factor, backups) -> float:
    """E[the (W − b)-th smallest of the workers' step times], exactly: at each value x a step
    can take, P(at least W − b workers done by x) from the distribution of how many are done."""
    needed = len(speeds) - backups
    values = sorted({seconds * s * f for s in speeds for f in (1.0, straggle_factor)})
    expected, below = 0.0, 0.0
    for x in values:
        done = [1.0]                              # done[j] = P(exactly j workers done by x)
        for s in speeds:
            q = (1 - straggle_prob) * (seconds * s <= x) + straggle_prob * (seconds * s * straggle_factor <= x)
            done = [a * (1 - q) + b * q for a, b in zip(done + [0.0], [0.0] + done)]
        cdf = sum(done[needed:])
        expected += x * (cdf - below)
        below = cdf
    return expected


# (seconds, speeds, straggle_prob, straggle_factor, backups): the first tells the plausible
# mistakes apart; then many equal workers, no stragglers, b = 0 (BSP), and b = W − 1.
BACKUP_CASES = [(1.0, [1.0, 1.2, 1.5, 2.0], 0.2, 5.0, 1), (2e-3, [1.0] * 8, 0.05, 20.0, 2),
                (0.5, [1.0, 3.0, 1.1], 0.0, 4.0, 1), (1.0, [1.0, 1.0], 0.5, 3.0, 0),
                (1.0, [2.0, 1.0, 1.5, 1.2, 1.1], 0.3, 6.0, 4)]


@checker(BACKUP, "the expected step with backup workers")
def check_backup_expected_step(backup_expected_step):
    for seconds, speeds, p, factor, backups in BACKUP_CASES:
        expected = backup_step_reference(seconds, speeds, p, factor, backups)
        call = (f"backup_expected_step({seconds:g}, {speeds}, straggle_prob={p}, "
                f"straggle_factor={factor}, backups={backups})")
        got = as_float(backup_expected_step(seconds, list(speeds), p, factor, backups), call)
        if math.isclose(got, expected, rel_tol=1e-9):
            continue
        fastest = sorted(speeds)[:len(speeds) - backups]
        if backups and math.isclose(got, bsp_step_reference(seconds, speeds, p, factor), rel_tol=1e-9):
            advice = ("That is the step that waits for all W workers — as if there were no "
                      "backups (or one backup too few). With b backups it ends when the first "
                      "W − b are done.")
        elif backups and math.isclose(got, bsp_step_reference(seconds, fastest, p, factor), rel_tol=1e-9):
            advice = ("That drops the b workers with the slowest *speeds* before the step starts. "
                      "Which workers come last is decided by this step's delays: a fast worker "
                      "that straggles is dropped instead.")
        elif any(0 <= backups + d < len(speeds) and math.isclose(
                got, backup_step_reference(seconds, speeds, p, factor, backups + d), rel_tol=1e-9)
                for d in (-1, 1)):
            advice = ("That is the expected step with one backup too many or too few: with b "
                      "backups the step ends at the (W − b)-th worker to finish, counting from "
                      "the fastest.")
        else:
            advice = ("For each time x a step can take, how likely is it that at least W − b "
                      "workers are done by x? Those probabilities give the expectation, as in "
                      "exercise 4.3.")
        raise Wrong(f"{call} returned {got:.6g}, expected {expected:.6g}. {advice}")
    return "E[(W − b)-th fastest finish], exactly, from b = 0 (BSP) to b = W − 1"
