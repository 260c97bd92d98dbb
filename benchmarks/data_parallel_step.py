"""Benchmark (hand-written): a data-parallel training step on real processes against one process.

For each model and batch size, the step of `dsml.data_parallel.data_parallel_sgd` on 2 and 4
processes (`engine="processes"`) against `train_single` in this process, on the shipped digits:
time per step (the slowest rank's, after two warm-up steps; the fastest of --repeats runs, since
noise only adds time), the speed-up over one process, and the size of the gradient vector that
every step all-reduces; and beside each, the same training with DDP's buckets (`ddp_sgd`,
--ddp-cap bytes, all-reduced on a second activity while backward runs). The losses of every run
are checked against the single process's (to 1e-12): a fast step that trained a different model
would be worth nothing.

Not a test: run it by hand,  python benchmarks/data_parallel_step.py [--steps 20 --repeats 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# Every rank computes with one BLAS thread; so must the one process it is compared with. Set
# before NumPy loads: left to itself OpenBLAS would use every core for the single process, and
# an OpenBLAS started with several threads in this process measurably slows the forked ranks
# too, even after they set one thread (p = 2, 256 examples: 3.5 ms a step instead of 1.9 ms).
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import dsml  # noqa: E402
from dsml.data_parallel import data_parallel_sgd, ddp_sgd, train_single  # noqa: E402
from dsml.train import MLP, batch_indices, digits, make_optimizer  # noqa: E402

X_TRAIN, Y_TRAIN, _, _ = digits(seed=0)
CASES = [((64, 256, 256, 10), 256), ((64, 256, 256, 10), 1024), ((64, 1024, 1024, 10), 1024)]


def replica(sizes):
    return MLP(sizes, seed=0), make_optimizer("momentum", 0.05)


def batches_for(batch, steps):
    out, epoch = [], 0
    while len(out) < steps + 2:
        out += batch_indices(len(X_TRAIN), batch, seed=epoch)
        epoch += 1
    return [b for b in out if len(b) == batch][:steps + 2] if batch <= len(X_TRAIN) else None


def timed(comm, sizes, batches, ddp_cap=None):
    model, optimizer = replica(sizes)

    def train(part):
        if ddp_cap is None:
            return data_parallel_sgd(comm, model, optimizer, X_TRAIN, Y_TRAIN, part)
        return ddp_sgd(comm, model, optimizer, X_TRAIN, Y_TRAIN, part, ddp_cap)
    yield from train(batches[:2])
    start = yield comm.now()
    losses = yield from train(batches[2:])
    return losses, ((yield comm.now()) - start) / (len(batches) - 2)


def single(sizes, batches):
    model, optimizer = replica(sizes)
    train_single(model, optimizer, X_TRAIN, Y_TRAIN, batches[:2])
    start = time.perf_counter()
    losses = train_single(model, optimizer, X_TRAIN, Y_TRAIN, batches[2:])
    return losses, (time.perf_counter() - start) / (len(batches) - 2)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--ddp-cap", type=int, default=64 * 1024,
                        help="DDP bucket cap in bytes (default 64 KiB)")
    args = parser.parse_args(argv)
    world_sizes = [int(p) for p in args.world_sizes.split(",")]

    print(f"# data-parallel step on `processes` vs one process; digits, momentum SGD; fastest of "
          f"{args.repeats} runs of {args.steps} steps; DDP: buckets of {args.ddp_cap} B overlapped")
    head = f"{'model':>22} {'batch':>6} {'grad KiB':>9} {'1 proc ms':>10}"
    for p in world_sizes:
        head += f" {f'p={p} ms':>9} {f'speed-up':>9} {f'DDP ms':>8}"
    print(head)
    for sizes, batch in CASES:
        batches = batches_for(batch, args.steps)
        reference, t1 = None, float("inf")
        for _ in range(args.repeats):
            losses, t = single(sizes, batches)
            reference, t1 = losses, min(t1, t)
        n_grad = sum(w.size for w in replica(sizes)[0].params.values()) + 1
        row = f"{'-'.join(map(str, sizes)):>22} {batch:>6} {8 * n_grad / 1024:>9.0f} {t1 * 1e3:>10.2f}"
        for p in world_sizes:
            best = {}
            for cap in (None, args.ddp_cap):
                best[cap] = float("inf")
                for _ in range(args.repeats):
                    result = dsml.run(timed, p, engine="processes", args=(sizes, batches, cap),
                                      timeout=300)
                    losses = result.values[0][0]
                    if not np.allclose(losses, reference, rtol=1e-12, atol=0):
                        raise RuntimeError(f"p={p}: the losses differ from one process's")
                    best[cap] = min(best[cap], max(v[1] for v in result.values))
            row += (f" {best[None] * 1e3:>9.2f} {t1 / best[None]:>9.2f}"
                    f" {best[args.ddp_cap] * 1e3:>8.2f}")
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
