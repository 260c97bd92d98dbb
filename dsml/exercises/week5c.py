"""Plumbing (hand-written): the checkers of bonus notebook 5c's exercises (expert parallelism).

Each checker calls the learner's function on inputs different from the worked example and
raises `Wrong` with a hint that names the mistake it detected. The dropped tokens are counted
by the notebook's own router (`dsml.expert_parallel.route`, handed one-hot probabilities so
that it makes exactly the given choices); the bytes of a dispatch are measured: the checker
runs the expert-parallel layer (`expert_parallel_moe`) on the simulator and reads the bytes of
its first all-to-all from the trace.

This module imports from the lower layers only (`dsml.comm`, `dsml.net`,
`dsml.expert_parallel`), never the top-level `dsml` package, which sits above it.
"""
from __future__ import annotations

import math

import numpy as np

from dsml.comm.run import run
from dsml.exercises import Wrong, as_float, checker, fresh_rng
from dsml.expert_parallel import expert_parallel_moe, init_moe, route
from dsml.net.alphabeta import AlphaBeta

# --- 5c.1: dropped tokens ---------------------------------------------------------------------

# (choices, experts, capacity factor). The first case is chosen so that rounding the capacity
# down, leaving out the capacity factor, returning the kept tokens and counting the full
# experts all give different numbers.
DROP_CASES = [([0] * 7 + [1] * 3 + [2, 3], 5, 2.0),
              ([0, 1, 2, 3] * 5, 4, 1.0),
              ([2] * 9 + [0] * 2 + [1], 3, 1.25),
              ([0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 3], 4, 0.5),
              ([5], 6, 1.0)]


def dropped_reference(choices, experts: int, capacity_factor: float) -> int:
    """The dropped count of the notebook's `route` given exactly these top-1 choices."""
    tokens = len(choices)
    probs = np.eye(experts)[np.asarray(choices)]
    slots = math.ceil(capacity_factor * tokens / experts)
    _, slot, _ = route(probs, 1, slots)
    return int((slot < 0).sum())


@checker("5c.1", "tokens dropped by a capacity", builds=("dsml.expert_parallel.route",))
def check_dropped_tokens(dropped_tokens):
    for choices, experts, factor in DROP_CASES:
        expected = dropped_reference(choices, experts, factor)
        call = f"dropped_tokens({choices}, experts={experts}, capacity_factor={factor})"
        got = as_float(dropped_tokens(list(choices), experts, factor), call)
        if got == expected:
            continue
        tokens, counts = len(choices), np.bincount(choices, minlength=experts)
        def over(slots):
            return int(np.maximum(counts - slots, 0).sum())
        if got == over(math.floor(factor * tokens / experts)):
            advice = ("Perhaps the capacity was rounded down: a fractional share of slots is "
                      "rounded up, so that c = 1 gives every expert at least its fair share.")
        elif got == over(math.ceil(tokens / experts)):
            advice = "Perhaps the capacity factor was left out of the number of slots."
        elif got == tokens - expected:
            advice = "That looks like the tokens kept; the question asks for those dropped."
        elif got == int((counts > math.ceil(factor * tokens / experts)).sum()):
            advice = ("That looks like the number of experts over capacity; count the tokens "
                      "each of them turns away.")
        else:
            advice = ("Count each expert's requests and compare them with the slots it has "
                      "(section 2's capacity): only the excess is dropped.")
        raise Wrong(f"{call} returned {got:g}; the notebook's router drops {expected}. {advice}")
    return "matches the notebook's router, c from 0.5 to 2"


# --- 5c.2: the bytes of one all-to-all dispatch --------------------------------------------------

# (tokens, hidden, experts, k, capacity factor, ep, itemsize). In the first case rounding the
# capacity down, leaving out c, leaving out k, sending the whole buffer and counting elements
# all give different numbers.
DISPATCH_CASES = [(20, 4, 8, 2, 1.3, 4, 4), (16, 8, 4, 1, 1.0, 2, 8), (9, 6, 6, 2, 1.25, 3, 2),
                  (8, 4, 4, 1, 1.0, 1, 8), (30, 4, 8, 1, 0.5, 8, 4)]
