"""Benchmark (hand-written): Hogwild! update rates on real processes, lock-free against locked.

For a sparse problem (each example touches k of d coordinates) and its dense version (k = d),
`dsml.hogwild.run_hogwild` with 1, 2 and 4 worker processes, without a lock and with one lock
around each step: SGD steps per second of all workers together (wall time from the first
worker's start to the last one's end), each repeat side by side and the fastest of them (noise
on a shared machine only ever slows a run down), the share of coordinate updates that races
overwrote (median over the repeats), and the rate of the steps that landed, relative to one
worker. Every run takes the
same number of steps, shared equally by its workers; configurations alternate within each
repeat, so that a slow minute of the machine does not fall on one of them only. Every run's
loss must fall below its start: a fast run that learned nothing would be worth nothing.

Not a test: run it by hand,  python benchmarks/hogwild.py [--repeats 3 --steps 40000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

# Every worker computes with one BLAS thread (see benchmarks/data_parallel_step.py for why this
# is set before NumPy loads).
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsml.hogwild import run_hogwild, sparse_least_squares  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40_000,
                        help="SGD steps per run on the sparse problem (shared by the workers)")
    parser.add_argument("--dense-steps", type=int, default=8_000,
                        help="SGD steps per run on the dense problem")
    parser.add_argument("--d", type=int, default=1000, help="coordinates")
    parser.add_argument("--k", type=int, default=10, help="coordinates per sparse example")
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args(argv)
    workers = [int(p) for p in args.workers.split(",")]

    problems = {"sparse": (sparse_least_squares(4000, args.d, args.k, seed=0), args.steps),
                "dense": (sparse_least_squares(2000, args.d, args.d, seed=0), args.dense_steps)}
    configs = [(name, p, lock) for name in problems for p in workers for lock in (False, True)]
    rates = {config: [] for config in configs}
    lost = {config: [] for config in configs}
    for _ in range(args.repeats):
        for name, p, lock in configs:
            problem, steps = problems[name]
            result = run_hogwild(problem, p, steps // p, args.lr, lock=lock, seed=0,
                                 timeout=600)
            if not result.loss < result.losses[0]:
                raise RuntimeError(f"{name}, {p} workers, lock={lock}: the loss did not fall")
            rates[name, p, lock].append(result.updates_per_second)
            lost[name, p, lock].append(result.lost_fraction)

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"# Hogwild! (dsml.hogwild.run_hogwild) on {cores} cores: SGD steps per second of all "
          f"workers together")
    print(f"# sparse: k = {args.k} of d = {args.d} coordinates per example, {args.steps} steps "
          f"per run; dense: k = d = {args.d}, {args.dense_steps} steps per run")
    print(f"# {args.repeats} repeats, configurations alternating; best = the fastest repeat; "
          "vs 1 = best / best of 1 worker lock-free;")
    print("# lost = share of coordinate updates overwritten (median of the repeats); "
          "useful = vs 1 × (1 − lost), the steps that landed")
    runs = "".join(f" {f'run {r + 1}':>9}" for r in range(args.repeats))
    print(f"# {'problem':>7} {'workers':>7} {'lock':>5}{runs} {'best':>9} {'vs 1':>6} "
          f"{'lost':>7} {'useful':>7}")
    for name, p, lock in configs:
        best = max(rates[name, p, lock])
        one = max(rates[name, workers[0], False])
        row = "".join(f" {rate:>9,.0f}" for rate in rates[name, p, lock])
        share = statistics.median(lost[name, p, lock])
        print(f"  {name:>7} {p:>7} {'yes' if lock else 'no':>5}{row} {best:>9,.0f} "
              f"{best / one:>5.2f}× {share:>7.2%} {best / one * (1 - share):>6.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
