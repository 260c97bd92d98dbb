"""Benchmark (hand-written): does the model-against-measurement comparison repeat?

Runs, `--runs` times in a row (default 3), exactly what a user would type:

    dsml calibrate --engine processes --output <tmp>/net.json
    dsml validate --network <tmp>/net.json -p 2

and prints, per run, the fitted α, β, γ, the calibration's warnings, and validate's median and
worst measured ÷ predicted at ≥ 64 KiB (the sizes the model is held to; below that a call's
Python dominates), with the load average before each run. The target (the engines-and-tools
issue): each run's median within 1.25× of 1 on a quiet machine with a core per rank. Nothing is
asserted: it reports (docs/measurements.md has the figures of the development machine).

    OMP_NUM_THREADS=1 python benchmarks/model_vs_real.py [--runs 3] [--validate-args ...]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = re.compile(r"# p = 2 .*?at ≥ 64 KiB median ([\d.]+)x, worst ([\d.]+)x")
FIT = re.compile(r"# wrote .*AlphaBeta\(alpha=([^,]+), beta=([^,]+), gamma=([^)]+)\)")


def dsml(*args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    done = subprocess.run([sys.executable, "-m", "dsml", *args], capture_output=True, text=True,
                          env=env, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"dsml {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--engine", default="processes")
    parser.add_argument("--validate-args", nargs=argparse.REMAINDER, default=[],
                        help="more arguments for dsml validate (e.g. --algorithm ring)")
    args = parser.parse_args(argv)
    print(f"# {args.runs} runs of dsml calibrate then dsml validate -p 2, engine {args.engine}; "
          f"ratio = measured / predicted at ≥ 64 KiB")
    print(f"#{'run':>4} {'load':>5} {'alpha (µs)':>11} {'beta (ns/B)':>12} {'gamma (ns/B)':>13} "
          f"{'median':>8} {'worst':>8}  warnings")
    for run in range(1, args.runs + 1):
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        with tempfile.TemporaryDirectory() as tmp:
            net = str(Path(tmp) / "net.json")
            out = dsml("calibrate", "--engine", args.engine, "--output", net)
            alpha, beta, gamma = map(float, FIT.search(out).groups())
            warnings = out.count("# warning:")
            table = dsml("validate", "--engine", args.engine, "--network", net, "-p", "2",
                         *args.validate_args)
        median, worst = map(float, SUMMARY.search(table).groups())
        print(f"{run:>5} {load:>5.1f} {alpha * 1e6:>11.2f} {beta * 1e9:>12.4f} "
              f"{gamma * 1e9:>13.4f} {median:>7.2f}x {worst:>7.2f}x  {warnings}", flush=True)
        if os.environ.get("DSML_SHOW_TABLES"):
            print(out + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
