"""Benchmark (hand-written): dsml's discrete-event simulator against SimPy 4.1.2 on one workload.

The workload: p ranks pass a size-only message (dsml.SizeOnly) around a ring with sendrecv
for R rounds, on the α–β single-port full-duplex model. Both simulators must reach the same
simulated end time, R·(α + nβ); we then compare wall time (best of N, the two sides
alternating so that machine noise hits both), as message deliveries per second.

The SimPy model is the straightforward one: each rank is a process; each rank has an out-port
and an in-port (simpy.Resource, capacity 1) and a mailbox (simpy.Store). Per round a rank
takes its own out-port and its right neighbour's in-port, holds them for α + nβ, releases
them, puts the message into the neighbour's mailbox, then takes the message from its own
mailbox. A leaner SimPy model (no port resources, which a ring never contends for anyway) is
timed as well, for an honest lower bound on SimPy's cost.

Not a test: run it by hand,  python benchmarks/sim_vs_simpy.py [--ranks 1024 --rounds 50]
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import simpy  # noqa: E402

from dsml import SizeOnly  # noqa: E402
from dsml.comm.sim_engine import SimEngine  # noqa: E402
from dsml.net import AlphaBeta  # noqa: E402

ALPHA, BETA, NBYTES = 5e-6, 1e-9, 4096
TARGET = 5.0          # dsml should deliver ≥ 5× as many messages per second as SimPy
DEFAULT_SIZES = [(64, 500), (256, 200), (1024, 100)]


# --- dsml ----------------------------------------------------------------------------

def ring_program(comm, nbytes, rounds):
    message = SizeOnly(nbytes)
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    for _ in range(rounds):
        message = yield comm.sendrecv(right, message, left)
    return message.nbytes


def run_dsml(ranks, rounds, trace=True):
    """(simulated end time, events processed) of the ring on dsml's simulator."""
    engine = SimEngine(ranks, AlphaBeta(ALPHA, BETA), trace=trace)
    result = engine.run(ring_program, (NBYTES, rounds))
    assert result.values == [NBYTES] * ranks
    if trace:
        assert len(result.trace) == ranks * rounds
    return result.time, engine.sim.events_processed


# --- SimPy ----------------------------------------------------------------------------

def run_simpy(ranks, rounds):
    """Simulated end time of the same ring on SimPy, with ports as Resources."""
    env = simpy.Environment()
    out_port = [simpy.Resource(env, capacity=1) for _ in range(ranks)]
    in_port = [simpy.Resource(env, capacity=1) for _ in range(ranks)]
    mailbox = [simpy.Store(env) for _ in range(ranks)]
    message_time = ALPHA + NBYTES * BETA
    finished = []

    def rank_process(rank):
        right = (rank + 1) % ranks
        message = SizeOnly(NBYTES)
        for _ in range(rounds):
            # send: occupy this rank's out-port and the receiver's in-port for α + nβ
            with out_port[rank].request() as out_req:
                yield out_req
                with in_port[right].request() as in_req:
                    yield in_req
                    yield env.timeout(message_time)
            mailbox[right].put(message)
            # receive from the left neighbour
            message = yield mailbox[rank].get()
        finished.append(message.nbytes)

    for rank in range(ranks):
        env.process(rank_process(rank))
    env.run()
    assert finished == [NBYTES] * ranks
    return env.now


def run_simpy_lean(ranks, rounds):
    """The same ring on SimPy without port resources (valid here: no port is contended)."""
    env = simpy.Environment()
    mailbox = [simpy.Store(env) for _ in range(ranks)]
    message_time = ALPHA + NBYTES * BETA

    def rank_process(rank):
        right = (rank + 1) % ranks
        message = SizeOnly(NBYTES)
        for _ in range(rounds):
            yield env.timeout(message_time)
            mailbox[right].put(message)
            message = yield mailbox[rank].get()

    for rank in range(ranks):
        env.process(rank_process(rank))
    env.run()
    return env.now


# --- timing ------------------------------------------------------------------------------

