"""Benchmark (hand-written): how fast the simulator runs a collective at scale.

The workload the week 2 issue sets: a ring all-reduce of 1 GiB across 1,024 simulated ranks
(`dsml.collectives.allreduce(..., algorithm="ring")`), with size-only payloads (no arrays
are allocated) on the α–β model. That is 2·(p − 1)·p ≈ 2.1 million messages. The target is
under 10 s of wall time on the development machine.

For each world size the script prints the wall time (best of --repeats), the messages and
simulator events processed, events per second, and checks that the simulated time equals the
closed form 2(p − 1)(α + nβ/p) + (p − 1)nγ/p exactly — a fast simulator that got the answer
wrong would be worth nothing. Trace recording is off by default (it costs one tuple per
message); --trace turns it on.

Not a test: run it by hand,  python benchmarks/sim_at_scale.py [--ranks 256 1024] [--trace]
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsml.collectives import allreduce, cost  # noqa: E402
from dsml.comm.api import SizeOnly  # noqa: E402
from dsml.comm.sim_engine import SimEngine  # noqa: E402
from dsml.net import AlphaBeta  # noqa: E402

ALPHA, BETA = 5e-6, 1e-10
NBYTES = 1 << 30
TARGET_SECONDS = 10.0     # for 1,024 ranks


def ring_allreduce(comm, nbytes):
    result = yield from allreduce(comm, SizeOnly(nbytes), algorithm="ring")
    return result.nbytes


def simulate_once(ranks: int, nbytes: int, gamma: float, trace: bool):
    engine = SimEngine(ranks, AlphaBeta(ALPHA, BETA, gamma), trace=trace)
    start = time.perf_counter()
    result = engine.run(ring_allreduce, args=(nbytes,))
    wall = time.perf_counter() - start
    if result.values != [nbytes] * ranks:
        raise RuntimeError(f"p={ranks}: ranks returned {set(result.values)}, not {nbytes} B")
    return wall, result.time, engine.sim.events_processed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--nbytes", type=int, default=NBYTES)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--gamma", type=float, default=0.0,
                        help="reduction cost, s/B (default 0; > 0 adds one event per combine)")
    parser.add_argument("--trace", action="store_true", help="record the trace as well")
    args = parser.parse_args(argv)

    print(f"# ring all-reduce of {args.nbytes} B, size-only payloads, α={ALPHA:g} s, "
          f"β={BETA:g} s/B, γ={args.gamma:g} s/B, trace {'on' if args.trace else 'off'}, "
          f"best of {args.repeats}")
    print(f"{'ranks':>6} {'messages':>10} {'events':>10} {'wall (s)':>9} {'events/s':>11} "
          f"{'sim time (s)':>13} {'= formula':>9}")
    ok = True
    for p in args.ranks:
        runs = [simulate_once(p, args.nbytes, args.gamma, args.trace) for _ in range(args.repeats)]
        wall = min(r[0] for r in runs)
        _, sim_time, events = runs[0]
        formula = cost("allreduce", "ring", p, args.nbytes, ALPHA, BETA, args.gamma)
        exact = math.isclose(sim_time, formula, rel_tol=1e-12)
        ok &= exact
        messages = 2 * (p - 1) * p
        print(f"{p:>6} {messages:>10} {events:>10} {wall:>9.2f} {events / wall:>11,.0f} "
              f"{sim_time:>13.6f} {'yes' if exact else 'NO':>9}")
        if p == 1024:
            verdict = "met" if wall < TARGET_SECONDS else "NOT met"
            print(f"# target: 1,024 ranks in under {TARGET_SECONDS:g} s — {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
