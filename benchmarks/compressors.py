"""Benchmark (hand-written): throughput of every gradient compressor in `dsml.compression`.

For a float32 gradient of --mib MiB (16 by default; Gaussian, seeded): MB/s of gradient
compressed and decompressed (gradient bytes ÷ seconds; the fastest of --repeats runs, since
noise on a shared machine only ever adds time), the bytes the compressed form puts on the wire
and the compression ratio (fp32 bytes ÷ wire bytes, measured from the arrays), and the relative
error ‖x̂ − x‖/‖x‖ of one round trip. A round trip that returns a vector of the wrong shape, or
(for every compressor but QSGD, which is unbiased rather than contractive) an error larger than
the gradient itself, stops the benchmark: the speed of a wrong answer is worth nothing. A
Gaussian gradient is the worst case for top-k and PowerSGD (no large entries, no low-rank
structure); real gradients lose less.

PowerSGD compresses the gradient as one square matrix (√n × √n; --mib must make n a square:
16 MiB = 2²² values = 2048²). Error feedback adds one subtraction to any compressor and is not
timed separately.

Not a test: run it by hand,  python benchmarks/compressors.py [--mib 16 --repeats 3]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

# One BLAS thread, as in every benchmark here: set before NumPy loads (see
# benchmarks/data_parallel_step.py for why).
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from dsml.compression import (Dense, MajorityVote, PowerSGD, QSGD, RandomK, Sign,  # noqa: E402
                              TopK, time_compressor)


def compressors(n: int):
    side = math.isqrt(n)
    if side * side != n:
        raise ValueError(f"the gradient must have a square number of values for PowerSGD, got {n}")
    return [
        Dense(),
        Sign(),
        Sign(bucket=512),
        MajorityVote(),
        QSGD(4, bucket=512),
        QSGD(127, bucket=512),
        TopK(fraction=0.01),
        TopK(fraction=0.001),
        RandomK(fraction=0.01),
        RandomK(fraction=0.01, shared_seed=0),
        PowerSGD([(side, side)], 1),
        PowerSGD([(side, side)], 4),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=16.0, help="gradient size in MiB (fp32)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    n = int(args.mib * 2**20) // 4
    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal(n).astype(np.float32)

    print(f"# dsml.compression: {x.nbytes / 2**20:g} MiB fp32 gradient ({n:,} values), "
          f"fastest of {args.repeats}; MB = 10⁶ bytes of gradient")
    print(f"{'compressor':>18} {'compress MB/s':>14} {'decompress MB/s':>16} {'wire bytes':>12} "
          f"{'ratio':>8} {'rel. error':>11}")
    for compressor in compressors(n):
        compress_s, decompress_s = time_compressor(compressor, x, rng, repeats=args.repeats)
        c = compressor.compress(x, rng)
        out = compressor.decompress(c)
        if out.shape != x.shape:
            raise RuntimeError(f"{compressor.name}: decompressed shape {out.shape}, "
                               f"expected {x.shape}")
        error = float(np.linalg.norm(out - x) / np.linalg.norm(x))
        if not error <= 1.0 + 1e-6 and "qsgd" not in compressor.name:
            raise RuntimeError(f"{compressor.name}: relative error {error:.3f} > 1")
        print(f"{compressor.name:>18} {x.nbytes / compress_s / 1e6:>14,.0f} "
              f"{x.nbytes / decompress_s / 1e6:>16,.0f} {c.nbytes:>12,} "
              f"{x.nbytes / c.nbytes:>8.1f} {error:>11.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