def best_of(repeats, functions):
    """Call each function in turn, `repeats` times round-robin; best wall time of each."""
    best = [math.inf] * len(functions)
    outputs = [None] * len(functions)
    for _ in range(repeats):
        for i, function in enumerate(functions):
            start = time.perf_counter()
            outputs[i] = function()
            best[i] = min(best[i], time.perf_counter() - start)
    return best, outputs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", help="ring sizes (default: a sweep)")
    parser.add_argument("--rounds", type=int, nargs="+", help="rounds, one per --ranks value "
                        "or one for all")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many (default 3)")
    args = parser.parse_args(argv)
    if args.ranks or args.rounds:
        ranks = args.ranks or [p for p, _ in DEFAULT_SIZES]
        rounds = args.rounds or [DEFAULT_SIZES[-1][1]]
        if len(rounds) == 1:
            rounds = rounds * len(ranks)
        if len(rounds) != len(ranks) or min(ranks) < 2 or min(rounds) < 1:
            parser.error("give ranks ≥ 2 and rounds ≥ 1, one rounds value or one per ranks value")
        sizes = list(zip(ranks, rounds))
    else:
        sizes = DEFAULT_SIZES

    print(f"ring of sendrecv, SizeOnly({NBYTES}) messages, α = {ALPHA:g} s, β = {BETA:g} s/B; "
          f"wall time best of {args.repeats}, dsml and SimPy alternating; simpy {simpy.__version__}")
    header = (f"{'ranks':>6} {'rounds':>6} {'deliveries':>10} {'trace':>5} "
              f"{'dsml s':>8} {'dsml dlv/s':>11} {'dsml ev/s':>10} "
              f"{'SimPy s':>8} {'SimPy dlv/s':>11} {'dsml/SimPy':>10} "
              f"{'lean s':>8} {'dsml/lean':>9}")
    print(header)
    print("-" * len(header))
    speedups, lean_speedups = [], []
    total_start = time.perf_counter()
    rows = [(p, r, True) for p, r in sizes] + [(sizes[-1][0], sizes[-1][1], False)]
    for ranks, rounds, trace in rows:
        deliveries = ranks * rounds
        (t_dsml, t_simpy, t_lean), ((end_dsml, events), end_simpy, end_lean) = best_of(
            args.repeats, [lambda: run_dsml(ranks, rounds, trace),
                           lambda: run_simpy(ranks, rounds),
                           lambda: run_simpy_lean(ranks, rounds)])
        formula = rounds * (ALPHA + NBYTES * BETA)
        for name, end in [("SimPy", end_simpy), ("SimPy lean", end_lean)]:
            if not math.isclose(end_dsml, end, rel_tol=1e-12):
                raise SystemExit(f"simulated end times differ: dsml {end_dsml!r}, {name} {end!r}")
        assert math.isclose(end_dsml, formula, rel_tol=1e-12), (end_dsml, formula)
        ratio, lean_ratio = t_simpy / t_dsml, t_lean / t_dsml
        speedups.append(ratio)
        lean_speedups.append(lean_ratio)
        print(f"{ranks:>6} {rounds:>6} {deliveries:>10,} {'on' if trace else 'off':>5} "
              f"{t_dsml:>8.3f} {deliveries / t_dsml:>11,.0f} {events / t_dsml:>10,.0f} "
              f"{t_simpy:>8.3f} {deliveries / t_simpy:>11,.0f} {ratio:>9.1f}× "
              f"{t_lean:>8.3f} {lean_ratio:>8.1f}×")
    print(f"\nsimulated end times agree on every row (= rounds·(α + nβ)); "
          f"total wall time {time.perf_counter() - total_start:.1f} s")
    print("columns: dlv/s = message deliveries per wall second; ev/s = dsml "
          "Simulator.events_processed per wall second; lean = SimPy without port Resources")
    worst, worst_lean = min(speedups), min(lean_speedups)
    met = worst >= TARGET
    print(f"target: dsml ≥ {TARGET:g}× SimPy deliveries/s — worst row {worst:.1f}× against the "
          f"port-Resource SimPy model: {'MET' if met else 'NOT MET'}; "
          f"against the lean SimPy model worst {worst_lean:.1f}× "
          f"({'met' if worst_lean >= TARGET else 'not met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
