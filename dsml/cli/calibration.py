"""Plumbing (hand-written): `dsml calibrate` (α, β, γ of this machine, written as a network
file for the simulator) and `dsml validate` (every all-reduce algorithm for real against the
simulator's prediction with that network)."""
from __future__ import annotations

import os

import numpy as np

from dsml.cli.pingpong import _one_way_table, _print_fit
from dsml.cli.sizes import format_bytes, size_range


GAMMA_NBYTES = 16 * 1024**2     # `dsml calibrate` times np.add on vectors larger than the caches


def calibrate(args) -> int:
    """`dsml calibrate`: measure α and β (ping-pong, least squares) and γ (np.add) on this
    machine and write them where the simulator can load them (dsml.net.load_network)."""
    import datetime
    import platform

    from dsml.net.saved import save_network

    if args.engine == "sim":
        raise ValueError("--engine sim is a model already: calibrate a real engine "
                         "(processes, threads or mpi)")
    sizes, times, measured = _one_way_table(args, None, gamma_nbytes=GAMMA_NBYTES)
    _print_fit(measured.alpha, measured.beta)
    print(f"# gamma (np.add, float64, {format_bytes(GAMMA_NBYTES)}) = "
          f"{measured.gamma * 1e9:.4f} ns/B")
    if measured.beta == 0:
        raise ValueError("the fit resolved no size dependence (beta = 0); nothing written: "
                         "widen the size range (-e) or add --repeats")
    if args.engine == "mpi":
        from dsml.comm.mpi import job_rank
        if job_rank() != 0:           # every process measured; rank 0 alone writes the file
            return 0
    record = {"engine": args.engine, "host": platform.node(), "platform": platform.platform(),
              "python": platform.python_version(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "round_trips": args.round_trips, "repeats": args.repeats, "sizes": sizes,
              "one_way_seconds": times,
              "gamma_from": f"np.add of two float64 vectors of {GAMMA_NBYTES} bytes"}
    path = save_network(measured, args.output, record)
    print(f"# wrote {path}: {measured}")
    print(f"# load it with dsml.net.load_network({str(path)!r}), or pass --network {path} to "
          f"dsml bench --engine sim and dsml validate")
    return 0


def _validation_world_sizes(args) -> list[int]:
    if args.engine != "mpi":
        sizes = args.world_sizes or [2, 4]
    else:
        from dsml.comm.mpi import check_world_size, job_size
        given = args.world_sizes or [None]
        if len(given) != 1:
            raise ValueError("--engine mpi runs at the job's size: give one --world-sizes "
                             "value (or none) and launch with mpiexec -n P")
        sizes = [check_world_size(given[0], job_size(), "--world-sizes")]
    if any(p < 2 for p in sizes):
        raise ValueError(f"--world-sizes must be ≥ 2, got {sizes}")
    return sizes


def validate(args) -> int:
    """`dsml validate`: every all-reduce algorithm for real against the simulator's prediction
    with a calibrated network; the table of errors."""
    from dsml.collectives import ALLREDUCE_ALGORITHMS
    from dsml.collectives.validate import BUDGET, available_cores
    from dsml.collectives.validate import validate as run_validation
    from dsml.comm.calibrate import calibrate as measure_network
    from dsml.net.saved import load_network

    if args.engine == "sim":
        raise ValueError("--engine sim would hold the model against itself: validate a real "
                         "engine (processes, threads or mpi)")
    world_sizes = _validation_world_sizes(args)
    algorithms = args.algorithm or list(ALLREDUCE_ALGORITHMS)
    for name in algorithms:
        if name not in ALLREDUCE_ALGORITHMS:
            raise ValueError(f"unknown allreduce algorithm {name!r}; choose one of "
                             f"{', '.join(ALLREDUCE_ALGORITHMS)}")
    sizes = size_range(args.begin, args.end, args.factor)
    if args.network:
        network, source = load_network(args.network), f"loaded from {args.network}"
    else:
        if args.engine == "mpi" and world_sizes != [2]:
            raise ValueError("calibrating needs a 2-rank job: run `mpiexec -n 2 dsml calibrate "
                             "--engine mpi --output net.json` first, then pass --network net.json")
        network, _ = measure_network(args.engine, repeats=args.repeats)
        source = f"calibrated now on {args.engine} (ping-pong 1 B … 4 MiB, np.add)"
    print(f"# dsml validate: all-reduce on engine {args.engine}, world sizes "
          f"{', '.join(map(str, world_sizes))}; each run: warm-ups, a barrier, then as many "
          f"timed all-reduces as {format_bytes(BUDGET)} allows (5 to 200), the slowest rank's "
          f"time; median of {args.repeats} runs, the algorithms taking turns")
    print(f"# model: {network}, {source}")
    if hasattr(os, "getloadavg"):        # other programs' load makes every measured time grow
        print(f"# load average at the start: {os.getloadavg()[0]:.1f} on {available_cores()} "
              f"cores")
    print("# predicted: the simulator running the same timed loop over that model; "
          "error = predicted / measured - 1 (negative: the model is optimistic)")
    print(f"#{'p':>3} {'algorithm':>19} {'size (B)':>10} {'measured (µs)':>14} "
          f"{'predicted (µs)':>15} {'error':>8}")

    def report(row):
        print(f"{row.world_size:>4} {row.algorithm:>19} {row.nbytes:>10} "
              f"{row.measured * 1e6:>14.1f} {row.predicted * 1e6:>15.1f} "
              f"{100 * row.error:>+7.0f}%", flush=True)

    rows = run_validation(network, args.engine, algorithms, sizes, world_sizes, args.repeats,
                          report=report)
    cores = available_cores()
    for p in world_sizes:
        errors = [abs(row.error) for row in rows if row.world_size == p]
        large = [abs(row.error) for row in rows if row.world_size == p and row.nbytes >= 65536]
        print(f"# p = {p} ({'≤' if p <= cores else '>'} {cores} cores): median |error| "
              f"{100 * float(np.median(errors)):.0f}%, largest {100 * max(errors):.0f}%"
              + (f"; at ≥ 64 KiB median {100 * float(np.median(large)):.0f}%" if large else ""))
    return 0
