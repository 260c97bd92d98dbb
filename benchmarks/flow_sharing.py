"""Benchmark (hand-written): how fast the simulator runs with the fair (flow-level) network.

A ring all-reduce (`dsml.collectives.allreduce(..., algorithm="ring")`) of size-only payloads
(no arrays allocated) on two topologies, each under `sharing="fifo"` and `sharing="fair"` in
the same run: 256 ranks on a star, and 1,024 ranks on a fat tree of 32 leaves × 32 hosts and 32
spines. Links use the realistic setting of `dsml.net.topology` (300 ns a cut-through hop, 1 µs
host overhead, 10 GB/s). A ring all-reduce sends 2(p − 1) messages per rank.

The α–β model (no topology) runs the star case too, as the engine's own speed on this machine.
For each case the script prints wall time (best of --repeats: the machine's quietest moment), messages, simulator events,
messages per second, the CPU time of this process (best of --repeats; on a shared machine it
moves far less than the wall time, which counts the moments the process waited for a core) and
messages per CPU-second, the simulated time, and for the fair model the number of progressive
fillings it ran (the rest took the fast path: a flow alone on its links). The target for the
fair model is ≥ 50,000 messages/s at 256 ranks. Trace recording is off.
The first line prints the load average: the numbers mean little on a busy machine without it.

Not a test: run it by hand,  python benchmarks/flow_sharing.py [--repeats 5] [--large-repeats 1] [--skip-large]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsml.collectives import allreduce  # noqa: E402
from dsml.comm.api import SizeOnly  # noqa: E402
from dsml.comm.sim_engine import SimEngine  # noqa: E402
from dsml.net import AlphaBeta, fat_tree, star  # noqa: E402
from dsml.net.topology import CUT_THROUGH_HOP, HOST_OVERHEAD  # noqa: E402

NBYTES = 1 << 28          # 256 MiB: the size does not change the number of messages
TARGET = 50_000           # messages/s, fair model, 256 ranks
LINK = dict(latency=CUT_THROUGH_HOP, bandwidth=10e9, overhead=HOST_OVERHEAD)


def ring_allreduce(comm, nbytes):
    result = yield from allreduce(comm, SizeOnly(nbytes), algorithm="ring")
    return result.nbytes


# Two hops on the star: with nothing shared, its fair model is the α–β model of this α and β
# (a check printed below), and the α–β model's own speed is the engine's baseline.
STAR_ALPHA = HOST_OVERHEAD + 2 * CUT_THROUGH_HOP
CASES = {
    "star, 256 ranks": (256, {
        "α–β": lambda: AlphaBeta(STAR_ALPHA, 1 / LINK["bandwidth"]),
        "fifo": lambda: star(256, sharing="fifo", **LINK),
        "fair": lambda: star(256, sharing="fair", **LINK)}),
    "fat tree 32×32, 32 spines, 1,024 ranks": (1024, {
        "fifo": lambda: fat_tree(32, 32, 32, sharing="fifo", **LINK),
        "fair": lambda: fat_tree(32, 32, 32, sharing="fair", **LINK)}),
}


def run_once(ranks, network, nbytes):
    engine = SimEngine(ranks, network, trace=False)
    start, cpu = time.perf_counter(), time.process_time()
    # No wall-clock limit: on a loaded machine the 1,024-rank case can outlast the default 120 s.
    result = engine.run(ring_allreduce, args=(nbytes,), timeout=math.inf)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    if result.values != [nbytes] * ranks:
        raise RuntimeError(f"p={ranks}: ranks returned {set(result.values)}, not {nbytes} B")
    flows = getattr(network, "flows", None)
    fillings = flows.recomputations if flows is not None else 0
    return wall, result.time, engine.sim.events_processed, fillings, cpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each 256-rank case")
    parser.add_argument("--large-repeats", type=int, default=1, help="runs of each 1,024-rank case")
    parser.add_argument("--nbytes", type=int, default=NBYTES)
    parser.add_argument("--skip-large", action="store_true", help="only the 256-rank star")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    print(f"# ring all-reduce of {args.nbytes} B, size-only payloads, hop {CUT_THROUGH_HOP:g} s, "
          f"overhead {HOST_OVERHEAD:g} s, 10 GB/s links, best of {args.repeats} (1,024 ranks: "
          f"{args.large_repeats}); "
          f"load average {load[0]:.1f} on {os.cpu_count()} cores")
    print(f"| {'network':40s} | model   | messages | events | wall (s) | messages/s | "
          f"CPU (s) | messages/CPU-s | sim time (ms) | fillings |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    fair_small, times = None, {}
    for label, (ranks, models) in CASES.items():
        if args.skip_large and ranks > 256:
            continue
        for sharing, build in models.items():
            repeats = args.repeats if ranks <= 256 else args.large_repeats
            runs = [run_once(ranks, build(), args.nbytes) for _ in range(repeats)]
            wall, cpu = min(r[0] for r in runs), min(r[4] for r in runs)
            _, sim_time, events, fillings, _ = runs[0]
            messages = 2 * (ranks - 1) * ranks
            rate = messages / wall
            times[(ranks, sharing)] = sim_time
            if sharing == "fair" and ranks == 256:
                fair_small = rate
            print(f"| {label:40s} | {sharing:7s} | {messages:,} | {events:,} | {wall:.2f} | "
                  f"{rate:,.0f} | {cpu:.2f} | {messages / cpu:,.0f} | {sim_time * 1e3:.3f} | "
                  f"{fillings:,} |", flush=True)
    if (256, "fair") in times:
        same = math.isclose(times[(256, "fair")], times[(256, "α–β")], rel_tol=1e-9)
        print(f"# star, 256 ranks: fair model's simulated time = α–β model's with "
              f"α = overhead + 2 hops: {'yes' if same else 'NO'}")
    if fair_small is not None:
        verdict = "met" if fair_small >= TARGET else "NOT met"
        print(f"# target: ≥ {TARGET:,} messages/s, fair model, 256 ranks — {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
