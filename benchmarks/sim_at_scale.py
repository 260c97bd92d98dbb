"""Benchmark (hand-written): how fast the simulator runs a collective at scale.

The workload the week 2 issue sets: a ring all-reduce of 1 GiB across 1,024 simulated ranks
(`dsml.collectives.allreduce(..., algorithm="ring")`), with size-only payloads (no arrays
are allocated) on the α–β model (α = 10 µs, β = 1 ns/B: 1 GB/s). That is 2·(p − 1)·p ≈ 2.1
million messages. The targets: under 10 s of wall time on the development machine, and events
per second flat from 64 to 1,024 ranks within 25 % (what each rank holds or touches per message
must not grow with p: past the processor's cache, it did).

For each world size the script prints the wall time (best of --repeats), the messages and
simulator events processed, events per second, and checks that the simulated time equals the
closed form 2(p − 1)(α + nβ/p) + (p − 1)nγ/p exactly — a fast simulator that got the answer
wrong would be worth nothing. Trace recording is off by default (it costs one tuple per
message); --trace turns it on.

**SimGrid beside it.** When a C++ compiler and SimGrid (Debian's `libsimgrid-dev`) are present,
the script builds `benchmarks/simgrid/ring.cpp` — the same messages on SimGrid's s4u API: p
actors, 2(p − 1) steps of nbytes/p bytes to the right neighbour, on a cluster of private 1 GB/s
links 5 µs each (10 µs host to host), the CM02 network model without its acknowledgement
cross-traffic (α–β has none) and raw contexts — runs it at the same sizes and prints both
simulated times (they must agree), both wall times, messages per second and the ratio
dsml ÷ SimGrid (above 1×: dsml is faster). Without them it says why it skipped. SimGrid is no
dependency of dsml: nothing else uses it.

Not a test: run it by hand,  python benchmarks/sim_at_scale.py [--ranks 256 1024] [--trace]
    [--no-simgrid]
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsml.collectives import allreduce, cost  # noqa: E402
from dsml.comm.api import SizeOnly  # noqa: E402
from dsml.comm.sim_engine import SimEngine  # noqa: E402
from dsml.net import AlphaBeta  # noqa: E402

ALPHA, BETA = 10e-6, 1e-9       # 10 µs, 1 GB/s: SimGrid's platform below says the same
NBYTES = 1 << 30
TARGET_SECONDS = 10.0     # for 1,024 ranks
FLAT = 0.25               # events/s at the largest p at most 25 % below the smallest p's
SIMGRID_SOURCE = Path(__file__).resolve().parent / "simgrid" / "ring.cpp"
SIMGRID_FLAGS = ["--cfg=network/model:CM02", "--cfg=network/crosstraffic:0",
                 "--cfg=contexts/factory:raw", "--log=root.thres:warning"]


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


def simgrid_platform(ranks: int, path: Path) -> None:
    """A cluster of `ranks` hosts h0…h(p−1), each with a private full-duplex link of 1/β B/s and
    α/2 latency (a message crosses the sender's and the receiver's: α in all)."""
    path.write_text(
        "<?xml version='1.0'?>\n"
        '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">\n'
        '<platform version="4.1">\n'
        f'  <cluster id="ring" prefix="h" suffix="" radical="0-{ranks - 1}" speed="1Gf" '
        f'bw="{1 / BETA:.0f}Bps" lat="{ALPHA / 2:.9f}s"/>\n'
        "</platform>\n", encoding="utf-8")


def build_simgrid(workdir: Path):
    """The compiled SimGrid peer, or (None, why not)."""
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if compiler is None:
        return None, "no C++ compiler (g++ or c++) on PATH"
    flags = ["-lsimgrid"]
    if shutil.which("pkg-config"):
        found = subprocess.run(["pkg-config", "--cflags", "--libs", "simgrid"],
                               capture_output=True, text=True)
        if found.returncode == 0 and found.stdout.strip():
            flags = found.stdout.split()
    binary = workdir / "ring"
    built = subprocess.run([compiler, "-O2", "-std=c++17", str(SIMGRID_SOURCE), "-o",
                            str(binary)] + flags, capture_output=True, text=True)
    if built.returncode != 0:
        last = (built.stderr.strip().splitlines() or ["?"])[0]
        return None, f"SimGrid did not build (is libsimgrid-dev installed?): {last}"
    return binary, ""


def run_simgrid(binary: Path, ranks: int, nbytes: int, workdir: Path):
    """(simulated seconds, wall seconds) of SimGrid's ring at `ranks`."""
    platform = workdir / f"ring{ranks}.xml"
    simgrid_platform(ranks, platform)
    done = subprocess.run([str(binary), str(platform), str(nbytes)] + SIMGRID_FLAGS,
                          capture_output=True, text=True, check=True)
    fields = done.stdout.split()
    return float(fields[fields.index("simulated") + 1]), float(fields[fields.index("wall") + 1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--nbytes", type=int, default=NBYTES)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--gamma", type=float, default=0.0,
                        help="reduction cost, s/B (default 0; > 0 adds one event per combine)")
    parser.add_argument("--trace", action="store_true", help="record the trace as well")
    parser.add_argument("--no-simgrid", action="store_true", help="do not run SimGrid beside it")
    args = parser.parse_args(argv)

    print(f"# ring all-reduce of {args.nbytes} B, size-only payloads, α={ALPHA:g} s, "
          f"β={BETA:g} s/B, γ={args.gamma:g} s/B, trace {'on' if args.trace else 'off'}, "
          f"best of {args.repeats}")
    print(f"{'ranks':>6} {'messages':>10} {'events':>10} {'wall (s)':>9} {'events/s':>11} "
          f"{'sim time (s)':>13} {'= formula':>9}")
    ok = True
    rates, dsml = {}, {}
    for p in args.ranks:
        runs = [simulate_once(p, args.nbytes, args.gamma, args.trace) for _ in range(args.repeats)]
        wall = min(r[0] for r in runs)
        _, sim_time, events = runs[0]
        formula = cost("allreduce", "ring", p, args.nbytes, ALPHA, BETA, args.gamma)
        exact = math.isclose(sim_time, formula, rel_tol=1e-12)
        ok &= exact
        messages = 2 * (p - 1) * p
        rates[p], dsml[p] = events / wall, (sim_time, wall, messages)
        print(f"{p:>6} {messages:>10} {events:>10} {wall:>9.2f} {events / wall:>11,.0f} "
              f"{sim_time:>13.9f} {'yes' if exact else 'NO':>9}")
        if p == 1024:
            verdict = "met" if wall < TARGET_SECONDS else "NOT met"
            print(f"# target: 1,024 ranks in under {TARGET_SECONDS:g} s — {verdict}")
    if len(rates) > 1:
        low, high = min(rates), max(rates)
        ratio = rates[high] / rates[low]
        verdict = "met" if ratio >= 1 - FLAT else "NOT met"
        print(f"# events/s at {high} ranks ÷ at {low}: {ratio:.2f} (target ≥ {1 - FLAT:.2f}, "
              f"flat within {FLAT:.0%}) — {verdict}")
    if not args.no_simgrid:
        ok &= compare_with_simgrid(args, dsml)
    return 0 if ok else 1


def compare_with_simgrid(args, dsml) -> bool:
    """Run SimGrid's ring at the same sizes and print it beside dsml's (True if times agree)."""
    if args.gamma:
        print("# SimGrid: skipped — its program charges no reduction cost (run with γ = 0)")
        return True
    with tempfile.TemporaryDirectory(prefix="dsml-simgrid-") as tmp:
        binary, why = build_simgrid(Path(tmp))
        if binary is None:
            print(f"# SimGrid: skipped — {why}")
            return True
        print("# SimGrid s4u (benchmarks/simgrid/ring.cpp): CM02 without cross-traffic, raw "
              "contexts, private 1 GB/s links")
        print(f"{'ranks':>6} {'dsml sim (s)':>13} {'SimGrid sim (s)':>15} {'agree':>5} "
              f"{'dsml wall':>9} {'SG wall':>8} {'dsml msg/s':>11} {'SG msg/s':>10} "
              f"{'dsml ÷ SG':>9}")
        ok = True
        for p, (sim_time, wall, messages) in dsml.items():
            if args.nbytes % p:
                print(f"{p:>6} (skipped: {args.nbytes} B is not a whole number of bytes per rank)")
                continue
            sg_runs = [run_simgrid(binary, p, args.nbytes, Path(tmp)) for _ in range(args.repeats)]
            sg_time, sg_wall = sg_runs[0][0], min(r[1] for r in sg_runs)
            agree = math.isclose(sim_time, sg_time, rel_tol=1e-9)
            ok &= agree
            print(f"{p:>6} {sim_time:>13.9f} {sg_time:>15.9f} {'yes' if agree else 'NO':>5} "
                  f"{wall:>9.2f} {sg_wall:>8.2f} {messages / wall:>11,.0f} "
                  f"{messages / sg_wall:>10,.0f} {sg_wall / wall:>8.2f}×")
    return ok


if __name__ == "__main__":
    sys.exit(main())
