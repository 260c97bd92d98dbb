"""Plumbing (hand-written): the `dsml` command line.

    dsml pingpong [--engine processes|threads|sim|mpi] [-b 1] [-e 4M] [-f 4] [--round-trips N]
                  [--repeats N]
        ping-pong between two ranks over a range of sizes; prints one-way times, the
        effective bandwidth, and the α, β and n½ fitted by least squares.

    dsml bench <allreduce|broadcast|reduce|allgather|reduce_scatter|alltoall>
               [--algorithm NAME] [--engine sim|threads|processes|mpi] [--world-size P]
               [-b 8] [-e 64M] [-f 2] [--op sum|prod|max|min] [--dtype float32|...]
               [--root R] [--iters N] [--warmup N] [--alpha S --beta S/B --gamma S/B |
               --network FILE]
               [--check/--no-check]
        times a collective over a range of sizes and prints the nccl-tests table: size,
        count, type, redop, root, time, algbw, busbw (nccl-tests' correction factors) and
        #wrong, the elements that differ from a NumPy reference.

    dsml calibrate [--engine processes|threads|mpi] [-o dsml-network.json] [-b 1] [-e 4M]
                   [-f 4] [--round-trips N] [--repeats N]
        the ping-pong of `dsml pingpong` plus γ (np.add per byte); writes α, β, γ and how they
        were measured to a JSON file that dsml.net.load_network(path) loads for the simulator.

    dsml validate [--engine processes|threads|mpi] [--network FILE] [-p 2 4]
                  [--algorithm NAME ...] [-b 1K] [-e 4M] [-f 16] [--repeats N]
        runs each all-reduce algorithm for real over the sizes and world sizes, predicts each
        run on the simulator with the calibrated network (calibrating first without
        --network), and prints size, algorithm, measured, predicted and error %.

    dsml memory --model NAME | --layers L --hidden H --heads A --vocab V --seq-len S
                [--kv-heads K] [--ffn-hidden F] [--style gpt|llama]
                [--dp 1] [--tp 1] [--pp 1] [--zero 0] [--micro-batch 1] [--microbatches 1]
                [--recompute none|selective|full] [--sequence-parallel]
                [--precision mixed|fp32] [--schedule 1f1b|gpipe] [--seq-len S]
                [--devices N] [--global-batch B] [--device-memory GB]
        the memory accountant (dsml.memory): bytes per rank of one layout — parameters,
        gradients, optimizer state, activations, buffers — on the most loaded pipeline stage
        and on every stage; with --device-memory, whether it fits.

    dsml memory --model NAME --search --devices N --global-batch B --device-memory GB
                [--top 10] [--zero Z] [--micro-batch b] [--recompute R] [--precision P]
                [--schedule S]
        every layout dp·tp·pp = N (dsml.layout_search.search_layouts): how many fit, and the fastest
        that fit, with their bytes per rank and the step model's seconds and MFU.

With --engine mpi, run the command under mpiexec (`mpiexec -n 4 python -m dsml bench
allreduce --engine mpi`): every process runs one rank, the world size is the job's, and only
rank 0 prints.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys

import numpy as np

from dsml.collectives.cost import BUSBW_FACTORS, busbw_factor

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_size(text: str) -> int:
    """'8', '64K', '4M', '1G' -> bytes (binary units, as nccl-tests)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text.upper())
    if not match:
        raise argparse.ArgumentTypeError(f"size must look like 8, 64K, 4M or 1G, got {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


def size_range(begin: int, end: int, factor: int) -> list[int]:
    if factor < 2:
        raise ValueError(f"factor must be ≥ 2, got {factor}")
    if begin < 1 or end < begin:
        raise ValueError(f"need 1 ≤ begin ≤ end, got begin={begin}, end={end}")
    sizes, n = [], begin
    while n <= end:
        sizes.append(n)
        n *= factor
    return sizes


def _one_way_table(args, network, gamma_nbytes=None):
    """The ping-pong of `dsml pingpong` and `dsml calibrate`: print one row per size as it is
    measured; return (sizes, one-way times, the calibrated AlphaBeta; γ measured on
    `gamma_nbytes` bytes if given, else 0)."""
    from dsml.comm.calibrate import WARM_UP_ROUND_TRIPS, calibrate

    sizes = size_range(args.begin, args.end, args.factor)
    print(f"# ping-pong, 2 ranks, engine {args.engine}, {args.round_trips} round trips per run "
          f"after {WARM_UP_ROUND_TRIPS} untimed, median of {args.repeats} runs")
    # The units and the '#' of `dsml bench`'s table: µs and GB/s (1e9 B/s).
    print(f"#{'size (B)':>11} {'one-way (µs)':>14} {'bandwidth (GB/s)':>18}")

    def report(nbytes, seconds):
        print(f"{nbytes:>12d} {seconds * 1e6:>14.2f} {nbytes / seconds / 1e9:>18.4f}", flush=True)

    measured, times = calibrate(args.engine, sizes, args.round_trips, args.repeats,
                                gamma_nbytes=gamma_nbytes, network=network, report=report)
    return sizes, times, measured


def _print_fit(alpha: float, beta: float) -> None:
    from dsml.net.fit import half_performance_size

    if beta > 0:
        shape = (f"(peak {1 / beta / 1e9:.3f} GB/s), "
                 f"n_half = {half_performance_size(alpha, beta):.0f} B")
    else:   # the fit holds β at 0 when noise would make it negative: no finite peak
        shape = "(no size dependence resolved: widen the size range or add repeats)"
    print(f"# fit: alpha = {alpha * 1e6:.2f} µs, beta = {beta * 1e9:.4f} ns/B {shape}")


def pingpong(args) -> int:
    import dsml
    from dsml.net.fit import fit_alpha_beta

    network = dsml.net.AlphaBeta(args.alpha, args.beta) if args.engine == "sim" else None
    sizes, times, _ = _one_way_table(args, network)
    _print_fit(*fit_alpha_beta(sizes, times))
    return 0


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
                             "--engine mpi -o net.json` first, then pass --network net.json")
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
    print(f"#{'p':>3} {'algorithm':>19} {'size (B)':>10} {'measured (us)':>14} "
          f"{'predicted (us)':>15} {'error':>8}")

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


# --- dsml bench: the nccl-tests table ------------------------------------------------------------

BENCH_COLLECTIVES = ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
                     "alltoall")
