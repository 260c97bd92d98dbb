"""Plumbing (hand-written): the benchmark's plain ring (benchmarks/allreduce_real_engines.py,
engine "plain") — the NumPy-and-pipes floor that dsml's ring is held against — must compute the
right sum (the worker compares with NumPy and raises), report a failure instead of hanging, and
leave no shared-memory segment behind. No speed is asserted."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "allreduce_real_engines", ROOT / "benchmarks" / "allreduce_real_engines.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def our_segments() -> set:
    if not os.path.isdir("/dev/shm"):
        return set()
    return {name for name in os.listdir("/dev/shm") if name.startswith("psm_")}


@pytest.mark.parametrize("p", [2, 3])
def test_the_plain_ring_sums_right_and_cleans_up(bench, p):
    before = our_segments()
    # sizes (bytes) not divisible by p, and one smaller than p floats: uneven and empty blocks
    times = bench.run_plain(p, [8, 4096, 40_004, 1 << 20], quick=True, timeout=120)
    assert len(times) == 4 and all(t > 0 for t in times)
    assert our_segments() <= before


def test_a_wrong_sum_is_reported_not_hung(bench, monkeypatch):
    real = bench.expected_sum
    monkeypatch.setattr(bench, "expected_sum", lambda nbytes, p: real(nbytes, p) + 1)
    before = our_segments()
    with pytest.raises(RuntimeError, match="plain ring failed: rank .*wrong sum"):
        bench.run_plain(2, [4096], quick=True, timeout=120)
    assert our_segments() <= before


def test_the_dsml_column_times_the_algorithm_asked_for(bench, monkeypatch):
    import dsml
    seen = []

    class Result:
        values = [[1e-6], [2e-6]]

    monkeypatch.setattr(dsml, "run", lambda program, p, **kw: seen.append(kw["args"]) or Result)
    assert bench.run_dsml(2, [4096], quick=True, algorithm="recursive_doubling") == [2e-6]
    assert seen == [([4096], True, "recursive_doubling")]
    with pytest.raises(SystemExit):                       # argparse: not one of the choices
        bench.main(["--dsml-algorithm", "fastest", "--engines", "plain"])


def test_recursive_doubling_in_the_dsml_column_sums_right(bench):
    # timed_allreduce checks every rank's sum and raises on a wrong one
    times = bench.run_dsml(2, [8, 4096], quick=True, algorithm="recursive_doubling")
    assert len(times) == 2 and all(t > 0 for t in times)
