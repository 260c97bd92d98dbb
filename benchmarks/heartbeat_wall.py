"""Benchmark (hand-written): the heartbeat failure detector on real processes, wall-clock time.

Week 6's detector (`dsml.heartbeat.heartbeat_worker`, `heartbeat_clock`, `heartbeat_monitor`) is
one set of rank programs for every engine; here it runs with `engine="processes"`: workers beat
every `--period` s, the clock ticks every `--check` s, and the monitor suspects a worker silent
for more than the timeout. For each timeout, each repeat: one worker SIGKILLs its own process
right after a heartbeat (no exception, no goodbye), and one worker stalls for `--stall` s.
Reported per timeout: the time to detect the kill — from the last heartbeat the monitor had
taken from it to its suspicion (the kill follows that heartbeat at once) — as median and
maximum over the repeats, and how often the stalled worker and the healthy ones were suspected.
The closed form on an idle machine: time to detect in (T, T + check + message latency].

Not a test: run it by hand,  python benchmarks/heartbeat_wall.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from dsml.comm.run import run  # noqa: E402
from dsml.heartbeat import heartbeat_clock, heartbeat_monitor, heartbeat_worker  # noqa: E402


def program(comm, timeout, stalls, crashes, period, check):
    """Rank 0 monitors, the last rank is its clock, ranks 1.. are workers."""
    clock = comm.size - 1
    if comm.rank == 0:
        return (yield from heartbeat_monitor(comm, list(range(1, clock)), clock, timeout))
    if comm.rank == clock:
        return (yield from heartbeat_clock(comm, 0, check))
    return (yield from heartbeat_worker(comm, 0, period, stalls[comm.rank - 1],
                                        crashes.get(comm.rank), "kill"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--period", type=float, default=0.02, help="heartbeat period, s")
    parser.add_argument("--check", type=float, default=0.005, help="clock tick, s")
    parser.add_argument("--timeouts", default="0.05,0.1,0.2", help="timeouts T, s")
    parser.add_argument("--stall", type=float, default=0.15, help="one worker's stall, s")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--beats", type=int, default=25)
    args = parser.parse_args(argv)
    timeouts = [float(t) for t in args.timeouts.split(",")]

    print(f"period {args.period * 1e3:g} ms, clock tick {args.check * 1e3:g} ms, "
          f"{args.workers} workers × {args.beats} beats, worker 1 stalls "
          f"{args.stall * 1e3:g} ms before beat 5, worker 2 is SIGKILLed after beat 9, "
          f"{args.repeats} repeats")
    print(f"{'T (ms)':>7} {'detect median':>14} {'detect max':>11} {'over T (max)':>13} "
          f"{'stall suspected':>16} {'healthy suspected':>18}")
    for timeout in timeouts:
        delays, stalled, healthy = [], 0, 0
        for _ in range(args.repeats):
            stalls = np.zeros((args.workers, args.beats))
            stalls[0, 5] = args.stall
            result = run(program, args.workers + 2, engine="processes", failures="notify",
                         timeout=120, args=(timeout, stalls, {2: 10}, args.period, args.check))
            monitor = result.values[0]
            assert sorted(result.failed) == [2] and 2 in monitor["suspected"]
            delays.append(monitor["suspected"][2] - monitor["last"][2])
            stalled += 1 in monitor["suspected"]
            healthy += len(set(monitor["suspected"]) - {1, 2})
        print(f"{timeout * 1e3:7.0f} {statistics.median(delays) * 1e3:11.1f} ms "
              f"{max(delays) * 1e3:8.1f} ms {(max(delays) - timeout) * 1e3:10.1f} ms "
              f"{stalled:>10}/{args.repeats} {healthy:>12}/{args.repeats * (args.workers - 2)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
