"""Benchmark (hand-written): how fast `dsml.layout_search.search_layouts` scores every layout of
a cluster.

For each model, every layout dp·tp·pp of a 64-device cluster (micro-batch 1, 2, 4, 8, ZeRO 0–3,
three recomputation choices, sequence parallelism on and off: the search's defaults), each scored
by the memory accountant and the step-time proxy, with `only_fitting=False` so that every layout
is scored and kept. The script prints the layouts considered, those that fit in --device-memory
GB, the wall time (best of --repeats: noise only ever adds time), the time per layout, and the
time of the default search (`only_fitting=True`, which skips the step estimate of layouts that do
not fit). The target is under 1 s per model on the development machine (2 cores; the search uses
one).

Each run is checked: the default search must return exactly the fitting layouts of the full one,
in the same order — a fast search with a different answer would be worth nothing.

Not a test: run it by hand,  python benchmarks/layout_search.py [--devices 64 --global-batch 1024]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# One BLAS thread, as every benchmark here (see benchmarks/data_parallel_step.py); set before
# NumPy loads (dsml.memory imports it, although the search itself does no array arithmetic).
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsml.model_config import preset  # noqa: E402
from dsml.memory import GB  # noqa: E402
from dsml.layout_search import search_layouts  # noqa: E402

MODELS = ("gpt2-xl", "llama2-7b", "llama2-13b", "llama2-70b")
TARGET_SECONDS = 1.0      # per model, every layout of 64 devices


def best_time(function, repeats: int):
    """(fastest wall time of `repeats` calls, the last call's result)."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def key(result):
    return result.layout, result.memory.total, result.step.seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--devices", type=int, default=64)
    parser.add_argument("--global-batch", type=int, default=1024)
    parser.add_argument("--device-memory", type=float, default=80.0, help="GB (1e9 B)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    device_bytes = args.device_memory * GB

    print(f"# search_layouts: {args.devices} devices, global batch {args.global_batch}, "
          f"{args.device_memory:g} GB per device; best of {args.repeats} runs")
    print(f"{'model':>11} {'considered':>11} {'fit':>6} {'all (s)':>9} {'µs/layout':>10} "
          f"{'fitting only (s)':>17} {'same answer':>12}")
    ok, slowest = True, 0.0
    for name in args.models:
        config = preset(name)
        seconds, every = best_time(
            lambda: search_layouts(config, args.devices, args.global_batch, device_bytes,
                                   only_fitting=False), args.repeats)
        seconds_fitting, fitting = best_time(
            lambda: search_layouts(config, args.devices, args.global_batch, device_bytes),
            args.repeats)
        same = [key(r) for r in every if r.fits] == [key(r) for r in fitting]
        ok &= same
        slowest = max(slowest, seconds)
        print(f"{name:>11} {len(every):>11} {len(fitting):>6} {seconds:>9.3f} "
              f"{seconds / max(len(every), 1) * 1e6:>10.1f} {seconds_fitting:>17.3f} "
              f"{'yes' if same else 'NO':>12}")
    verdict = "met" if slowest < TARGET_SECONDS else "NOT met"
    print(f"# target: every layout of each model in under {TARGET_SECONDS:g} s — {verdict} "
          f"(slowest {slowest:.3f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
