"""Benchmark (hand-written): a data-parallel training step on real processes against one process.

For each model and batch size, the step of `dsml.data_parallel.data_parallel_sgd` on 2 and 4
processes (`engine="processes"`) against `train_single` in this process, on the shipped digits:
time per step (the slowest rank's, after two warm-up steps; the fastest of --repeats runs, since
noise only adds time), the speed-up over one process, and the size of the gradient vector that
every step all-reduces. The losses of every run are checked against the single process's (to
1e-12): a fast step that trained a different model would be worth nothing.

Not a test: run it by hand,  python benchmarks/data_parallel_step.py [--steps 20 --repeats 3]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import dsml  # noqa: E402
from dsml.data_parallel import data_parallel_sgd, train_single  # noqa: E402
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


def timed(comm, sizes, batches):
    model, optimizer = replica(sizes)
    yield from data_parallel_sgd(comm, model, optimizer, X_TRAIN, Y_TRAIN, batches[:2])
    start = yield comm.now()
    losses = yield from data_parallel_sgd(comm, model, optimizer, X_TRAIN, Y_TRAIN, batches[2:])
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
    args = parser.parse_args(argv)
    world_sizes = [int(p) for p in args.world_sizes.split(",")]

    print(f"# data-parallel step on `processes` vs one process; digits, momentum SGD; fastest of "
          f"{args.repeats} runs of {args.steps} steps")
    head = f"{'model':>22} {'batch':>6} {'grad KiB':>9} {'1 proc ms':>10}"
    for p in world_sizes:
        head += f" {f'p={p} ms':>9} {f'speed-up':>9}"
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
            best = float("inf")
            for _ in range(args.repeats):
                result = dsml.run(timed, p, engine="processes", args=(sizes, batches), timeout=300)
                losses = result.values[0][0]
                if not np.allclose(losses, reference, rtol=1e-12, atol=0):
                    raise RuntimeError(f"p={p}: the losses differ from one process's")
                best = min(best, max(v[1] for v in result.values))
            row += f" {best * 1e3:>9.2f} {t1 / best:>9.2f}"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
