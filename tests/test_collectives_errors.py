"""Plumbing (hand-written): dsml.collectives on bad input — every mistake a learner can make
with a collective fails with an error that names the rank, the value and what would be valid,
on the simulator and on the real engines; a rank that skips a collective is a deadlock on sim
and a clear timeout on threads and processes (no hang, nothing left behind). And checking that
ranks agree costs no simulated time: real arrays, `SizeOnly` placeholders and `cost` agree.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

import dsml
from dsml import DeadlockError, RankError
from dsml.collectives import (COLLECTIVE_ALGORITHMS, allgather, allreduce, alltoall, broadcast,
                              cost, reduce, reduce_scatter)
from dsml.comm.api import SizeOnly
from leaks import nothing_left_behind  # noqa: F401

NET = dsml.net.AlphaBeta(alpha=2.3e-6, beta=1.1e-10, gamma=3.7e-11)
TIMEOUT = 60.0          # s: real engines, runs that should succeed or fail on their own
HANG_TIMEOUT = 3.0      # s: real engines, runs that can only end by timing out
REAL_ENGINES = ["threads", "processes"]
FUNCTIONS = {"broadcast": broadcast, "reduce": reduce, "allreduce": allreduce,
             "allgather": allgather, "reduce_scatter": reduce_scatter}
PAIRS = [(op, algorithm) for op, algorithms in COLLECTIVE_ALGORITHMS.items()
         for algorithm in algorithms]
PAIR_IDS = [f"{op}-{algorithm}" for op, algorithm in PAIRS]
ARRAY_PAIRS = [pair for pair in PAIRS if pair[0] != "alltoall"]
ARRAY_PAIR_IDS = [f"{op}-{algorithm}" for op, algorithm in ARRAY_PAIRS]


def collective_program(comm, op, inputs, kwargs):
    """Rank r runs collective `op` on inputs[r]."""
    if op == "alltoall":
        return (yield from alltoall(comm, inputs[comm.rank]))
    return (yield from FUNCTIONS[op](comm, inputs[comm.rank], **kwargs))


def skipping_program(comm, op, inputs, kwargs, skipper):
    """Like collective_program, but rank `skipper` returns at once: it skips the collective."""
    if comm.rank == skipper:
        return None
    return (yield from collective_program(comm, op, inputs, kwargs))


def run(engine, program, p, args, timeout=TIMEOUT):
    if engine == "sim":
        return dsml.run(program, p, network=NET, args=args)
    return dsml.run(program, p, engine=engine, args=args, timeout=timeout)


def kwargs_for(op, algorithm, **extra):
    return {**({} if op == "alltoall" else {"algorithm": algorithm}), **extra}


# Parses expect_like's message: "<what>: rank R received shape S D from rank Q, expected shape
# S' D'; every rank must pass arrays of the same shape and dtype".
MISMATCH = re.compile(r"rank (\d+) received shape (\(.*?\)) (\w+) from rank (\d+), expected "
                      r"shape (\(.*?\)) (\w+); every rank must pass arrays of the same shape "
                      r"and dtype")


def assert_names_the_mismatch(error, bad_rank):
    message = str(error)
    found = MISMATCH.search(message)
    assert found, f"no 'rank R received shape … from rank S, expected …' in: {message}"
    receiver, got_shape, got_dtype, sender, want_shape, want_dtype = found.groups()
    assert int(receiver) == error.rank, "the RankError's rank is the rank that noticed"
    assert int(receiver) != int(sender)
    assert bad_rank in (int(receiver), int(sender)), \
        f"the mismatch should involve rank {bad_rank}: {message}"
    assert (got_shape, got_dtype) != (want_shape, want_dtype), message
    return got_shape, got_dtype, want_shape, want_dtype


# --- ranks that disagree on shape or dtype ----------------------------------------------------

@pytest.mark.parametrize("op, algorithm", ARRAY_PAIRS, ids=ARRAY_PAIR_IDS)
@pytest.mark.parametrize("bad_rank", [0, 2])
def test_a_rank_with_a_different_length_is_named_on_sim(op, algorithm, bad_rank):
    inputs = [np.zeros(6 if r == bad_rank else 5) for r in range(4)]
    with pytest.raises(RankError) as info:
        run("sim", collective_program, 4, (op, inputs, kwargs_for(op, algorithm)))
    assert isinstance(info.value.__cause__, ValueError)
    assert_names_the_mismatch(info.value, bad_rank)


@pytest.mark.parametrize("op, algorithm", ARRAY_PAIRS, ids=ARRAY_PAIR_IDS)
def test_a_rank_with_a_different_dtype_is_named_on_sim(op, algorithm):
    inputs = [np.zeros(5, np.float32 if r == 1 else np.float64) for r in range(3)]
    with pytest.raises(RankError) as info:
        run("sim", collective_program, 3, (op, inputs, kwargs_for(op, algorithm)))
    _, got_dtype, _, want_dtype = assert_names_the_mismatch(info.value, 1)
    assert {got_dtype, want_dtype} == {"float32", "float64"}


def test_same_itemsize_different_kind_is_caught():
    """int32 and float32 have the same bytes: only the dtype check tells them apart."""
    inputs = [np.zeros(4, np.int32), np.zeros(4, np.float32)]
    with pytest.raises(RankError) as info:
        run("sim", collective_program, 2, ("allreduce", inputs, {"algorithm": "ring"}))
    _, got_dtype, _, want_dtype = assert_names_the_mismatch(info.value, 1)
    assert {got_dtype, want_dtype} == {"int32", "float32"}


@pytest.mark.parametrize("engine", REAL_ENGINES)
@pytest.mark.parametrize("op, algorithm", [("allreduce", "ring"), ("broadcast", "binomial"),
                                           ("allgather", "recursive_doubling")])
def test_a_mismatch_is_named_on_real_engines_and_fails_promptly(engine, op, algorithm):
    inputs = [np.zeros(7 if r == 2 else 5) for r in range(3)]
    with pytest.raises(RankError) as info:
        run(engine, collective_program, 3, (op, inputs, kwargs_for(op, algorithm)))
    assert "MismatchError" in str(info.value)
    assert_names_the_mismatch(info.value, 2)
    assert "did not finish within the timeout" not in str(info.value)


def test_a_mismatch_names_the_collective_called_and_the_shapes_passed():
    inputs = [np.zeros(5 if r == 2 else 4) for r in range(4)]
    with pytest.raises(RankError) as info:
        run("sim", collective_program, 4, ("allreduce", inputs, {"algorithm": "ring"}))
    message = str(info.value)
    assert "allreduce" in message and ("(5,)" in message or "(4,)" in message), message


# --- unknown algorithm, unknown op, bad root, bad chunks, wrong block count -------------------

@pytest.mark.parametrize("engine", ["sim"] + REAL_ENGINES)
@pytest.mark.parametrize("op", list(FUNCTIONS))
def test_an_unknown_algorithm_is_named_with_the_choices(engine, op):
    inputs = [np.zeros(4) for _ in range(2)]
    with pytest.raises(RankError) as info:
        run(engine, collective_program, 2, (op, inputs, {"algorithm": "fastest"}))
    choices = ", ".join(COLLECTIVE_ALGORITHMS[op])
    assert f"ValueError: unknown {op} algorithm 'fastest'; choose one of {choices}" \
        in str(info.value)


ALLOWED_OPS = {"reduce": "sum, prod, max, min", "reduce_scatter": "sum, prod, max, min",
               "allreduce": "sum, prod, max, min, mean"}


# "avg" is unknown where "mean" is (all-reduce takes it for mean: tests/test_conventions.py).
@pytest.mark.parametrize("op, allowed, bad", [
    (op, allowed, bad) for op, allowed in ALLOWED_OPS.items()
    for bad in ["avg", "SUM", np.add, None] if (op, bad) != ("allreduce", "avg")])
def test_an_unknown_op_is_named_with_the_choices(op, allowed, bad):
    inputs = [np.zeros(4) for _ in range(3)]
    with pytest.raises(RankError) as info:
        run("sim", collective_program, 3, (op, inputs, {"op": bad}))
    assert isinstance(info.value.__cause__, ValueError)
    assert f"unknown op {bad!r}; choose one of {allowed}" in str(info.value)


def test_mean_is_an_allreduce_op_only():
    inputs = [np.zeros(4) for _ in range(2)]
    with pytest.raises(RankError, match=r"unknown op 'mean'; choose one of sum, prod, max, min$"):
        run("sim", collective_program, 2, ("reduce", inputs, {"op": "mean"}))


@pytest.mark.parametrize("op", ["broadcast", "reduce"])
@pytest.mark.parametrize("root", [-1, 4, 100, 1.0, True, "0", None])
def test_a_root_outside_the_world_is_named_with_the_valid_ranks(op, root):
    inputs = [np.zeros(4) for _ in range(4)]
    with pytest.raises(RankError) as info:
        run("sim", collective_program, 4, (op, inputs, {"root": root}))
    assert isinstance(info.value.__cause__, ValueError)
    assert f"root must be a rank in 0..3, got {root!r}" in str(info.value)


@pytest.mark.parametrize("engine", REAL_ENGINES)
def test_a_bad_root_is_named_on_real_engines(engine):
    inputs = [np.zeros(4) for _ in range(3)]
    with pytest.raises(RankError, match=r"root must be a rank in 0\.\.2, got 3"):
        run(engine, collective_program, 3, ("broadcast", inputs, {"root": 3}))


@pytest.mark.parametrize("op", ["broadcast", "reduce"])
def test_a_numpy_integer_root_is_a_rank_like_any_other(op):
    inputs = [np.full(3, float(r)) for r in range(3)]
    values = run("sim", collective_program, 3, (op, inputs, {"root": np.int64(2)})).values
    assert np.array_equal(values[2], inputs[2] if op == "broadcast" else np.full(3, 3.0))


@pytest.mark.parametrize("chunks", [0, -1, 2.0, True, None])
def test_bad_chunks_for_the_chain_broadcast(chunks):
    inputs = [np.zeros(8) for _ in range(3)]
    with pytest.raises(RankError) as info:
        run("sim", collective_program, 3,
            ("broadcast", inputs, {"algorithm": "chain", "chunks": chunks}))
    assert f"chunks must be an integer ≥ 1, got {chunks!r}" in str(info.value)


def test_alltoall_with_the_wrong_number_of_blocks_names_the_rank_and_counts():
    blocks = [[np.zeros(2)] * 3, [np.zeros(2)] * 2, [np.zeros(2)] * 3]
    with pytest.raises(RankError) as info:
        run("sim", collective_program, 3, ("alltoall", blocks, {}))
    assert info.value.rank == 1
    assert "alltoall: rank 1 passed 2 blocks, expected one per rank (3)" in str(info.value)


# --- cost() on bad arguments ------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (("allscatter", "ring", 4, 8, 1e-6, 1e-9), "unknown op 'allscatter'; choose one of broadcast"),
    (("allreduce", "rings", 4, 8, 1e-6, 1e-9),
     "unknown allreduce algorithm 'rings'; choose one of naive, ring"),
    (("allreduce", "ring", 0, 8, 1e-6, 1e-9), "p must be an integer ≥ 1, got 0"),
    (("allreduce", "ring", 4.0, 8, 1e-6, 1e-9), "p must be an integer ≥ 1, got 4.0"),
    (("allreduce", "ring", True, 8, 1e-6, 1e-9), "p must be an integer ≥ 1, got True"),
    (("allreduce", "ring", 4, -8, 1e-6, 1e-9), "nbytes must be a finite number ≥ 0, got -8"),
    (("allreduce", "ring", 4, 8, math.nan, 1e-9), "alpha must be a finite number ≥ 0, got nan"),
    (("allreduce", "ring", 4, 8, 1e-6, math.inf), "beta must be a finite number ≥ 0, got inf"),
    (("allreduce", "ring", 4, 8, 1e-6, 1e-9, -1.0),
     "gamma must be a finite number ≥ 0, got -1.0"),
])
def test_cost_rejects_bad_arguments_by_name(args, message):
    with pytest.raises(ValueError) as info:
        cost(*args)
    assert message in str(info.value)


@pytest.mark.parametrize("chunks", [0, -2])
def test_cost_rejects_bad_chunks_like_broadcast_does(chunks):
    with pytest.raises(ValueError, match=f"chunks must be an integer ≥ 1, got {chunks}"):
        cost("broadcast", "chain", 4, 1024, 1e-6, 1e-9, chunks=chunks)


# --- a rank that skips the collective ---------------------------------------------------------

def waiting_ranks(deadlock):
    return sorted(int(process.name.split()[1]) for process in deadlock.waiting)


@pytest.mark.parametrize("op, algorithm", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("skipper", [0, 3])
def test_a_rank_that_skips_the_collective_is_found_on_sim(op, algorithm, skipper):
    """Either the others wait forever (DeadlockError listing who waits, for what) or — when the
    skipper only had to receive — its unreceived messages are reported. Either way the skipper
    is named and no rank is described as waiting on itself."""
    p = 4
    inputs = ([[np.zeros(2)] * p for _ in range(p)] if op == "alltoall"
              else [np.zeros(8) for _ in range(p)])
    with pytest.raises((DeadlockError, RankError)) as info:
        run("sim", skipping_program, p, (op, inputs, kwargs_for(op, algorithm), skipper))
    message = str(info.value)
    if isinstance(info.value, DeadlockError):
        waiting = waiting_ranks(info.value)
        assert waiting and skipper not in waiting, message
        assert f"from rank {skipper}" in message, message
        for rank in waiting:
            assert re.search(rf"rank {rank} waits (in sendrecv )?for a message from rank \d+",
                             message), message
    else:
        assert f"rank {skipper} finished without receiving messages sent to it" in message
        assert f"-> rank {skipper}" in message


@pytest.mark.parametrize("engine", REAL_ENGINES)
@pytest.mark.parametrize("n", [8, 8192], ids=["small", "64 KiB (shared memory)"])
def test_a_rank_that_skips_the_collective_times_out_clearly_on_real_engines(engine, n):
    """Real engines cannot know that a message will never come: the run ends at the timeout
    with every rank's state, and (fixture) leaves no thread, process or segment behind."""
    p, skipper = 4, 2
    inputs = [np.ones(n) for _ in range(p)]
    with pytest.raises(RankError) as info:
        run(engine, skipping_program, p, ("allreduce", inputs, {"algorithm": "ring"}, skipper),
            timeout=HANG_TIMEOUT)
    message = str(info.value)
    assert f"did not finish within the timeout of {HANG_TIMEOUT:g} s" in message
    assert f"rank {skipper} finished" in message
    for rank in set(range(p)) - {skipper}:
        assert re.search(rf"rank {rank} waits for a message from rank \d", message), message
    assert info.value.rank != skipper


