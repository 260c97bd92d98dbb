"""Plumbing (hand-written): `dsml bench`, the nccl-tests table — one collective timed over a
range of sizes (size, count, type, redop, root, time, algbw, busbw) and each result checked
against a NumPy reference (#wrong)."""
from __future__ import annotations

import argparse
import sys

import numpy as np

from dsml.cli.sizes import format_bytes, size_range, typed
from dsml.collectives.cost import BUSBW_FACTORS, busbw_factor

BENCH_COLLECTIVES = ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
                     "alltoall")
REDUCING = ("allreduce", "reduce", "reduce_scatter")
ROOTED = ("broadcast", "reduce")
# Collectives whose size is a whole array cut into p equal blocks: nccl-tests rounds their
# element count down to a multiple of p.
BLOCKED = ("allgather", "reduce_scatter", "alltoall")
BENCH_DTYPES = ("float32", "float64", "int32", "int64")
BENCH_OPS = ("sum", "prod", "max", "min", "mean")
# nccl-tests' names (-d float, -d double) for dtypes the benchmark has.
NCCL_TESTS_DTYPES = {"float": "float32", "double": "float64"}
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
        if op == "mean":               # the same division every rank makes (bench_rank)
            total = _average(total, len(inputs))
        return total
    if collective == "broadcast":
        return inputs[root]
    if collective == "allgather":
        return np.concatenate(inputs)
    return None


def _summed(op: str) -> str:
    """The reduction the collectives run for a bench op: "mean" is a sum, then a division."""
    return "sum" if op == "mean" else op


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
    average = spec["op"] == "mean" and collective in REDUCING
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
    if args.collective == "allreduce":
        algorithms = algorithms + ("auto",)      # the default: chosen by the engine's α, β, γ
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
    if args.op == "mean" and np.dtype(args.dtype).kind != "f":
        raise ValueError(f"--op mean (or avg) needs a float --dtype: the mean of {args.dtype} "
                         f"values is no {args.dtype}; give -d float32 or -d float64, or --op "
                         f"sum")
    if args.agg_iters != 1:
        raise ValueError(f"-m/--agg-iters {args.agg_iters}: nccl-tests groups that many "
                         f"collectives into one timed iteration; dsml bench runs them one after "
                         f"another and has no grouping (-m 1 only): time more of them with "
                         f"-n/--iters")


def parse_op(text: str) -> str:
    """-o/--op: a reduction, by dsml's name or nccl-tests' (avg is mean); the name dsml prints."""
    from dsml.collectives.checks import op_name

    op = op_name(text)
    if op in BENCH_OPS:
        return op
    if text == "all":
        raise argparse.ArgumentTypeError("'all' (every op in turn, in nccl-tests) is not "
                                         "supported: run dsml bench once per op")
    raise argparse.ArgumentTypeError(f"invalid op {text!r}: choose one of "
                                     f"{', '.join(BENCH_OPS)} (avg is accepted for mean)")


def parse_dtype(text: str) -> str:
    """-d/--dtype: a NumPy dtype name of BENCH_DTYPES, or nccl-tests' name of one of them."""
    dtype = NCCL_TESTS_DTYPES.get(text, text)
    if dtype in BENCH_DTYPES:
        return dtype
    why = {"all": "'all' (every type in turn, in nccl-tests) is not supported: run dsml bench "
                  "once per type",
           "bfloat16": "NumPy has no bfloat16"}.get(text, f"{text!r} is not a type dsml bench "
                                                         f"runs")
    raise argparse.ArgumentTypeError(
        f"{why}; choose one of {', '.join(BENCH_DTYPES)} (nccl-tests' float and double are "
        f"accepted for float32 and float64)")


def nccl_tests_flags(args) -> None:
    """Resolve the flags taken from nccl-tests into dsml's own: -c into --check/--no-check,
    -f's default (2) unless -i steps the sizes instead."""
    if args.check_iters is not None:
        if args.check_iters not in (0, 1):
            raise ValueError(f"-c {args.check_iters}: nccl-tests checks that many iterations; "
                             f"dsml bench checks the last result of every size: -c 1 (as "
                             f"--check, the default) or -c 0 (as --no-check)")
        if args.check is not None and args.check != bool(args.check_iters):
            raise ValueError(f"-c {args.check_iters} and --{'' if args.check else 'no-'}check "
                             f"disagree: give one of them")
        args.check = bool(args.check_iters)
    if args.check is None:
        args.check = True
    if args.step_bytes is not None and args.factor is not None:
        raise ValueError("give -f/--factor (each size a multiple of the one before) or "
                         "-i/--step-bytes (each size that many bytes more), not both")
    if args.step_bytes is None and args.factor is None:
        args.factor = 2


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
    for nbytes in size_range(args.begin, args.end, args.factor, args.step_bytes):
        count = bench_count(args.collective, nbytes, args.world_size, itemsize)
        if count > 0 and count not in counts:
            counts.append(count)
    if not counts:                   # every size rounded down to nothing: an empty table
        smallest = itemsize * (args.world_size if args.collective in BLOCKED else 1)
        unit = (f"p × itemsize = {args.world_size} × {itemsize} B = {smallest} B (one "
                f"{args.dtype} element per rank's block)" if args.collective in BLOCKED else
                f"one {args.dtype} element, {itemsize} B")
        raise ValueError(f"the range -b {typed(args.begin)} … -e {typed(args.end)} holds no "
                         f"{args.collective} size: each must be at least {unit}; give a larger "
                         f"-e/--end")
    return counts


def _print_bench_header(args, network, itemsize: int) -> None:
    collective, p = args.collective, args.world_size
    reducing, rooted = collective in REDUCING, collective in ROOTED
    print(f"# dsml bench {collective}: engine {args.engine}, {p} rank{'s' * (p != 1)}, "
          f"algorithm {args.algorithm}"
          + (" (the cheapest by the α–β–γ model with the engine's α, β, γ)"
             if args.algorithm == "auto" else "") + f", dtype {args.dtype}, "
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
    nccl_tests_flags(args)
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
