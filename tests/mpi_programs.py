"""Plumbing (hand-written): the programs that tests/test_mpi.py runs inside MPI jobs.

    mpiexec -n P python tests/mpi_programs.py CHECK [ARG]

Every process of the job runs the same CHECK and calls `dsml.run(..., engine="mpi")`; every
process gets every rank's values, so every process checks them. A check that passes prints
`OK CHECK` from rank 0 and exits 0. A failed assertion aborts the whole job (MPI_Abort),
so that no process is left waiting for one that has given up.

Checks:
- collectives: every collective and algorithm of week 2 on awkward shapes and dtypes: the
  values equal the simulator's bit for bit, and NumPy's (the property tests' own check).
- training: week 3's data_parallel_sgd (every all-reduce algorithm) and ddp_sgd (its buckets on
  a second activity) train as on the simulator, bit for bit, and as one process.
- rooted: gather, scatter (every algorithm, every root) and barrier equal NumPy's answer.
- activities: spawn/join programs of tests/test_activities.py give the simulator's values.
- trace: a traced run has the simulator's rows (op, peers, bytes, tags), times from 0.
- payloads: arrays of every kind (raw or pickled on the wire) arrive as they were sent, and
  a send is a snapshot: changing the array after sending it changes nothing.
- raises R: rank R raises inside its program (the job must end, naming it).
- hangs T: rank 0 waits for a message that rank 1, busy in its own code, never sends, with a
  timeout of T seconds.
- deadlocks T: every rank waits for its neighbour (a deadlock), with a timeout of T seconds:
  the job ends at once with the report, not at the timeout.
- unreceived: a message nobody receives: every process gets the same RankError.
"""
from __future__ import annotations

import os
import signal
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))      # this checkout's dsml, whatever is installed
sys.path.insert(0, str(HERE))             # the tests' helpers

import numpy as np  # noqa: E402

import dsml  # noqa: E402
from dsml.comm.mpi import abort_job, job_rank, job_size  # noqa: E402

NET = dsml.net.AlphaBeta(alpha=2e-6, beta=1e-10, gamma=2.5e-11)
TIMEOUT = 60.0


def on_sim(program, p, args=(), kwargs=None):
    return dsml.run(program, p, network=NET, args=args, kwargs=kwargs)


def on_mpi(program, p, args=(), kwargs=None, **options):
    options.setdefault("timeout", TIMEOUT)
    return dsml.run(program, p, engine="mpi", args=args, kwargs=kwargs, **options)