DTYPES = {2: np.float16, 4: np.float32, 8: np.float64}


def _first_dispatch(comm, params, groups, k, factor):
    return (yield from expert_parallel_moe(comm, params, groups[comm.rank],
                                           np.zeros_like(groups[comm.rank], dtype=float),
                                           k, factor))


def measured_dispatch_bytes(tokens, hidden, experts, k, capacity_factor, ep, itemsize) -> int:
    """Bytes rank 0 sends in the layer's first all-to-all, read from the simulator's trace."""
    rng = np.random.default_rng(0)
    params = init_moe(hidden, 3, experts, seed=1)
    groups = [rng.standard_normal((tokens, hidden)).astype(DTYPES[itemsize]) for _ in range(ep)]
    result = run(_first_dispatch, ep, network=AlphaBeta(1e-6, 1e-9),
                 args=(params, groups, k, capacity_factor))
    sends = [r.nbytes for r in result.trace.of_rank(0) if r.op in ("send", "sendrecv")]
    return sum(sends[:ep - 1])


def fresh_dispatch_cases(rng, count: int = 2) -> list:
    """`count` cases drawn from `rng`: ep = 2 or 4 ranks, a multiple of ep experts, k ≤ 2."""
    cases = []
    for _ in range(count):
        ep = int(rng.choice([2, 4]))
        experts = ep * int(rng.integers(1, 4))
        cases.append((int(rng.integers(4, 25)), int(rng.integers(2, 9)), experts,
                      int(rng.integers(1, min(2, experts) + 1)),
                      float(rng.choice([0.5, 1.0, 1.25, 1.5])), ep, int(rng.choice([2, 4, 8]))))
    return cases


@checker("5c.2", "the bytes of one all-to-all dispatch")
def check_dispatch_bytes(dispatch_bytes):
    cases = [(case, "") for case in DISPATCH_CASES]
    cases += [(case, " (a case drawn afresh for this check)")
              for case in fresh_dispatch_cases(fresh_rng())]
    for case, drawn in cases:
        tokens, hidden, experts, k, factor, ep, itemsize = case
        expected = measured_dispatch_bytes(*case)
        call = (f"dispatch_bytes(tokens={tokens}, hidden={hidden}, experts={experts}, k={k}, "
                f"capacity_factor={factor}, ep={ep}, itemsize={itemsize}){drawn}")
        got = as_float(dispatch_bytes(*case), call)
        if math.isclose(got, expected, rel_tol=1e-12, abs_tol=1e-9):
            continue
        share = (ep - 1) * (experts // ep) * hidden * itemsize
        whole = experts * hidden * itemsize * math.ceil(factor * tokens * k / experts)
        if math.isclose(got, share * math.floor(factor * tokens * k / experts)):
            advice = "Perhaps the capacity was rounded down; a fractional share is rounded up."
        elif math.isclose(got, share * math.ceil(tokens * k / experts)):
            advice = "Perhaps the capacity factor was left out of the slots per expert."
        elif math.isclose(got, share * math.ceil(factor * tokens / experts)):
            advice = "Perhaps k was left out: each token makes k assignments, so k·T share slots."
        elif math.isclose(got, whole):
            advice = ("That is the whole buffer; the block for the rank's own experts stays on "
                      "the rank.")
        elif math.isclose(got * itemsize, expected):
            advice = "Count bytes, not values: multiply by the itemsize."
        else:
            advice = ("Picture section 3's fixed-size dispatch buffer: how many slots does "
                      "each expert get, and which part of the buffer never leaves the rank?")
        if drawn:      # say the inputs, not the answer
            raise Wrong(f"{call} returned {got:g}, not the bytes the simulator measured rank 0 "
                        f"sending in the dispatch. {advice}")
        raise Wrong(f"{call} returned {got:g}; the simulator measured {expected} B sent by "
                    f"rank 0 in the dispatch. {advice}")
    return "matches the bytes read from the simulator's trace, ep = 1 to 8"
