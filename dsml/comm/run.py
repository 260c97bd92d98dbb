"""Plumbing (hand-written): `run`, the one entry point to every engine."""
from __future__ import annotations

import math
import numbers

from dsml.comm.api import Comm, RankError, RunResult, start_rank
from dsml.comm.driver import check_timeout
from dsml.comm.sim_engine import simulate
from dsml.validate_args import mapping_of_arguments, sequence_of_arguments

# "mpi" runs inside an MPI job only (mpiexec -n P python script.py; the optional extra
# '.[mpi]'): a loop over ENGINES in one process should skip it.
ENGINES = ("sim", "threads", "processes", "mpi")
# The simulator keeps a generator and a few dicts per rank: beyond this many ranks a run
# exhausts memory (or takes hours) instead of answering.
MAX_SIM_WORLD_SIZE = 100_000


def run(program, world_size: int | None, engine: str = "sim", network=None, args=(), kwargs=None,
        trace: bool = True, timeout: float | None = 120.0, max_events: int | None = None,
        failures: str = "stop") -> RunResult:
    """Run `program(comm, *args, **kwargs)` on `world_size` ranks and return a RunResult.

    engine "sim": the discrete-event simulator over `network` (e.g. dsml.net.AlphaBeta);
    `time` is simulated seconds. engine "threads": one thread per rank in this process;
    engine "processes": one OS process per rank. On both, `time` is measured seconds from
    a common start (after all ranks are up) to the last finish, and a run where every
    unfinished rank waits for a message that no rank will send raises DeadlockError at once.
    `timeout` (s > 0; None or float('inf') for no limit) bounds the run on every engine (on
    "sim", in wall-clock seconds, read between steps: a rank that never yields is not stopped).
    engine "mpi": every process of an MPI job calls `run`, and each runs its own rank (mpi4py;
    `dsml.comm.mpi`); `world_size` must be the job's size, or None to take it; every process
    gets the same RunResult. `trace=False` skips recording.
    `max_events` (sim only) bounds a simulation's steps (events, and requests answered at
    once; an integer ≥ 1, or None: dsml.sim_support.DEFAULT_MAX_EVENTS); past it, or past
    `timeout`, the simulator raises dsml.sim.LimitExceeded saying what each rank was doing.
    A rank program that returns a generator (a collective called without `yield from`) is an
    error on every engine.
    `failures`: "stop" (a rank that raises fails the run, naming the rank) or "notify"
    (week 4: the rank ends, and its peers' receives from it raise
    dsml.comm.failures.PeerFailed; `RunResult.failed` maps each failed rank to its error;
    every engine but "mpi").
    """
    if failures not in ("stop", "notify"):
        raise ValueError(f"failures must be 'stop' or 'notify', got {failures!r}")
    if failures == "notify" and engine == "mpi":
        raise ValueError("failures='notify' does not run on engine='mpi': a rank that raises "
                         "ends the MPI job (MPI_Abort); use it on sim, threads or processes")
    if engine == "mpi" and world_size is None:       # the MPI job's size
        from dsml.comm.mpi import job_size
        world_size = job_size()
    if not isinstance(world_size, numbers.Integral) or isinstance(world_size, bool) \
            or world_size < 1:
        raise ValueError(f"world_size must be an integer ≥ 1, got {world_size!r}")
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    timeout = check_timeout(timeout)
    if engine == "sim" and world_size > MAX_SIM_WORLD_SIZE:
        raise ValueError(f"world_size must be at most {MAX_SIM_WORLD_SIZE:,} on engine='sim' "
                         f"(each rank is a generator in this process), got {world_size!r}")
    args = sequence_of_arguments("args", args, "the rank program's arguments")
    kwargs = mapping_of_arguments("kwargs", kwargs, "the rank program's keyword arguments")
    if not callable(program):
        raise TypeError(f"program must be a generator function, got {type(program).__name__}")
    # Fail fast, in the caller, when the program is not a generator function.
    start_rank(program, Comm(0, world_size), args, kwargs).close()
    if engine == "sim":
        if network is None:
            raise ValueError("engine='sim' needs a network model, e.g. "
                             "network=dsml.net.AlphaBeta(alpha=5e-6, beta=1e-9)")
        if not callable(getattr(network, "attach", None)):
            raise TypeError(f"network must be a network model such as "
                            f"dsml.net.AlphaBeta(alpha=5e-6, beta=1e-9), a dsml.net.Topology, "
                            f"or one loaded with dsml.net.load_network(path); got {network!r}")
        # The simulator checks max_events itself (dsml.sim_support) and reports a rank that
        # returned a generator; None from check_timeout means no limit, which it spells inf.
        return simulate(program, world_size, network, args, kwargs, trace, max_events, failures,
                        math.inf if timeout is None else timeout)
    if network is not None:
        raise ValueError(f"engine={engine!r} measures a real network; network= is only "
                         f"for engine='sim'")
    if engine == "threads":
        from dsml.comm.threads import run_threads
        return run_threads(program, world_size, args, kwargs, trace, timeout, failures)
    if engine == "mpi":
        from dsml.comm.mpi import run_mpi
        return run_mpi(program, world_size, args, kwargs, trace, timeout)
    from dsml.comm.processes import run_processes
    return run_processes(program, world_size, args, kwargs, trace, timeout, failures)
