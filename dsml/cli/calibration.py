"""Plumbing (hand-written): `dsml calibrate` (α, β, γ of this machine, written as a network
file for the simulator) and `dsml validate` (every all-reduce algorithm for real against the
simulator's prediction with that network)."""
from __future__ import annotations

import os

from dsml.cli.pingpong import _print_fit
from dsml.cli.sizes import format_bytes, size_range

LARGE = 64 * 1024    # bytes: `dsml validate` summarises the sizes from here up apart


def calibrate(args) -> int:
    """`dsml calibrate`: measure α, β and γ on this machine the way collectives use the
    transport (`dsml.comm.calibrate`) and write them where the simulator can load them
    (dsml.net.load_network)."""
    import datetime
    import platform

    from dsml.comm.calibrate import WARM_UP_STEPS, calibrate as measure_network
    from dsml.net.saved import save_network

    if args.engine == "sim":
        raise ValueError("--engine sim is a model already: calibrate a real engine "
                         "(processes, threads or mpi)")
    sizes = size_range(args.begin, args.end, args.factor)
    print(f"# calibration, 2 ranks, engine {args.engine}: an exchange step (sendrecv, then the "
          f"received block copied or added into a new buffer) per size, {args.steps} timed of "
          f"each after {WARM_UP_STEPS} untimed, the slower rank's median, median of "
          f"{args.repeats} runs")
    print(f"#{'size (B)':>11} {'copy step (µs)':>15} {'add step (µs)':>14} "
          f"{'bandwidth (GB/s)':>17}")

    def report(nbytes, copy, add):
        print(f"{nbytes:>12d} {copy * 1e6:>15.2f} {add * 1e6:>14.2f} {nbytes / copy / 1e9:>17.4f}",
              flush=True)

    calibration = measure_network(args.engine, sizes, args.steps, args.repeats, report=report)
    measured = calibration.network
    _print_fit(measured.alpha, measured.beta)
    print(f"# gamma (the add step's slope minus the copy step's) = {measured.gamma * 1e9:.4f} ns/B")
    for warning in calibration.warnings:
        print(f"# warning: {warning}")
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
              "method": "exchange step (dsml.comm.calibrate.collective_steps)",
              "steps": args.steps, "repeats": args.repeats, "sizes": sizes,
              "step_seconds": calibration.step_seconds, "add_seconds": calibration.add_seconds,
              "warnings": calibration.warnings}
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
    with a calibrated network; the table of ratios."""
    from dsml.collectives import ALLREDUCE_ALGORITHMS
    from dsml.collectives.validate import BUDGET, available_cores, summary
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
        calibration = measure_network(args.engine, repeats=args.repeats)
        network = calibration.network
        source = f"calibrated now on {args.engine} (exchange steps 8 B … 4 MiB)"
        for warning in calibration.warnings:
            print(f"# calibration warning: {warning}")
    print(f"# dsml validate: all-reduce on engine {args.engine}, world sizes "
          f"{', '.join(map(str, world_sizes))}; each run: warm-ups, a barrier, then up to 200 "
          f"all-reduces ({format_bytes(BUDGET)} at most), each timed; a rank's median call, the "
          f"slowest rank; median of {args.repeats} runs, the algorithms taking turns")
    print(f"# model: {network}, {source}")
    if hasattr(os, "getloadavg"):        # other programs' load makes every measured time grow
        print(f"# load average at the start: {os.getloadavg()[0]:.1f} on {available_cores()} "
              f"cores")
    print("# predicted: the simulator running the same timed loop over that model; ratio = "
          "measured / predicted (above 1: the model is optimistic); spread: the fastest and "
          "slowest run")
    print(f"#{'p':>3} {'algorithm':>19} {'size (B)':>10} {'measured (µs)':>14} "
          f"{'spread (µs)':>17} {'predicted (µs)':>15} {'ratio':>7}")

    def report(row):
        low, high = row.spread
        print(f"{row.world_size:>4} {row.algorithm:>19} {row.nbytes:>10} "
              f"{row.measured * 1e6:>14.1f} {f'{low * 1e6:.1f}-{high * 1e6:.1f}':>17} "
              f"{row.predicted * 1e6:>15.1f} {row.ratio:>6.2f}x", flush=True)

    rows = run_validation(network, args.engine, algorithms, sizes, world_sizes, args.repeats,
                          report=report)
    cores = available_cores()
    for p in world_sizes:
        mine = [row for row in rows if row.world_size == p]
        median, worst = summary(mine)
        line = (f"# p = {p} ({'≤' if p <= cores else '>'} {cores} cores): measured / predicted "
                f"median {median:.2f}x, worst {worst:.2f}x")
        if any(row.nbytes >= LARGE for row in mine):
            median, worst = summary(mine, LARGE)
            line += f"; at ≥ 64 KiB median {median:.2f}x, worst {worst:.2f}x"
        print(line)
    return 0