def same_bits(a, b) -> bool:
    """Equal values, arrays equal in dtype, shape and every bit, through lists, tuples, dicts."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and a.tobytes() == b.tobytes())
    if isinstance(a, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(same_bits(x, y) for x, y in zip(a, b)))
    if isinstance(a, dict):
        return (isinstance(b, dict) and list(a) == list(b)
                and all(same_bits(a[k], b[k]) for k in a))
    return type(a) is type(b) and a == b


def assert_as_on_sim(what, mpi_values, sim_values):
    for rank, (got, want) in enumerate(zip(mpi_values, sim_values)):
        assert same_bits(got, want), (f"{what}: rank {rank} got {got!r} on mpi, "
                                      f"{want!r} on sim")


# --- collectives ------------------------------------------------------------------------------

def check_collectives(p):
    import test_collectives_properties as props

    # (rows, cols, dtype, seed): empty, shorter than p, odd, 2-D, and a large one that MPI
    # sends by rendezvous (256 KiB blocks)
    shapes = [(0, None, np.float64, 1), (1, None, np.int32, 2), (p + 1, 3, np.float32, 3),
              (37, None, np.int64, 4), (131_072, None, np.float64, 5)]
    cases = 0
    for name, algorithm in props.CASES:
        for index, (rows, cols, dtype, seed) in enumerate(shapes):
            ops = ("sum", "prod", "max", "min", "mean") if name == "allreduce" \
                else tuple(props.UFUNCS)
            chosen = {"root": index % p, "chunks": 1 + index % 4, "op": ops[index % len(ops)]}

            def draw(strategy, label):
                return chosen[label]

            # The property tests' check, on mpi: the values against NumPy ...
            props.check("mpi", name, algorithm, p, rows, cols, dtype, seed, draw)
            # ... and the same run on both engines: the same bits.
            if name == "alltoall":
                inputs, kwargs = props.make_alltoall_blocks(p, rows, dtype, seed), {}
            else:
                inputs = props.make_inputs(p, rows, cols, dtype, seed)
                kwargs = {"algorithm": algorithm}
                if name in ("broadcast", "reduce"):
                    kwargs["root"] = chosen["root"]
                if name == "broadcast" and algorithm == "chain":
                    kwargs["chunks"] = chosen["chunks"]
                if name in ("reduce", "allreduce", "reduce_scatter"):
                    kwargs["op"] = chosen["op"]
            args = (name, inputs, kwargs)
            assert_as_on_sim(f"{name}({algorithm}, {kwargs}), shape ({rows}, {cols}) "
                             f"{dtype.__name__}",
                             on_mpi(props.collective_program, p, args).values,
                             on_sim(props.collective_program, p, args).values)
            cases += 1
    return f"{cases} cases"


def check_rooted(p):
    import test_rooted as rooted

    cases = 0
    for algorithm in ("binomial", "naive"):
        for root in range(p):
            whole = np.concatenate([rooted.data(r) for r in range(p)])
            kwargs = {"root": root, "algorithm": algorithm}
            values = on_mpi(rooted.gathers, p, kwargs=kwargs).values
            assert all(v is None for r, v in enumerate(values) if r != root), values
            assert np.array_equal(values[root], whole), (algorithm, root, values[root])
            values = on_mpi(rooted.scatters, p, kwargs=kwargs).values
            assert all(np.array_equal(v, rooted.data(r)) for r, v in enumerate(values)), values
            cases += 2

    def barriers(comm):
        for _ in range(3):
            yield from dsml.collectives.barrier(comm)
        return comm.rank

    assert on_mpi(barriers, p).values == list(range(p))
    return f"{cases + 1} cases"


# --- training ---------------------------------------------------------------------------------

def check_training(p):
    from dsml.collectives import ALLREDUCE_ALGORITHMS
    from test_data_parallel import (SIZES, assert_matches_reference, classification,
                                    global_batches, reference_training, step_by_step)
    from test_ddp import ddp_step_by_step

    X, y = classification()
    batches = global_batches(len(X))          # some shorter than p: empty shards
    for optimizer in ("momentum", "adam"):
        reference, losses = reference_training(SIZES, optimizer, X, y, batches)
        for algorithm in ALLREDUCE_ALGORITHMS:
            args, kwargs = (SIZES, optimizer, X, y, batches), {"algorithm": algorithm}
            values = on_mpi(step_by_step, p, args, kwargs).values
            assert_matches_reference(values, reference, losses)
            assert_as_on_sim(f"data_parallel_sgd, {optimizer}, {algorithm}", values,
                             on_sim(step_by_step, p, args, kwargs).values)
    reference, losses = reference_training(SIZES, "momentum", X, y, batches)
    for cap, overlap in [(100, True), (1000, True), (float("inf"), False)]:
        args = ("momentum", X, y, batches, cap, overlap)
        values = on_mpi(ddp_step_by_step, p, args).values
        assert_matches_reference(values, reference, losses)
        assert_as_on_sim(f"ddp_sgd, cap {cap}, overlap {overlap}", values,
                         on_sim(ddp_step_by_step, p, args).values)
    return (f"data_parallel_sgd × {len(ALLREDUCE_ALGORITHMS)} algorithms × 2 optimizers, "
            f"ddp_sgd × 3")


# --- activities -------------------------------------------------------------------------------

def check_activities(p):
    import test_activities as acts

    programs = [(acts.spawned_allreduce, (10,)), (acts.spawned_allreduce, (50_000,)),
                (acts.two_collectives_beside_messages, (4,)), (acts.nested, ()),
                (acts.joins_a_finished_activity_twice, ()), (acts.shares_the_mailbox, ())]
    for program, args in programs:
        if program is acts.shares_the_mailbox and p != 2:
            continue                        # written for two ranks
        assert_as_on_sim(program.__name__, on_mpi(program, p, args).values,
                         on_sim(program, p, args).values)
    values = on_mpi(acts.two_collectives_beside_messages, p, (4,)).values
    for rank, (heard, (first, second)) in enumerate(values):
        assert np.array_equal(first, acts.total(p)) and np.array_equal(second,
                                                                        10 * acts.total(p))
    return f"{len(programs)} programs"


# --- trace and time ---------------------------------------------------------------------------

def ring_allreduce(comm, n):
    from dsml.collectives import allreduce
    return (yield from allreduce(comm, np.arange(n, dtype=np.float64) + comm.rank,
                                 algorithm="ring"))


def check_trace(p):
    mpi, sim = on_mpi(ring_allreduce, p, (1000,)), on_sim(ring_allreduce, p, (1000,))
    assert mpi.engine == "mpi" and mpi.world_size == p == len(mpi.finish_times)
    assert on_mpi(ring_allreduce, None, (10,)).world_size == p, "world_size=None: the job's"

    def rows(result):
        return sorted((r.rank, r.op, r.src, r.dst, r.nbytes, r.tag)
                      for r in result.trace.records)

    assert rows(mpi) == rows(sim), f"trace rows differ:\n{rows(mpi)}\n{rows(sim)}"
    assert all(0 <= r.start <= r.end <= mpi.time for r in mpi.trace.records), "times from 0"
    assert mpi.time == max(mpi.finish_times) > 0
    assert on_mpi(ring_allreduce, p, (10,), trace=False).trace is None
    return f"{len(mpi.trace.rows)} rows"


# --- payloads -------------------------------------------------------------------------------

def payloads(seed):
    """Messages of every kind: bare arrays that travel raw (any plain dtype and shape, 0-d,
    empty, non-native byte order, large), and what is pickled (non-contiguous and Fortran
    arrays, structured and object dtypes, placeholders, structured messages)."""
    rng = np.random.default_rng(seed)
    big = rng.standard_normal(300_000)                      # 2.4 MB: MPI's rendezvous
    return [rng.integers(0, 9, (3, 4)).astype(np.int32), np.float64(seed) * np.ones(()),
            np.empty((0, 5), np.float32), np.arange(6, dtype=">i4"), rng.random(7) < 0.5,
            (rng.standard_normal(3) + 1j).astype(np.complex64), np.array(["ab", "cde"]),
            np.arange(10, dtype=np.int16)[::3], np.asfortranarray(rng.random((3, 2))),
            np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]),
            np.array([None, "x"], dtype=object), big, dsml.SizeOnly(12),
            (seed, "text", np.ones(2)), {"version": seed, "grad": np.zeros(3)}]


def passes_payloads(comm):
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    mine = payloads(comm.rank)
    for tag, payload in enumerate(mine):
        yield comm.send(right, payload, tag=tag)
        if isinstance(payload, np.ndarray) and payload.dtype.kind in "biufc":
            payload[...] = 0                # after the send: the message must not change
    got = []
    for tag in range(len(mine)):
        got.append((yield comm.recv(left, tag=tag)))
    return got


def check_payloads(p):
    values = on_mpi(passes_payloads, p).values
    for rank, got in enumerate(values):
        sent = payloads((rank - 1) % p)
        for tag, (a, b) in enumerate(zip(got, sent)):
            if isinstance(b, np.ndarray) and b.dtype == object:
                assert a.dtype == object and list(a) == list(b), f"tag {tag}: {a!r}"
            elif isinstance(b, dsml.SizeOnly):
                assert a == b, f"tag {tag}: {a!r}"
            else:
                assert same_bits(a, b), f"rank {rank}, tag {tag}: got {a!r}, sent {b!r}"
    return f"{len(payloads(0))} kinds of payload"


# --- failures ---------------------------------------------------------------------------------

def raises_in(comm, bad_rank):
    from dsml.collectives import allreduce
    yield from allreduce(comm, np.ones(4))
    if comm.rank == bad_rank:
        raise ZeroDivisionError(f"rank program failed on purpose in rank {bad_rank}")
    yield from allreduce(comm, np.ones(4))      # the others wait for it


def waits_forever(comm):
    if comm.rank == 0:
        yield comm.recv(1, tag=3)               # rank 1 is busy past the timeout
    else:
        import time
        time.sleep(3600)                         # busy in its own code: no deadlock, a hang
    yield comm.compute(0.0)


def sends_unreceived(comm):
    if comm.rank == 0:
        yield comm.send(1, np.ones(100_000), tag=5)     # large: MPI's rendezvous
        yield comm.send(1, {"small": np.ones(2)}, tag=6)
    yield comm.compute(0.0)


def check_raises(p, bad_rank):
    on_mpi(raises_in, p, (int(bad_rank),))
    return "the run returned although a rank raised"        # not reached: the job aborts


def check_killed(p, victim):
    """Rank `victim` SIGKILLs itself in the middle of a run; the launcher then ends the job
    (no process runs MPI_Finalize or abort_job)."""
    on_mpi(killed_in, p, (int(victim),))
    return "the run returned although a rank was killed"     # not reached


def killed_in(comm, victim):
    from dsml.collectives import allreduce
    x = np.ones(1000)
    for step in range(1_000_000):
        if step == 3 and comm.rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        x = yield from allreduce(comm, x / comm.size)
    return float(x[0])


def check_hangs(p, timeout):
    on_mpi(waits_forever, p, timeout=float(timeout))
    return "the run returned although rank 0 never got its message"


def waits_for_the_next(comm):
    yield comm.recv((comm.rank + 1) % comm.size, tag=4)      # nobody sends


def check_deadlocks(p, timeout):
    on_mpi(waits_for_the_next, p, timeout=float(timeout))
    return "the run returned although every rank waits"


def check_unreceived(p):
    try:
        on_mpi(sends_unreceived, p)
    except dsml.RankError as error:
        assert error.rank == 1, str(error)
        assert "rank 0 -> rank 1 (tag 5): 1 message(s)" in str(error), str(error)
        assert "rank 0 -> rank 1 (tag 6): 1 message(s)" in str(error), str(error)
        return "RankError on every process"
    raise AssertionError("a message nobody received was not an error")


CHECKS = {"collectives": check_collectives, "training": check_training,
          "activities": check_activities, "rooted": check_rooted, "trace": check_trace,
          "payloads": check_payloads,
          "raises": check_raises, "killed": check_killed,
          "hangs": check_hangs, "deadlocks": check_deadlocks, "unreceived": check_unreceived}


def main(argv) -> int:
    name, args = argv[0], argv[1:]
    try:
        outcome = CHECKS[name](job_size(), *args)
    except BaseException:                       # end the whole job, not just this process
        abort_job(f"check {name} failed in process {job_rank()}:\n{traceback.format_exc()}")
        raise
    if name in ("raises", "hangs", "deadlocks"):
        abort_job(f"check {name}: {outcome}")
    if job_rank() == 0:
        print(f"OK {name}: {outcome}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
