"""Plumbing (hand-written): the `dsml` command line.

    dsml pingpong [--engine processes|threads|sim] [-b 1] [-e 4M] [-f 4] [--round-trips N]
                  [--repeats N]
        ping-pong between two ranks over a range of sizes; prints one-way times, the
        effective bandwidth, and the α, β and n½ fitted by least squares.
"""
from __future__ import annotations

import argparse
import re
import sys

import numpy as np

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


def _ping_pong(comm, nbytes, round_trips):
    message = np.zeros(nbytes, dtype=np.uint8)
    for _ in range(round_trips):
        if comm.rank == 0:
            yield comm.send(1, message)
            message = yield comm.recv(1)
        else:
            message = yield comm.recv(0)
            yield comm.send(0, message)
    return message.nbytes


def pingpong(args) -> int:
    import dsml
    from dsml.net.fit import fit_alpha_beta, half_performance_size

    network = dsml.net.AlphaBeta(args.alpha, args.beta) if args.engine == "sim" else None
    sizes = size_range(args.begin, args.end, args.factor)
    print(f"# ping-pong, 2 ranks, engine {args.engine}, {args.round_trips} round trips per run, "
          f"median of {args.repeats} runs")
    print(f"{'size (B)':>12} {'one-way (us)':>14} {'bandwidth (MB/s)':>18}")
    times = []
    for n in sizes:
        runs = []
        for _ in range(args.repeats):
            result = dsml.run(_ping_pong, 2, engine=args.engine, network=network,
                              args=(n, args.round_trips))
            if result.values != [n, n]:
                raise RuntimeError(f"ping-pong of {n} B returned {result.values}")
            runs.append(result.time / (2 * args.round_trips))
        t = float(np.median(runs))
        times.append(t)
        print(f"{n:>12d} {t * 1e6:>14.2f} {n / t / 1e6:>18.2f}")
    alpha, beta = fit_alpha_beta(sizes, times)
    print(f"# fit: alpha = {alpha * 1e6:.2f} us, beta = {beta * 1e9:.4f} ns/B "
          f"(peak {1 / beta / 1e9:.3f} GB/s), n_half = {half_performance_size(alpha, beta):.0f} B")
    return 0


def main(argv=None) -> int:
    import dsml

    parser = argparse.ArgumentParser(prog="dsml", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"dsml {dsml.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    pp = commands.add_parser("pingpong", help="measure one-way message time and fit α, β")
    pp.add_argument("--engine", choices=dsml.ENGINES, default="processes")
    pp.add_argument("-b", "--begin", type=parse_size, default=1, help="smallest size (default 1)")
    pp.add_argument("-e", "--end", type=parse_size, default=4 * 1024**2,
                    help="largest size (default 4M)")
    pp.add_argument("-f", "--factor", type=int, default=4, help="size multiplier (default 4)")
    pp.add_argument("--round-trips", type=int, default=20)
    pp.add_argument("--repeats", type=int, default=3)
    pp.add_argument("--alpha", type=float, default=5e-6, help="engine sim: latency (s)")
    pp.add_argument("--beta", type=float, default=1e-10, help="engine sim: time per byte (s/B)")
    args = parser.parse_args(argv)
    try:
        return pingpong(args)
    except (ValueError, RuntimeError) as error:
        print(f"dsml: error: {error}", file=sys.stderr)
        return 2