@pytest.mark.parametrize("engine", REAL_ENGINES)
def test_a_skipper_that_only_had_to_receive_is_reported_on_real_engines(engine):
    """Broadcast from rank 0 with the last rank skipping: the others finish, and the message
    sent to the skipper is reported at once (no timeout)."""
    inputs = [np.ones(8) for _ in range(3)]
    with pytest.raises(RankError) as info:
        run(engine, skipping_program, 3, ("broadcast", inputs, {"algorithm": "naive"}, 2))
    assert "rank 2 finished without receiving messages sent to it" in str(info.value)
    assert "rank 0 -> rank 2" in str(info.value)


# --- checking agreement costs no simulated time -----------------------------------------------

def sim_time(op, algorithm, p, x):
    """Simulated time with every rank passing `x` (alltoall: p blocks of `x`)."""
    inputs = [[x] * p for _ in range(p)] if op == "alltoall" else [x] * p
    return run("sim", collective_program, p, (op, inputs, kwargs_for(op, algorithm))).time


@pytest.mark.parametrize("op, algorithm", PAIRS, ids=PAIR_IDS)
def test_real_arrays_take_exactly_the_time_of_placeholders(op, algorithm):
    """A byte array of n elements and SizeOnly(n) are cut into the same blocks (any n, any p):
    the checks on arrival must add nothing, so the times are equal to the last bit. A float64
    array of n elements costs what SizeOnly(8n) costs when the blocks line up (n divisible
    by p), and both equal the closed form where it is exact."""
    for p in (1, 2, 3, 4, 5, 8):
        for n in (0, 1, 7, 1000, 4099):
            as_bytes = sim_time(op, algorithm, p, np.arange(n, dtype=np.uint8))
            placeholder = sim_time(op, algorithm, p, SizeOnly(n))
            assert as_bytes == placeholder, \
                f"{op}/{algorithm} p={p} n={n}: arrays {as_bytes}, placeholders {placeholder}"
        n = 48 * p
        floats = sim_time(op, algorithm, p, np.ones(n))
        placeholder = sim_time(op, algorithm, p, SizeOnly(8 * n))
        assert floats == placeholder, f"{op}/{algorithm} p={p}: {floats} != {placeholder}"
        naive_with_gamma = algorithm == "naive" and op in ("reduce", "allreduce") and p > 2
        if p & (p - 1) == 0 and not naive_with_gamma:
            total = 8 * n * (p if op in ("allgather", "alltoall") else 1)
            formula = cost(op, algorithm, p, total, NET.alpha, NET.beta, NET.gamma)
            assert math.isclose(floats, formula, rel_tol=1e-12), \
                f"{op}/{algorithm} p={p}: simulated {floats}, formula {formula}"