REDUCING = ("allreduce", "reduce", "reduce_scatter")
ROOTED = ("broadcast", "reduce")
# Collectives whose size is a whole array cut into p equal blocks: nccl-tests rounds their
# element count down to a multiple of p.
BLOCKED = ("allgather", "reduce_scatter", "alltoall")
BENCH_DTYPES = ("float32", "float64", "int32", "int64")
# On the real engines a row runs at most this many bytes of collectives (iterations × size),
# so that the largest sizes do not take minutes; small sizes keep the full --iters.
DEFAULT_MAX_ITER_BYTES = 256 * 1024**2


SIZE_MEANING = {
    "allreduce": "the buffer every rank reduces (count elements each)",
    "broadcast": "the buffer the root sends to every rank",
    "reduce": "the buffer every rank contributes to the root's result",
    "allgather": "the gathered output; each rank contributes size/{p}",
    "reduce_scatter": "each rank's input; each rank keeps size/{p} of the result",
    "alltoall": "each rank's send buffer: {p} blocks of size/{p}, one per rank",
}


def format_bytes(nbytes: int) -> str:
    """1024 -> '1K', 3 * 1024**2 -> '3M' (the units of -b and -e); other sizes in bytes."""
    for unit in ("G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return f"{nbytes} B"


def bench_count(collective: str, nbytes: int, p: int, itemsize: int) -> int:
    """Elements of the buffer that `nbytes` describes, rounded down as nccl-tests does: to
    whole elements, and for all-gather, reduce-scatter and all-to-all to a multiple of p
    (each rank's block is equal). 0 means the size is too small to run."""
    count = nbytes // itemsize
    if collective in BLOCKED:
        count -= count % p
    return count


def default_algorithm(collective: str) -> str:
    """The algorithm the library uses when none is given (the `algorithm=` default)."""
    import inspect

    import dsml.collectives

    parameter = inspect.signature(getattr(dsml.collectives, collective)).parameters.get(
        "algorithm")
    if parameter is None:                      # all-to-all has a single algorithm
        return dsml.collectives.COLLECTIVE_ALGORITHMS[collective][0]
    return parameter.default


def iterations_for(nbytes: int, iters: int, max_iter_bytes: int) -> int:
    """--iters, scaled down so that iterations × nbytes ≤ max_iter_bytes (at least 1);
    max_iter_bytes = 0 keeps --iters for every size."""
    if max_iter_bytes <= 0:
        return iters
    return max(1, min(iters, max_iter_bytes // nbytes))


def exact_reduction(dtype: str, op: str, p: int) -> bool:
    """Whether reducing p inputs made by `bench_inputs` gives the same bits in any order,
    so that results can be compared bit for bit: always for integers, max and min; for
    float sums while p · 1.5 · 256 fits in the significand; for float products of powers of
    two while 2^±p neither overflows nor underflows."""
    if np.dtype(dtype).kind != "f" or op in ("max", "min"):
        return True
    info = np.finfo(dtype)
    if op == "sum":
        return p * 1.5 * 256 < 2.0 ** (info.nmant + 1)
    return p < min(info.maxexp, -info.minexp) - 1


def bench_inputs(count: int, p: int, dtype: str, op: str, seed: int) -> list:
    """Every rank's input: p random arrays of `count` elements.

    As in nccl-tests, the values make the reduction exact in any order where they can (see
    `exact_reduction`), so that a correct result equals NumPy's bit for bit: floats are
    multiples of 1/256 in [0.5, 1.5) (9 significant bits, so sums of many stay exact); float
    products use the powers of two 1/2, 1 and 2, or random floats in [0.5, 1.5) on so many
    ranks that powers of two would overflow. Integers are small; their products use 1..3,
    so that one zero does not wipe out every later factor (overflow wraps the same way in
    any order)."""
    inputs = []
    for rank in range(p):
        rng = np.random.default_rng([seed, rank])
        if np.dtype(dtype).kind == "f":
            if op == "prod" and exact_reduction(dtype, op, p):
                x = np.ldexp(np.ones(count, dtype=dtype), rng.integers(-1, 2, count))
            elif op == "prod":
                x = (rng.random(count) + 0.5).astype(dtype)
            else:
                x = (rng.integers(128, 384, count) / 256).astype(dtype)
        elif op == "prod":
            x = rng.integers(1, 4, count, dtype=dtype)
        else:
            x = rng.integers(-1000, 1000, count, dtype=dtype)
        inputs.append(x)
    return inputs


def bench_expected(collective: str, inputs: list, op: str, root: int):
    """What the collective should produce, computed with NumPy from every rank's input: the
    buffer every rank (or the root) should hold; for reduce-scatter the whole reduced vector,
    of which rank r keeps block r; None for all-to-all, whose check needs only the inputs."""
    from dsml.collectives import OPS

    if collective in REDUCING:
        total = inputs[0].copy()
        for x in inputs[1:]:
            OPS[_summed(op)](total, x, out=total)
        if op == "avg":                # the same division every rank makes (bench_rank)
            total = _average(total, len(inputs))
        return total
    if collective == "broadcast":
        return inputs[root]
    if collective == "allgather":
        return np.concatenate(inputs)
    return None


def _summed(op: str) -> str:
    """The reduction the collectives run for a bench op: "avg" is a sum, then a division."""
    return "sum" if op == "avg" else op


def _average(total: np.ndarray, p: int) -> np.ndarray:
    """NCCL's average (ncclAvg) as the benchmark computes it: the sum divided by p, in the
    buffer's dtype (floats only; see _validate_bench)."""
    return (total / total.dtype.type(p)).astype(total.dtype, copy=False)


def _count_wrong(got, want, rtol: float = 0.0) -> int:
    """Elements of `got` that differ from `want`: bit for bit when rtol = 0, else within a
    relative tolerance (floats whose reduction order matters). A result of the wrong shape
    or dtype, or None, is wrong everywhere."""
    if not isinstance(got, np.ndarray) or got.shape != want.shape or got.dtype != want.dtype:
        return max(want.size, 1)
    if rtol == 0.0:
        return int(np.count_nonzero(got != want))       # NaN != NaN: counted as wrong
    close = np.isclose(got, want, rtol=rtol, atol=np.finfo(want.dtype).tiny)
    return int(want.size - np.count_nonzero(close))


def _check_result(comm, spec, result) -> int:
    """Wrong elements in this rank's result (see bench_expected)."""
    collective, p, r = spec["collective"], comm.size, comm.rank
    dtype, op = spec["dtype"], spec["op"]
    # Where order matters: the rounding bound of two reductions of p terms in different orders.
    rtol = 0.0 if exact_reduction(dtype, _summed(op), p) else 2 * p * float(np.finfo(dtype).eps)
    if collective == "reduce" and r != spec["root"]:
        return 0 if result is None else 1          # only the root receives the result
    if collective == "alltoall":
        if not isinstance(result, list) or len(result) != p:
            return spec["count"]
        # entry j is block r of rank j's input
        return sum(_count_wrong(result[j], np.split(spec["inputs"][j], p)[r], rtol)
                   for j in range(p))
    want = spec["expected"]
    if collective == "reduce_scatter":
        want = np.split(want, p)[r]
    return _count_wrong(result, want, rtol)


def _barrier(comm):
    """Every rank leaves after every rank has arrived: an all-reduce of one element (its
    result depends on all ranks, so nobody can finish it early)."""
    import dsml.collectives

    yield from dsml.collectives.allreduce(comm, np.zeros(1), algorithm="recursive_doubling")


def bench_rank(comm, spec: dict):
    """The rank program of one table row: run `warmup` untimed collectives, line the ranks
    up, time `iters` back-to-back collectives with comm.now(), then check the last result.
    Returns (seconds per collective, wrong elements or None).

    `spec` holds every rank's input, built once per size by the caller (forked ranks share
    it without copying); a rank only reads its own, and the expected result."""
    import dsml.collectives

    collective, p = spec["collective"], comm.size
    # Looked up at run time, so that a test can substitute a broken collective; without the
    # enclosing trace slice of each call (dsml.comm.spans), which is not what is timed.
    function = getattr(dsml.collectives, collective)
    function = getattr(function, "__wrapped__", function)
    x = spec["inputs"][comm.rank]
    kwargs = {}
    if collective in ROOTED:
        kwargs["root"] = spec["root"]
    if collective in REDUCING:
        kwargs["op"] = _summed(spec["op"])
    average = spec["op"] == "avg" and collective in REDUCING
    if collective == "alltoall":
        payload = np.split(x, p)                   # block j goes to rank j
    else:
        kwargs["algorithm"] = spec["algorithm"]
        payload = x

    result = None
    for _ in range(spec["warmup"]):
        result = yield from function(comm, payload, **kwargs)
    times = []
    for _ in range(spec["repeats"]):          # each repeat: line up, then time `iters`
        if spec["barrier"]:
            yield from _barrier(comm)
        start = yield comm.now()
        for _ in range(spec["iters"]):
            result = yield from function(comm, payload, **kwargs)
            if average and result is not None:
                result = _average(result, p)
        end = yield comm.now()
        times.append((end - start) / spec["iters"])
    wrong = _check_result(comm, spec, result) if spec["check"] else None
    return times, wrong


def _validate_bench(args) -> None:
    from dsml.collectives import COLLECTIVE_ALGORITHMS

    if args.world_size < 1:
        raise ValueError(f"--world-size must be ≥ 1, got {args.world_size}")
    algorithms = COLLECTIVE_ALGORITHMS[args.collective]
    if args.algorithm not in algorithms:
        raise ValueError(f"unknown {args.collective} algorithm {args.algorithm!r}; choose one "
                         f"of {', '.join(algorithms)}")
    if not 0 <= args.root < args.world_size:
        raise ValueError(f"--root must be a rank in 0..{args.world_size - 1}, got {args.root}")
    if args.iters < 1:
        raise ValueError(f"--iters must be ≥ 1, got {args.iters}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be ≥ 0, got {args.warmup}")
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {args.timeout}")
    if args.op == "avg" and np.dtype(args.dtype).kind != "f":
        raise ValueError(f"--op avg needs a float --dtype (the average of integers is not "
                         f"one), got {args.dtype}")


def _bench_network(args):
    """The simulator's AlphaBeta model (defaults for what is not given); None on real engines,
    where --alpha, --beta and --gamma mean nothing (a warning says so)."""
    import dsml

    given = (args.alpha, args.beta, args.gamma)
    if args.network is not None:
        if args.engine != "sim":
            raise ValueError(f"--network is a model for --engine sim; {args.engine} measures "
                             f"the real one")
        if any(value is not None for value in given):
            raise ValueError("give either --network or --alpha/--beta/--gamma, not both")
        from dsml.net.saved import load_network
        return load_network(args.network)
    if args.engine == "sim":
        alpha, beta, gamma = (default if value is None else value
                              for value, default in zip(given, (5e-6, 1e-10, 0.0)))
        return dsml.net.AlphaBeta(alpha, beta, gamma)
    if any(value is not None for value in given):
        print(f"dsml: warning: --alpha, --beta and --gamma only apply to --engine sim; "
              f"ignored on {args.engine}", file=sys.stderr)
    return None


def _bench_counts(args, itemsize: int) -> list[int]:
    """The element count of each row: the requested sizes rounded down (bench_count), empty
    and repeated ones left out."""
    counts = []
    for nbytes in size_range(args.begin, args.end, args.factor):
        count = bench_count(args.collective, nbytes, args.world_size, itemsize)
        if count > 0 and count not in counts:
            counts.append(count)
    return counts


def _print_bench_header(args, network, itemsize: int) -> None:
    collective, p = args.collective, args.world_size
    reducing, rooted = collective in REDUCING, collective in ROOTED
    print(f"# dsml bench {collective}: engine {args.engine}, {p} rank{'s' * (p != 1)}, "
          f"algorithm {args.algorithm}, dtype {args.dtype}, "
          f"op {args.op if reducing else 'none'}" + (f", root {args.root}" if rooted else ""))
    if network is not None:
        print(f"# network: AlphaBeta(alpha={network.alpha:g} s, beta={network.beta:g} s/B, "
              f"gamma={network.gamma:g} s/B)")
        print("# time: simulated time of one collective, the slowest rank's (deterministic, "
              "so no warm-up, one iteration, and -a does not apply)")
    else:
        print(f"# time: mean of {args.iters} back-to-back collectives, read with comm.now() "
              f"in each rank after {args.warmup} untimed warm-up collectives; over ranks, "
              f"{AVERAGE_MEANING[args.average]} (-a {args.average}); over {args.repeats} "
              f"repeat{'s' * (args.repeats != 1)} of that, the median, and the min-max in "
              f"'spread'")
        if args.max_iter_bytes > 0:
            print(f"# iterations: fewer for large sizes, so that iterations × size ≤ "
                  f"{format_bytes(args.max_iter_bytes)} (at least 1; --max-iter-bytes 0 "
                  f"turns this off)")
    print(f"# size: {SIZE_MEANING[collective].format(p=p)}; count: "
          + ("elements per rank (size / p / itemsize, as nccl-tests prints it)"
             if collective in BLOCKED else "elements (size / itemsize)"))
    if collective in BLOCKED:
        print(f"# sizes rounded down to a multiple of p × itemsize = {p * itemsize} B "
              f"(nccl-tests rounds the count down); smaller sizes skipped")
    else:
        print(f"# sizes rounded down to whole {itemsize}-byte elements; smaller sizes skipped")
    print(f"# busbw = algbw × {busbw_factor(collective, p):g} ({BUSBW_FACTORS[collective]})")
    if not args.check:
        print("# #wrong: not checked (--no-check)")
    elif exact_reduction(args.dtype, args.op, p):
        print("# #wrong: elements of all ranks unlike a NumPy reference, bit for bit (the "
              "inputs make any reduction order exact)")
    else:
        print(f"# #wrong: elements of all ranks unlike a NumPy reference beyond a relative "
              f"{2 * p * float(np.finfo(args.dtype).eps):.1e} (rounding)")
    print("#")
    print(f"#{'size (B)':>13} {'count':>12} {'type':>8} {'redop':>6} {'root':>5} "
          f"{'time (µs)':>12} {'spread (µs)':>19} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13} "
          f"{'#wrong':>7}")


AVERAGE_MEANING = {0: "rank 0's", 1: "the mean", 2: "the fastest rank's",
                   3: "the slowest rank's"}
_OVER_RANKS = {0: lambda times: times[0], 1: lambda times: sum(times) / len(times),
               2: min, 3: max}


def _bench_row(args, network, count: int, seed: int) -> tuple[list, int | None]:
    """Run one size: build the inputs and the expected result, then one dsml.run with the
    warm-up, the repeats and their iterations inside the rank program. Returns (seconds per
    collective of each repeat, combined over ranks as -a says; wrong elements over all ranks
    or None)."""
    import dsml

    collective, p = args.collective, args.world_size
    sim = args.engine == "sim"
    nbytes = count * np.dtype(args.dtype).itemsize
    iters = 1 if sim else iterations_for(nbytes, args.iters, args.max_iter_bytes)
    inputs = bench_inputs(count // p if collective == "allgather" else count, p, args.dtype,
                          args.op, seed)
    expected = bench_expected(collective, inputs, args.op, args.root) if args.check else None
    spec = {"collective": collective, "algorithm": args.algorithm, "count": count,
            "dtype": args.dtype, "op": args.op, "root": args.root, "inputs": inputs,
            "expected": expected, "iters": iters,
            "warmup": 0 if sim else min(args.warmup, iters),
            "repeats": 1 if sim else args.repeats,
            "barrier": not sim and p > 1, "check": args.check}
    result = dsml.run(bench_rank, p, engine=args.engine, network=network, args=(spec,),
                      trace=False, timeout=args.timeout)
    # On the simulator the time of a collective is its makespan, the slowest rank's (what
    # the cost model predicts); -a is for measured times, which differ from rank to rank.
    over_ranks = max if sim else _OVER_RANKS[args.average]
    repeats = [over_ranks([value[0][k] for value in result.values])
               for k in range(spec["repeats"])]
    wrong = sum(value[1] for value in result.values) if args.check else None
    return repeats, wrong


def _bench_world_size(args) -> int:
    """--world-size: 4 by default; on engine mpi the job's size, which it must equal if given."""
    if args.engine != "mpi":
        return 4 if args.world_size is None else args.world_size
    from dsml.comm.mpi import check_world_size, job_size, launch_hint

    size = job_size()
    if size == 1:            # not started by mpiexec: a 1-rank "benchmark" measures nothing
        raise ValueError(f"--engine mpi runs inside an MPI job of two or more processes, and "
                         f"this process is not in one: {launch_hint(args.world_size or 4)}")
    return check_world_size(args.world_size, size, "--world-size")


def bench(args) -> int:
    """`dsml bench`: print the nccl-tests table for one collective; exit status 1 if any
    element was wrong."""
    args.world_size = _bench_world_size(args)
    if args.algorithm is None:
        args.algorithm = default_algorithm(args.collective)
    _validate_bench(args)
    network = _bench_network(args)
    collective, p = args.collective, args.world_size
    itemsize = np.dtype(args.dtype).itemsize
    factor = busbw_factor(collective, p)
    counts = _bench_counts(args, itemsize)
    _print_bench_header(args, network, itemsize)

    redop = args.op if collective in REDUCING else "none"
    root = args.root if collective in ROOTED else -1
    rows = []
    busbws, total_wrong = [], 0
    for seed, count in enumerate(counts):
        repeats, wrong = _bench_row(args, network, count, seed)
        seconds = float(np.median(repeats))
        low, high = min(repeats), max(repeats)
        nbytes = count * itemsize
        algbw = busbw = None
        if seconds > 0:
            algbw = nbytes / seconds / 1e9
            busbw = algbw * factor
            busbws.append(busbw)
            bandwidths = f"{algbw:>13.3f} {busbw:>13.3f}"
        else:                                  # p = 1 on sim, or a network that costs nothing
            bandwidths = f"{'-':>13} {'-':>13}"
        spread = "-" if len(repeats) == 1 else f"{low * 1e6:.2f}-{high * 1e6:.2f}"
        shown_count = count // p if collective in BLOCKED else count
        total_wrong += wrong or 0
        print(f"{nbytes:>14} {shown_count:>12} {args.dtype:>8} {redop:>6} {root:>5} "
              f"{seconds * 1e6:>12.2f} {spread:>19} {bandwidths} "
              f"{'N/A' if wrong is None else wrong:>7}", flush=True)
        rows.append((nbytes, shown_count, args.dtype, redop, root, seconds * 1e6, low * 1e6,
                     high * 1e6, algbw, busbw, wrong))

    if args.check:
        print(f"# Wrong elements : {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}")
    average = sum(busbws) / len(busbws) if busbws else 0.0
    print(f"# Avg bus bandwidth : {average:.3f} GB/s")
    if args.output_file:
        _write_bench_csv(args.output_file, rows)
    return 1 if total_wrong else 0


BENCH_CSV_COLUMNS = ("size_B", "count", "type", "redop", "root", "time_us", "min_us", "max_us",
                     "algbw_GBps", "busbw_GBps", "wrong")


def _write_bench_csv(path, rows) -> None:
    """-F: the table as CSV, one header row (units in the names) and a row per size; empty
    cells where the table prints '-' or 'N/A'."""
    import csv

    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(BENCH_CSV_COLUMNS)
        for row in rows:
            writer.writerow(["" if value is None else
                             f"{value:.6g}" if isinstance(value, float) else value
                             for value in row])


# --- dsml memory: the memory accountant and the layout search ------------------------------------

MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "buffers", "total")
# The explicit model: these sizes, plus --seq-len; --kv-heads and --ffn-hidden are optional.
MODEL_SIZES = ("layers", "hidden", "heads", "vocab", "seq_len")
MODEL_OPTIONAL = ("kv_heads", "ffn_hidden")
# What `dsml memory --search` chooses itself, so cannot be given with it.
SEARCH_CHOOSES = ("dp", "tp", "pp", "microbatches", "sequence_parallel")


def _flag(name: str) -> str:
    """'micro_batch' -> '--micro-batch': an argument as the user typed it."""
    return "--" + name.replace("_", "-")


def memory_model(args):
    """The TransformerConfig that `dsml memory` describes: a preset (--seq-len, if given,
    replaces its sequence length) or the explicit sizes, GPT's recipe or Llama's (--style)."""
    import dataclasses

    from dsml.model_config import PRESETS, TransformerConfig, preset

    explicit = [name for name in MODEL_SIZES[:-1] + MODEL_OPTIONAL
                if getattr(args, name) is not None]
    if args.model is not None:
        if explicit or args.style is not None:
            extra = [_flag(name) for name in explicit] + ["--style"] * (args.style is not None)
            raise ValueError(f"give either --model or explicit sizes, not both: --model "
                             f"{args.model} with {', '.join(extra)}")
        config = preset(args.model)
        if args.seq_len is not None and args.seq_len != config.seq_len:
            # With learned positions the position table changes with it (seq_len × hidden).
            config = dataclasses.replace(config, seq_len=args.seq_len)
        return config
    missing = [_flag(name) for name in MODEL_SIZES if getattr(args, name) is None]
    if len(missing) == len(MODEL_SIZES):
        raise ValueError(f"give --model NAME (one of {', '.join(PRESETS)}) or the sizes "
                         f"--layers, --hidden, --heads, --vocab and --seq-len")
    if missing:
        raise ValueError(f"explicit sizes need --layers, --hidden, --heads, --vocab and "
                         f"--seq-len; missing {', '.join(missing)}")
    sizes = tuple(getattr(args, name) for name in MODEL_SIZES)
    name = (f"{args.style or 'gpt'}-style l={args.layers} h={args.hidden} a={args.heads} "
            f"V={args.vocab}")
    if args.style == "llama":
        if args.ffn_hidden is None:
            raise ValueError("--style llama needs --ffn-hidden: a SwiGLU MLP's width is no "
                             "fixed multiple of hidden (llama2-7b: hidden 4096, ffn 11008)")
        return TransformerConfig.llama_style(*sizes, ffn_hidden=args.ffn_hidden,
                                             kv_heads=args.kv_heads, name=name)
    config = TransformerConfig.gpt_style(*sizes, name=name)
    overrides = {field: getattr(args, field) for field in MODEL_OPTIONAL
                 if getattr(args, field) is not None}
    # replace() runs the config's checks again on the new values
    return dataclasses.replace(config, **overrides) if overrides else config


def memory_layout(args):
    """The Layout of `dsml memory` without --search. With --global-batch the micro-batches per
    step follow from it: m = global batch / (dp × micro-batch)."""
    import dataclasses

    from dsml.memory import Layout

    def given(name, default):
        value = getattr(args, name)
        return default if value is None else value

    given_m = args.microbatches
    layout = Layout(dp=given("dp", 1), tp=given("tp", 1), pp=given("pp", 1),
                    zero=given("zero", 0), micro_batch=given("micro_batch", 1),
                    microbatches=given("microbatches", 1), recompute=given("recompute", "none"),
                    sequence_parallel=args.sequence_parallel, precision=args.precision,
                    schedule=args.schedule)
    if args.devices is not None and layout.devices != args.devices:
        raise ValueError(f"dp × tp × pp must equal --devices {args.devices}, got "
                         f"{layout.dp} × {layout.tp} × {layout.pp} = {layout.devices}")
    if args.global_batch is not None:
        per_microbatch = layout.dp * layout.micro_batch
        if args.global_batch < 1 or args.global_batch % per_microbatch:
            raise ValueError(f"--global-batch must be a positive multiple of dp × micro-batch "
                             f"= {layout.dp} × {layout.micro_batch} = {per_microbatch}, got "
                             f"{args.global_batch}")
        m = args.global_batch // per_microbatch
        if given_m is not None and given_m != m:
            raise ValueError(f"--microbatches {given_m} disagrees with --global-batch "
                             f"{args.global_batch} = dp × micro-batch × microbatches = "
                             f"{layout.dp} × {layout.micro_batch} × {m}")
        layout = dataclasses.replace(layout, microbatches=m)
    return layout


def _describe_model(config) -> str:
    """'gpt2, 124,439,808 parameters (exact), seq_len 1024' (and the preset's own seq_len when
    --seq-len changed it)."""
    from dsml.model_config import PRESETS

    text = f"{config.name}, {config.num_params():,} parameters (exact), seq_len {config.seq_len}"
    original = PRESETS.get(config.name)
    if original is not None and original.seq_len != config.seq_len:
        text += f" (the preset's: {original.seq_len})"
    return text


def _device_bytes(args) -> float | None:
    """--device-memory (GB) in bytes; None when not given."""
    from dsml.memory import GB

    if args.device_memory is None:
        return None
    if not args.device_memory > 0:
        raise ValueError(f"--device-memory must be > 0 GB, got {args.device_memory}")
    return args.device_memory * GB


def _gb(nbytes: float) -> str:
    from dsml.memory import GB

    return f"{nbytes / GB:.3f}"


def _fits_line(total: float, device_bytes: float, device_memory: float) -> str:
    if total <= device_bytes:
        return (f"# fits in {device_memory:g} GB: yes, {_gb(total)} GB per rank "
                f"({_gb(device_bytes - total)} GB to spare)")
    return (f"# fits in {device_memory:g} GB: no, {_gb(total)} GB per rank "
            f"({_gb(total - device_bytes)} GB over)")


def _hardware_assumptions() -> str:
    """estimate_step's defaults, read from its signature, as one line."""
    import inspect

    from dsml.step_model import estimate_step

    defaults = {name: parameter.default
                for name, parameter in inspect.signature(estimate_step).parameters.items()}
    return (f"{defaults['device_flops'] / 1e12:g} TFLOP/s peak per device, large matrix "
            f"products at {defaults['gemm_efficiency']:g} of it (fitted), "
            f"{defaults['memory_bandwidth'] / 1e12:g} TB/s memory, "
            f"{defaults['intra_node_bandwidth'] / 1e9:g} GB/s within "
            f"{defaults['devices_per_node']}-device nodes, "
            f"{defaults['inter_node_bandwidth'] / 1e9:g} GB/s across")


def _memory_one_layout(args, config) -> int:
    from dsml.memory import memory_per_rank, params_per_rank, stage_memory
    from dsml.step_model import estimate_step

    layout = memory_layout(args)
    device_bytes = _device_bytes(args)
    binding = memory_per_rank(config, layout)      # checks the split (tp, pp) first
    stages = [stage_memory(config, layout, stage) for stage in range(layout.pp)]
    step = estimate_step(config, layout)
    print(f"# dsml memory: {_describe_model(config)}")
    print(f"# layout: {layout.label()} on {layout.devices} device{'s' * (layout.devices > 1)}; "
          f"{layout.microbatches} micro-batch{'es' * (layout.microbatches > 1)} per step "
          f"(global batch {layout.global_batch}), schedule {layout.schedule}, precision "
          f"{layout.precision}")
    print("# bytes per rank: ZeRO model states (Rajbhandari et al. 2020), activations "
          "(Korthikanti et al. 2022) × micro-batches in flight, buffers; GB = 1e9 B")
    where = f"stage {binding.stage} of {layout.pp}" if layout.pp > 1 else "every rank alike"
    print(f"# the most loaded rank: {where}, "
          f"{params_per_rank(config, layout.tp, layout.pp, binding.stage):,} parameters held")
    print(f"#{'part':>12} {'bytes':>20} {'GB':>10}")
    for part in MEMORY_PARTS:
        nbytes = getattr(binding, part)
        print(f"{part:>13} {nbytes:>20,.0f} {_gb(nbytes):>10}")
    if layout.pp > 1:
        print("# per pipeline stage (GB):")
        print(f"#{'stage':>5} {'parameters':>15} " + " ".join(
            f"{part:>11}" for part in MEMORY_PARTS))
        for memory in stages:
            held = params_per_rank(config, layout.tp, layout.pp, memory.stage)
            print(f"{memory.stage:>6} {held:>15,} " + " ".join(
                f"{_gb(getattr(memory, part)):>11}" for part in MEMORY_PARTS))
    print(f"# step model (estimate_step: {_hardware_assumptions()}; the data-parallel "
          f"gradient reduction overlaps the backward when pp = 1): "
          f"{step.seconds:.4g} s, MFU {step.mfu:.3f}")
    if device_bytes is not None:
        print(_fits_line(binding.total, device_bytes, args.device_memory))
    return 0


def _memory_search(args, config) -> int:
    import inspect

    from dsml.memory import Layout
    from dsml.layout_search import search_layouts

    for name in SEARCH_CHOOSES:
        if getattr(args, name) not in (None, False):
            raise ValueError(f"--search chooses dp, tp, pp, the micro-batches per step and "
                             f"sequence parallelism itself; drop {_flag(name)}")
    for name in ("devices", "global_batch", "device_memory"):
        if getattr(args, name) is None:
            raise ValueError(f"--search needs --devices, --global-batch and --device-memory; "
                             f"missing {_flag(name)}")
    top = 10 if args.top is None else args.top
    if top < 1:
        raise ValueError(f"--top must be ≥ 1, got {top}")
    device_bytes = _device_bytes(args)
    defaults = inspect.signature(search_layouts).parameters
    micro_batches = (defaults["micro_batches"].default if args.micro_batch is None
                     else (args.micro_batch,))
    zero_stages = defaults["zero_stages"].default if args.zero is None else (args.zero,)
    recompute = defaults["recompute"].default if args.recompute is None else (args.recompute,)
    # search_layouts builds a Layout only where dp·tp·pp splits the model: check the restricting
    # choices here, so that a bad one is named even when no layout exists.
    for b in micro_batches:
        for zero in zero_stages:
            for choice in recompute:
                Layout(zero=zero, micro_batch=b, recompute=choice, precision=args.precision,
                       schedule=args.schedule)
    results = search_layouts(config, args.devices, args.global_batch, device_bytes,
                             micro_batches=micro_batches, zero_stages=zero_stages,
                             recompute=recompute, precision=args.precision,
                             schedule=args.schedule, only_fitting=False)
    if not results:
        raise ValueError(
            f"no layout of {args.devices} devices splits {config.name} with global batch "
            f"{args.global_batch}: tp must divide heads={config.heads}, "
            f"kv_heads={config.kv_heads} and ffn_hidden={config.ffn_hidden}, pp must divide "
            f"layers={config.layers}, and dp × micro-batch (micro-batch in "
            f"{', '.join(map(str, micro_batches))}) must divide the global batch")
    fitting = [result for result in results if result.fits]
    print(f"# dsml memory --search: {_describe_model(config)}; {args.devices} devices, "
          f"global batch {args.global_batch}, {args.device_memory:g} GB per device")
    print(f"# layouts: dp·tp·pp = {args.devices} (tp dividing heads, kv_heads and ffn_hidden, "
          f"pp dividing layers); micro-batch {', '.join(map(str, micro_batches))} (dp × "
          f"micro-batch dividing the global batch);")
    print(f"#   ZeRO {', '.join(map(str, zero_stages))} (above 0 only with dp > 1, above 1 only "
          f"with pp = 1); recompute "
          f"{', '.join(recompute)}; sequence parallelism on and off when tp > 1; precision "
          f"{args.precision}, schedule {args.schedule}")
    print("# GB/rank: the most loaded rank (its pipeline stage: stage), GB = 1e9 B; "
          "m: micro-batches per step")
    print(f"# step: estimate_step's model ({_hardware_assumptions()}); "
          f"MFU = model FLOPs / (devices × peak × step)")
    if not fitting:
        smallest = min(results, key=lambda result: result.memory.total)
        print(f"# 0 of {len(results)} layouts fit in {args.device_memory:g} GB; the smallest "
              f"needs {_gb(smallest.memory.total)} GB per rank: {smallest.layout.label()}, "
              f"m {smallest.layout.microbatches}")
        return 0
    shown = fitting[:top]
    print(f"# {len(fitting)} of {len(results)} layouts fit in {args.device_memory:g} GB; the "
          f"fastest {len(shown)} (equal steps: less memory first):")
    print(f"#{'rank':>4} {'step (s)':>10} {'MFU':>7} {'GB/rank':>9} {'stage':>6} {'m':>5}  layout")
    for position, result in enumerate(shown, start=1):
        print(f"{position:>5} {result.step.seconds:>10.4g} {result.step.mfu:>7.4f} "
              f"{_gb(result.memory.total):>9} {result.memory.stage:>6} "
              f"{result.layout.microbatches:>5}  {result.layout.label()}")
    return 0


def memory(args) -> int:
    """`dsml memory`: bytes per rank of one layout (dsml.memory.memory_per_rank), or with
    --search the layouts of a cluster that fit, fastest first (dsml.layout_search.search_layouts)."""
    config = memory_model(args)
    if args.search:
        return _memory_search(args, config)
    if args.top is not None:
        raise ValueError("--top applies to --search only")
    return _memory_one_layout(args, config)


def _ping_pong_arguments(parser, round_trips: int) -> None:
    """What `dsml pingpong` and `dsml calibrate` both take: the engine and the sizes, round
    trips and repeats of the ping-pong (`_one_way_table`)."""
    import dsml

    parser.add_argument("--engine", choices=dsml.ENGINES, default="processes",
                        help="default processes")
    parser.add_argument("-b", "--begin", type=parse_size, default=1,
                        help="smallest size (default 1)")
    parser.add_argument("-e", "--end", type=parse_size, default=4 * 1024**2,
                        help="largest size (default 4M)")
    parser.add_argument("-f", "--factor", type=int, default=4, help="size multiplier (default 4)")
    parser.add_argument("--round-trips", type=int, default=round_trips,
                        help=f"timed round trips per run, at every size (default {round_trips})")
    parser.add_argument("--repeats", type=int, default=3, help="runs per size (median; default 3)")


# Bounds a command checks before it starts anything, so that a typo refuses at once instead
# of running for hours or exhausting memory.
MAX_BENCH_WORLD_SIZE = 1024        # dsml bench --world-size (an all-to-all is p² messages)
MAX_SEARCH_DEVICES = 1 << 20       # dsml memory --search --devices (about a million)
ARRAY_COPIES = {"pingpong": 2, "calibrate": 2, "validate": 4, "bench": 4}   # see _check_sizes


def _physical_memory() -> int | None:
    """Bytes of RAM of this machine, or None where the system does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _check_sizes(args, ranks: int) -> None:
    """-e/--end must leave the arrays of a run (about ARRAY_COPIES per rank: inputs, results,
    what is in flight) in this machine's memory."""
    end = getattr(args, "end", None)
    memory = _physical_memory()
    if end is None or memory is None:
        return
    needed = ARRAY_COPIES[args.command] * ranks * end
    if needed > memory:
        raise ValueError(f"-e/--end {end:,} B needs about {needed / 1e9:,.3g} GB of arrays "
                         f"({ARRAY_COPIES[args.command]} copies on each of {ranks} ranks); this "
                         f"machine has {memory / 1e9:.3g} GB: give a smaller --end")


def check_arguments(args) -> None:
    """Checks every command shares (counts ≥ 1, sizes that fit in memory) and the bounds
    above; raise ValueError naming the flag, the value and the valid range."""
    for name in ("round_trips", "repeats", "iters", "top"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ValueError(f"{_flag(name)} must be ≥ 1, got {value}")
    if args.command == "bench":
        p = args.world_size
        if p is not None and not 1 <= p <= MAX_BENCH_WORLD_SIZE:
            raise ValueError(f"--world-size must be in 1..{MAX_BENCH_WORLD_SIZE}, got {p}")
        _check_sizes(args, 4 if p is None else p)
    elif args.command in ARRAY_COPIES:
        _check_sizes(args, 2)
    if args.command == "memory" and args.search and args.devices is not None \
            and args.devices > MAX_SEARCH_DEVICES:
        raise ValueError(f"--devices must be at most {MAX_SEARCH_DEVICES:,} for --search, got "
                         f"{args.devices:,}")


def main(argv=None) -> int:
    import dsml

    parser = argparse.ArgumentParser(prog="dsml", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"dsml {dsml.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    pp = commands.add_parser("pingpong", help="measure one-way message time and fit α, β")
    _ping_pong_arguments(pp, round_trips=20)
    pp.add_argument("--alpha", type=float, default=5e-6, help="engine sim: latency (s)")
    pp.add_argument("--beta", type=float, default=1e-10, help="engine sim: time per byte (s/B)")
    cal = commands.add_parser("calibrate", help="measure α, β, γ of this machine and write "
                                                "them as a network file for the simulator")
    _ping_pong_arguments(cal, round_trips=10)
    cal.add_argument("-o", "--output", default="dsml-network.json",
                     help="where to write the network file (default dsml-network.json)")
    val = commands.add_parser("validate", help="run every all-reduce algorithm for real and "
                                               "hold it against the simulator's prediction")
    val.add_argument("--engine", choices=dsml.ENGINES,
                     default="processes", help="default processes")
    val.add_argument("--network", default=None,
                     help="a network file from dsml calibrate (default: calibrate first)")
    val.add_argument("-p", "--world-sizes", type=int, nargs="+", default=None,
                     help="world sizes (default 2 4; engine mpi: the job's size)")
    val.add_argument("--algorithm", nargs="+", default=None,
                     help="all-reduce algorithms (default: all of them)")
    val.add_argument("-b", "--begin", type=parse_size, default=1024,
                     help="smallest size (default 1K)")
    val.add_argument("-e", "--end", type=parse_size, default=4 * 1024**2,
                     help="largest size (default 4M)")
    val.add_argument("-f", "--factor", type=int, default=16, help="size multiplier (default 16)")
    val.add_argument("--repeats", type=int, default=3, help="runs per point (median; default 3)")
    bench_parser = commands.add_parser(
        "bench", help="time a collective over a range of sizes (the nccl-tests table)")
    bench_parser.add_argument("collective", choices=BENCH_COLLECTIVES)
    bench_parser.add_argument("--algorithm", default=None,
                              help="one of dsml.collectives.COLLECTIVE_ALGORITHMS[collective] "
                                   "(default: the library's default)")
    bench_parser.add_argument("--engine", choices=dsml.ENGINES, default="processes",
                              help="default processes")
    bench_parser.add_argument("-p", "--world-size", type=int, default=None,
                              help="number of ranks (default 4; engine mpi: the job's size)")
    bench_parser.add_argument("-b", "--begin", type=parse_size, default=8,
                              help="smallest size (default 8)")
    bench_parser.add_argument("-e", "--end", type=parse_size, default=64 * 1024**2,
                              help="largest size (default 64M)")
    bench_parser.add_argument("-f", "--factor", type=int, default=2,
                              help="size multiplier (default 2)")
    bench_parser.add_argument("-o", "--op", choices=("sum", "prod", "max", "min", "avg"),
                              default="sum", help="reduction (reducing collectives only; avg: "
                                                  "the sum divided by p, float types only)")
    bench_parser.add_argument("-d", "--dtype", choices=BENCH_DTYPES, default="float32",
                              help="element type (no bfloat16: NumPy has no such dtype)")
    bench_parser.add_argument("-r", "--root", type=int, default=0,
                              help="root rank of broadcast and reduce (default 0)")
    bench_parser.add_argument("-n", "--iters", type=int, default=20,
                              help="timed iterations per size on real engines (default 20)")
    bench_parser.add_argument("-w", "--warmup", type=int, default=5,
                              help="untimed iterations first (default 5, as nccl-tests)")
    bench_parser.add_argument("-a", "--average", type=int, choices=(0, 1, 2, 3), default=1,
                              help="time over ranks: 0 rank 0's, 1 the mean (default, as "
                                   "nccl-tests), 2 the minimum, 3 the maximum")
    bench_parser.add_argument("--repeats", type=int, default=3,
                              help="real engines: timed blocks of --iters per size; the table "
                                   "shows their median and min-max (default 3)")
    bench_parser.add_argument("-F", "--output-file", default=None,
                              help="also write the table to this CSV file")
    bench_parser.add_argument("--max-iter-bytes", type=parse_size,
                              default=DEFAULT_MAX_ITER_BYTES,
                              help="real engines: fewer iterations for large sizes, so that "
                                   "iterations × size ≤ this (default 256M; 0: always --iters)")
    bench_parser.add_argument("--alpha", type=float, default=None,
                              help="engine sim: latency (s, default 5e-6)")
    bench_parser.add_argument("--beta", type=float, default=None,
                              help="engine sim: time per byte (s/B, default 1e-10)")
    bench_parser.add_argument("--gamma", type=float, default=None,
                              help="engine sim: reduction time per byte (s/B, default 0)")
    bench_parser.add_argument("--network", default=None,
                              help="engine sim: a network file from dsml calibrate (instead of "
                                   "--alpha, --beta, --gamma)")
    bench_parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                              help="count wrong elements against NumPy (default on)")
    bench_parser.add_argument("--timeout", type=float, default=600.0,
                              help="real engines: seconds allowed per size (default 600)")
    mem = commands.add_parser(
        "memory", help="bytes per rank of a training layout (the memory accountant), or "
                       "--search: the layouts of a cluster that fit, fastest first")
    model = mem.add_argument_group("model: a preset, or explicit sizes")
    model.add_argument("--model", default=None,
                       help="a preset of dsml.model_config.PRESETS (gpt2, …, llama2-70b)")
    for name, meaning in (("layers", "transformer blocks"), ("hidden", "model width"),
                          ("heads", "query heads"), ("vocab", "vocabulary size")):
        model.add_argument(_flag(name), type=int, default=None, help=meaning)
    model.add_argument("--seq-len", type=int, default=None,
                       help="sequence length (with --model: replaces the preset's; with "
                            "learned positions the position table follows it)")
    model.add_argument("--kv-heads", type=int, default=None,
                       help="key/value heads (default: heads)")
    model.add_argument("--ffn-hidden", type=int, default=None,
                       help="MLP width (gpt default 4 × hidden; llama: required)")
    model.add_argument("--style", choices=("gpt", "llama"), default=None,
                       help="gpt (default): learned positions, LayerNorm, GELU, biases, tied "
                            "head; llama: rotary, RMSNorm, SwiGLU, no biases, untied head")
    lay = mem.add_argument_group("layout")
    for name, kind in (("dp", "data"), ("tp", "tensor"), ("pp", "pipeline")):
        lay.add_argument(_flag(name), type=int, default=None,
                         help=f"{kind}-parallel size (default 1)")
    lay.add_argument("--zero", type=int, default=None, help="ZeRO stage 0-3 (default 0)")
    lay.add_argument("--micro-batch", type=int, default=None,
                     help="sequences per micro-batch (default 1)")
    lay.add_argument("--microbatches", type=int, default=None,
                     help="micro-batches per step, m (default 1, or from --global-batch)")
    lay.add_argument("--recompute", default=None,
                     help="activation recomputation: none (default), selective or full")
    lay.add_argument("--sequence-parallel", action="store_true",
                     help="Megatron's sequence parallelism (with tp > 1)")
    lay.add_argument("--precision", default="mixed",
                     help="mixed (fp16, default), bf16 (the same bytes) or fp32")
    lay.add_argument("--schedule", default="1f1b", help="pipeline schedule: 1f1b (default) "
                                                        "or gpipe")
    lay.add_argument("--devices", type=int, default=None,
                     help="devices in the cluster: dp × tp × pp must equal it")
    lay.add_argument("--global-batch", type=int, default=None,
                     help="sequences per step: sets m = global batch / (dp × micro-batch)")
    lay.add_argument("--device-memory", type=float, default=None,
                     help="GB (1e9 B) per device: say whether the layout fits")
    find = mem.add_argument_group("search")
    find.add_argument("--search", action="store_true",
                      help="search every layout of --devices for --global-batch and "
                           "--device-memory (--zero, --micro-batch, --recompute restrict it)")
    find.add_argument("--top", type=int, default=None,
                      help="with --search: fitting layouts to print (default 10)")
    args = parser.parse_args(argv)
    command = {"pingpong": pingpong, "calibrate": calibrate, "validate": validate,
               "bench": bench, "memory": memory}[args.command]
    rank = None
    try:
        if getattr(args, "engine", None) == "mpi":
            from dsml.comm.mpi import job_rank
            rank = job_rank()
        check_arguments(args)
        if rank:            # under mpiexec every process runs the command; rank 0 prints
            with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
                return command(args)
        return command(args)
    except (ValueError, RuntimeError) as error:
        if not rank:        # every rank meets the same error: say it once
            print(f"dsml: error: {error}", file=sys.stderr)
        return 2