# --- bool arrays: "sum" would be a logical OR -------------------------------------------------

REDUCING = [("allreduce", "sum"), ("allreduce", "mean"), ("reduce", "sum"),
            ("reduce_scatter", "sum")]


@pytest.mark.parametrize("engine", ["sim"] + REAL_ENGINES)
@pytest.mark.parametrize("op, reduction", REDUCING, ids=[f"{o}-{r}" for o, r in REDUCING])
def test_summing_bool_arrays_is_refused_with_the_way_out(engine, op, reduction):
    inputs = [np.array([True, True, False, r == 0]) for r in range(3)]
    with pytest.raises(RankError) as info:
        run(engine, collective_program, 3, (op, inputs, {"op": reduction}))
    message = str(info.value)
    assert f"{op}: op={reduction!r} on a bool array would be a logical OR" in message, message
    assert "x.astype(np.int64)" in message and "op='max'" in message
    assert "did not finish within the timeout" not in message


@pytest.mark.parametrize("op, reduction, expected",
                         [("allreduce", "max", [True, True, False, True]),
                          ("allreduce", "min", [True, True, False, False]),
                          ("reduce", "prod", [True, True, False, False])])
def test_bool_arrays_with_max_min_prod_mean_any_and_all(op, reduction, expected):
    inputs = [np.array([True, True, False, r == 0]) for r in range(3)]
    values = run("sim", collective_program, 3, (op, inputs, {"op": reduction})).values
    assert values[0].dtype == np.bool_ and values[0].tolist() == expected


def test_counting_true_values_after_the_suggested_cast():
    inputs = [np.array([True, True, False, r == 0]).astype(np.int64) for r in range(3)]
    values = run("sim", collective_program, 3, ("allreduce", inputs, {"op": "sum"})).values
    assert all(v.tolist() == [3, 3, 0, 1] for v in values)


# --- ranks that pass different ops -----------------------------------------------------------

from dsml.collectives.checks import OP_TAGS  # noqa: E402

OP_PAIRS = [("allreduce", "ring"), ("allreduce", "recursive_doubling"),
            ("allreduce", "halving_doubling"), ("allreduce", "tree"), ("allreduce", "naive"),
            ("reduce", "binomial"), ("reduce", "rabenseifner"),
            ("reduce_scatter", "ring"), ("reduce_scatter", "recursive_halving")]


@pytest.mark.parametrize("engine", ["sim"] + REAL_ENGINES)
@pytest.mark.parametrize("op, algorithm", OP_PAIRS, ids=[f"{o}-{a}" for o, a in OP_PAIRS])
def test_ranks_passing_different_ops_are_told_so_not_given_a_blend(engine, op, algorithm):
    # Before the per-op tags, rank 1's "max" and the others' "sum" returned a blend.
    inputs = [np.arange(6.0) + r for r in range(3)]
    ops = ["sum", "max", "sum"]

    def program(comm):
        return (yield from FUNCTIONS[op](comm, inputs[comm.rank], op=ops[comm.rank],
                                         algorithm=algorithm))

    # Found at once on sim and threads; on processes some of these waits are found only at
    # the timeout, which then names the same tags.
    with pytest.raises((DeadlockError, RankError)) as info:
        run(engine, program, 3, (), timeout=HANG_TIMEOUT)
    message = str(info.value)
    # Every report asks the question. Both ops' calls show (their tags carry the call's
    # signature: dsml.collectives.signatures), except where rank 1 only sends (a binomial
    # reduce to rank 0) on a real engine: then it has finished, and only a message it left
    # unreceived, which the real engines count but do not decode unless it was stashed, would.
    assert "did every rank pass the same op?" in message, message
    assert "op='sum'" in message, message
    if engine == "sim" or (op, algorithm) != ("reduce", "binomial"):
        assert "op='max'" in message, message


@pytest.mark.parametrize("op", ["prod", "max", "min", "mean"])
def test_every_rank_passing_the_same_op_still_agrees_with_numpy(op):
    inputs = [np.arange(1.0, 7.0) * (r + 1) for r in range(4)]
    values = run("sim", collective_program, 4, ("allreduce", inputs, {"op": op})).values
    expected = {"prod": np.prod, "max": np.max, "min": np.min, "mean": np.mean}[op](
        np.stack(inputs), axis=0)
    assert all(np.allclose(v, expected) for v in values)


def test_every_message_of_a_call_carries_the_call_s_signature_tag():
    from dsml.collectives.signatures import describe
    inputs = [np.ones(4) for _ in range(2)]
    result = dsml.run(collective_program, 2, network=NET,
                      args=("allreduce", inputs, {"algorithm": "ring"}))
    tags = {rec.tag for rec in result.trace.records if rec.op in ("send", "sendrecv")}
    assert [describe(tag) for tag in tags] == ["allreduce(op='sum', algorithm='ring')"]
