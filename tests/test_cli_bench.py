"""Plumbing (hand-written): tests for `dsml bench`, the nccl-tests style table of dsml.cli."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import dsml.collectives
from dsml.cli import (BENCH_COLLECTIVES, _count_wrong, bench_count, busbw_factor,
                      default_algorithm, exact_reduction, main)
from dsml.collectives import ALLREDUCE_ALGORITHMS, COLLECTIVE_ALGORITHMS, cost

COLUMNS = ["size (B)", "count", "type", "redop", "root", "time (µs)", "spread (µs)",
           "algbw (GB/s)", "busbw (GB/s)", "#wrong"]
ALPHA, BETA = 2e-6, 1e-9

FACTORS = {"allreduce": lambda p: 2 * (p - 1) / p, "broadcast": lambda p: 1.0,
           "reduce": lambda p: 1.0, "allgather": lambda p: (p - 1) / p,
           "reduce_scatter": lambda p: (p - 1) / p, "alltoall": lambda p: (p - 1) / p}


def run_bench(capsys, *argv):
    """Run `dsml bench ...` in this process; return (exit code, stdout, stderr, rows), each
    row a dict from column name to the printed text."""
    code = main(["bench", *map(str, argv)])
    captured = capsys.readouterr()
    rows = []
    for line in captured.out.splitlines():
        if line.strip() and not line.startswith("#"):
            fields = line.split()
            assert len(fields) == len(COLUMNS), f"a table row has 10 columns, got {line!r}"
            rows.append(dict(zip(COLUMNS, fields)))
    return code, captured.out, captured.err, rows


def sim_args(collective, p, *extra):
    return [collective, "--engine", "sim", "--world-size", p, "--alpha", ALPHA, "--beta", BETA,
            *extra]


# --- the table on the simulator: exact against the closed-form costs ---------------------------

@pytest.mark.parametrize("collective,algorithm",
                         [(c, a) for c in BENCH_COLLECTIVES for a in COLLECTIVE_ALGORITHMS[c]])
def test_sim_times_match_the_cost_model(capsys, collective, algorithm):
    # p a power of two and sizes divisible by p × 4 B: where `cost` is exact.
    p = 4
    code, out, _, rows = run_bench(capsys, *sim_args(collective, p, "--algorithm", algorithm,
                                                     "-b", "64", "-e", "1M", "-f", "8"))
    assert code == 0, out
    assert [int(r["size (B)"]) for r in rows] == [64, 512, 4096, 32768, 262144]
    for row in rows:
        nbytes = int(row["size (B)"])
        want = cost(collective, algorithm, p, nbytes, ALPHA, BETA)
        algbw = nbytes / want / 1e9
        assert float(row["time (µs)"]) == pytest.approx(want * 1e6, abs=0.006), (
            f"{collective}/{algorithm} at {nbytes} B: simulated time {row['time (µs)']} µs, "
            f"the cost model says {want * 1e6:.3f} µs")
        assert float(row["algbw (GB/s)"]) == pytest.approx(algbw, abs=6e-4)
        assert float(row["busbw (GB/s)"]) == pytest.approx(algbw * FACTORS[collective](p),
                                                           abs=6e-4)
        assert row["#wrong"] == "0"
        per_rank = collective in ("allgather", "reduce_scatter", "alltoall")
        assert row["count"] == str(nbytes // 4 // (p if per_rank else 1))
        assert row["type"] == "float32"


def test_sim_charges_gamma_for_reductions(capsys):
    code, _, _, rows = run_bench(capsys, *sim_args("allreduce", 8, "--gamma", 5e-10,
                                                   "-b", "1M", "-e", "1M", "--algorithm", "ring"))
    assert code == 0
    want = cost("allreduce", "ring", 8, 1024**2, ALPHA, BETA, 5e-10)
    assert float(rows[0]["time (µs)"]) == pytest.approx(want * 1e6, abs=0.006)


@pytest.mark.parametrize("collective", BENCH_COLLECTIVES)
@pytest.mark.parametrize("p", [2, 3, 5])
def test_busbw_is_algbw_times_the_nccl_tests_factor(capsys, collective, p):
    code, out, _, rows = run_bench(capsys, *sim_args(collective, p, "-b", "4M", "-e", "16M",
                                                     "-f", "4"))
    assert code == 0, out
    factor = FACTORS[collective](p)
    assert busbw_factor(collective, p) == pytest.approx(factor)
    for row in rows:
        algbw, busbw = float(row["algbw (GB/s)"]), float(row["busbw (GB/s)"])
        assert algbw > 0.1        # large enough that three decimals pin the ratio down
        assert busbw / algbw == pytest.approx(factor, rel=0.01), (
            f"{collective} on {p} ranks: busbw {busbw} / algbw {algbw} should be {factor:.4f}")
        assert row["#wrong"] == "0"


def test_header_names_the_setup_and_the_columns(capsys):
    code, out, _, rows = run_bench(capsys, *sim_args("reduce", 4, "--root", 2, "--op", "max",
                                                     "--dtype", "int64", "-b", "8", "-e", "64"))
    assert code == 0
    header = [line for line in out.splitlines() if line.startswith("#")]
    first = header[0]
    for words in ("engine sim", "4 ranks", "algorithm binomial", "dtype int64", "op max",
                  "root 2"):
        assert words in first, f"the first header line should say {words!r}: {first!r}"
    assert any(f"alpha={ALPHA:g}" in line and f"beta={BETA:g}" in line and "gamma=" in line
               for line in header)
    column_line = next(line for line in header if "size (B)" in line)
    positions = [column_line.index(name) for name in COLUMNS]
    assert positions == sorted(positions), "columns in nccl-tests order"
    assert [r["size (B)"] for r in rows] == ["8", "16", "32", "64"]
    assert {(r["type"], r["redop"], r["root"]) for r in rows} == {("int64", "max", "2")}
    assert "# Wrong elements : 0 OK" in out
    busbws = [float(r["busbw (GB/s)"]) for r in rows]
    average = float(out.split("# Avg bus bandwidth : ")[1].split()[0])
    assert average == pytest.approx(np.mean(busbws), abs=2e-3)


def test_operations_without_reduction_print_none_and_no_root(capsys):
    for collective in ("broadcast", "allgather", "alltoall"):
        _, _, _, rows = run_bench(capsys, *sim_args(collective, 2, "-b", "64", "-e", "64"))
        assert rows[0]["redop"] == "none"
        assert rows[0]["root"] == ("0" if collective == "broadcast" else "-1")


def test_size_means_what_nccl_tests_means(capsys):
    # all-gather: size is the gathered output, so each of 4 ranks sends a quarter of it
    _, out, _, rows = run_bench(capsys, *sim_args("allgather", 4, "-b", "4K", "-e", "4K"))
    want = cost("allgather", "ring", 4, 4096, ALPHA, BETA)
    assert float(rows[0]["time (µs)"]) == pytest.approx(want * 1e6, abs=0.006)
    assert "each rank contributes size/4" in out
    # reduce-scatter: size is each rank's input
    _, out, _, rows = run_bench(capsys, *sim_args("reduce_scatter", 4, "-b", "4K", "-e", "4K"))
    want = cost("reduce_scatter", "ring", 4, 4096, ALPHA, BETA)
    assert float(rows[0]["time (µs)"]) == pytest.approx(want * 1e6, abs=0.006)


def test_sizes_are_rounded_down_to_whole_blocks(capsys):
    # 3 ranks of 4-byte elements: all-gather sizes become multiples of 12 B; 8 B is skipped
    code, out, _, rows = run_bench(capsys, *sim_args("allgather", 3, "-b", "8", "-e", "64"))
    assert code == 0
    assert [r["size (B)"] for r in rows] == ["12", "24", "60"]
    assert [r["count"] for r in rows] == ["1", "2", "5"]        # per rank, as nccl-tests
    assert "rounded down to a multiple of p × itemsize = 12 B" in out
    assert all(r["#wrong"] == "0" for r in rows)
    # all-reduce needs only whole elements; sizes that round to the same count print once
    _, _, _, rows = run_bench(capsys, *sim_args("allreduce", 3, "-b", "2", "-e", "16",
                                                "--dtype", "float64"))
    assert [r["size (B)"] for r in rows] == ["8", "16"]
    assert bench_count("alltoall", 100, 3, 8) == 12 and bench_count("reduce", 7, 2, 8) == 0


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_every_dtype_and_op_checks_clean(capsys, dtype, op):
    for collective in ("allreduce", "reduce_scatter"):
        code, out, _, rows = run_bench(capsys, *sim_args(collective, 3, "--dtype", dtype,
                                                         "--op", op, "-b", "1", "-e", "8K",
                                                         "-f", "8"))
        assert code == 0, out
        assert rows and all(r["#wrong"] == "0" for r in rows), out


def test_one_rank_and_lengths_shorter_than_the_rank_count(capsys):
    code, out, _, rows = run_bench(capsys, *sim_args("allreduce", 1, "-b", "8", "-e", "64"))
    assert code == 0, out
    assert all(r["#wrong"] == "0" and r["algbw (GB/s)"] == "-" for r in rows)
    code, out, _, rows = run_bench(capsys, *sim_args("broadcast", 8, "-b", "4", "-e", "16",
                                                     "--algorithm", "scatter_allgather",
                                                     "--root", 5))
    assert code == 0 and all(r["#wrong"] == "0" for r in rows), out


def test_default_algorithm_is_the_library_default(capsys):
    assert default_algorithm("allreduce") == "auto"
    assert default_algorithm("broadcast") == "binomial"
    assert default_algorithm("alltoall") == "pairwise"
    # the default all-reduce on the simulator takes the time of the algorithm the model picks
    code, out, _, rows = run_bench(capsys, *sim_args("allreduce", 8, "-b", "16", "-e", "1M",
                                                     "-f", "256"))
    assert code == 0 and "algorithm auto (the cheapest" in out
    for row in rows:
        n = int(row["size (B)"])
        best = min(cost("allreduce", a, 8, n, ALPHA, BETA) for a in ALLREDUCE_ALGORITHMS)
        assert float(row["time (µs)"]) == pytest.approx(best * 1e6, abs=0.006)


# --- the check cannot be vacuous -----------------------------------------------------------------

def test_a_wrong_allreduce_shows_wrong_elements(capsys, monkeypatch):
    right = dsml.collectives.allreduce

    def off_by_one_on_rank_1(comm, x, **kwargs):
        y = yield from right(comm, x, **kwargs)
        if comm.rank == 1:
            y = y.copy()
            y[0] += 1
        return y

    monkeypatch.setattr(dsml.collectives, "allreduce", off_by_one_on_rank_1)
    code, out, _, rows = run_bench(capsys, *sim_args("allreduce", 4, "-b", "16", "-e", "64"))
    assert [r["#wrong"] for r in rows] == ["1", "1", "1"], out
    assert "FAILED" in out and code == 1


def test_a_broadcast_that_keeps_local_data_is_caught(capsys, monkeypatch):
    def no_broadcast(comm, x, root=0, algorithm="binomial"):
        return x.copy()
        yield                                          # a generator that never communicates

    monkeypatch.setattr(dsml.collectives, "broadcast", no_broadcast)
    code, out, _, rows = run_bench(capsys, *sim_args("broadcast", 2, "-b", "64", "-e", "64"))
    assert int(rows[0]["#wrong"]) > 0 and code == 1, out


def test_blocks_in_the_wrong_order_are_caught(capsys, monkeypatch):
    right = dsml.collectives.alltoall

    def reversed_alltoall(comm, blocks):
        out = yield from right(comm, blocks)
        return out[::-1]

    monkeypatch.setattr(dsml.collectives, "alltoall", reversed_alltoall)
    code, out, _, rows = run_bench(capsys, *sim_args("alltoall", 4, "-b", "1K", "-e", "1K"))
    assert int(rows[0]["#wrong"]) > 0 and code == 1, out


def test_count_wrong_is_bit_exact_unless_given_a_tolerance():
    want = np.arange(10, dtype=np.int32)
    got = want.copy()
    got[[2, 7]] += 1
    assert _count_wrong(got, want) == 2
    floats = np.linspace(1, 2, 10, dtype=np.float32)
    one_ulp_off = np.nextafter(floats, np.float32(3))
    assert _count_wrong(one_ulp_off, floats) == 10
    assert _count_wrong(one_ulp_off, floats, rtol=1e-6) == 0
    assert _count_wrong(floats * 1.001, floats, rtol=1e-6) == 10
    assert _count_wrong(np.full(10, np.nan, np.float32), floats) == 10
    assert _count_wrong(None, floats) == 10
    assert _count_wrong(floats[:5], floats) == 10
    assert _count_wrong(floats.astype(np.float64), floats) == 10


def test_float_reductions_are_exact_for_the_benchmark_inputs():
    assert exact_reduction("float32", "sum", 4096) and exact_reduction("float64", "prod", 1000)
    assert not exact_reduction("float32", "sum", 10**6)
    assert not exact_reduction("float32", "prod", 200)
    assert exact_reduction("int32", "prod", 10**6)


def test_many_ranks_fall_back_to_a_tolerance(capsys):
    # float32 products of powers of two would overflow on 130 ranks: random factors near 1
    code, out, _, rows = run_bench(capsys, *sim_args("allreduce", 130, "--op", "prod",
                                                     "--algorithm", "recursive_doubling",
                                                     "-b", "1K", "-e", "1K"))
    assert code == 0 and rows[0]["#wrong"] == "0", out
    assert "beyond a relative" in out


def test_a_one_ulp_disagreement_on_one_rank_is_caught(capsys, monkeypatch):
    right = dsml.collectives.allreduce

    def last_rank_rounds_differently(comm, x, **kwargs):
        y = yield from right(comm, x, **kwargs)
        if comm.rank == comm.size - 1:
            y = np.nextafter(y, np.inf).astype(y.dtype)
        return y

    monkeypatch.setattr(dsml.collectives, "allreduce", last_rank_rounds_differently)
    code, out, _, rows = run_bench(capsys, *sim_args("allreduce", 3, "-b", "12", "-e", "12"))
    assert rows[0]["#wrong"] == "3" and code == 1, out
    assert "bit for bit" in out


def test_no_check_prints_n_a(capsys):
    code, out, _, rows = run_bench(capsys, *sim_args("allgather", 2, "-b", "64", "-e", "128",
                                                     "--no-check"))
    assert code == 0 and [r["#wrong"] for r in rows] == ["N/A", "N/A"]


# --- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,message", [
    (["allreduce", "--algorithm", "binomial"], "unknown allreduce algorithm 'binomial'"),
    (["alltoall", "--algorithm", "ring"], "unknown alltoall algorithm 'ring'"),
    (["allreduce", "--world-size", "0"], "--world-size must be in 1..1024, got 0"),
    (["broadcast", "--world-size", "4", "--root", "4"], "--root must be a rank in 0..3"),
    (["reduce", "--world-size", "2", "--root", "-1"], "--root must be a rank in 0..1"),
    (["allreduce", "-b", "64", "-e", "8"], "the range -b 64 … -e 8 is empty"),
    (["allreduce", "-f", "1"], "factor must be ≥ 2"),
    (["allreduce", "--iters", "0"], "--iters must be ≥ 1"),
])
def test_bad_input_exits_with_a_clear_error(capsys, argv, message):
    code = main(["bench", *argv, "--engine", "sim"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("dsml: error: ") and message in err, err


@pytest.mark.parametrize("argv", [["gather"], ["allreduce", "--op", "average"],
                                  ["allreduce", "--dtype", "float16"], ["allreduce", "-b", "x"]])
def test_argparse_rejects_unknown_choices(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *argv])
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_model_parameters_on_a_real_engine_warn(capsys):
    code, _, err, rows = run_bench(capsys, "allreduce", "--engine", "threads",
                                   "--world-size", 2, "-b", "8", "-e", "8", "--iters", 2,
                                   "--alpha", 1e-6)
    assert code == 0 and rows[0]["#wrong"] == "0"
    assert "only apply to --engine sim" in err


# --- real engines --------------------------------------------------------------------------------

@pytest.mark.parametrize("collective", ["allreduce", "alltoall", "broadcast"])
def test_threads_engine(capsys, collective):
    code, out, _, rows = run_bench(capsys, collective, "--engine", "threads", "--world-size", 3,
                                   "-b", "12", "-e", "768K", "-f", "16", "--iters", 3,
                                   "--warmup", 1, "--dtype", "int32", "--root", 1,
                                   "--timeout", 120)
    assert code == 0, out
    assert [r["size (B)"] for r in rows] == ["12", "192", "3072", "49152", "786432"]
    assert all(r["#wrong"] == "0" for r in rows), out
    assert all(float(r["time (µs)"]) > 0 for r in rows)
    assert "engine threads, 3 ranks" in out and "comm.now()" in out


def test_processes_engine(capsys):
    code, out, _, rows = run_bench(capsys, "reduce_scatter", "--engine", "processes",
                                   "--world-size", 2, "-b", "8", "-e", "64K", "-f", "64",
                                   "--iters", 3, "--warmup", 1, "--timeout", 300)
    assert code == 0, out
    assert [r["size (B)"] for r in rows] == ["8", "512", "32768"]
    assert all(r["#wrong"] == "0" and float(r["time (µs)"]) > 0 for r in rows), out
    for row in rows:
        assert float(row["busbw (GB/s)"]) == pytest.approx(float(row["algbw (GB/s)"]) / 2,
                                                           abs=1e-3)


def test_large_sizes_run_fewer_iterations(capsys):
    _, out, _, rows = run_bench(capsys, "allreduce", "--engine", "threads", "--world-size", 2,
                                "-b", "1K", "-e", "1K", "--max-iter-bytes", "2K",
                                "--iters", 50)
    assert rows[0]["#wrong"] == "0"
    assert "iterations × size ≤ 2K" in out


def test_python_dash_m_dsml_bench():
    done = subprocess.run([sys.executable, "-m", "dsml", "bench", "allreduce", "--engine",
                           "sim", "--world-size", "2", "-b", "8", "-e", "16"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "# Avg bus bandwidth" in done.stdout and "#wrong" in done.stdout


# --- nccl-tests' conventions: per-rank counts, -a, warm-up, spread, CSV, avg ------------------

def test_count_is_per_rank_for_blocked_collectives_and_whole_otherwise(capsys):
    for collective, count in (("allgather", "16"), ("reduce_scatter", "16"),
                              ("alltoall", "16"), ("allreduce", "64"), ("broadcast", "64")):
        _, out, _, rows = run_bench(capsys, *sim_args(collective, 4, "-b", "256", "-e", "256"))
        assert rows[0]["count"] == count, collective
        assert ("elements per rank" in out) == (collective in ("allgather", "reduce_scatter",
                                                              "alltoall"))


def test_time_over_ranks_follows_dash_a(capsys, monkeypatch):
    """Each rank reports its own time; -a 0/1/2/3 takes rank 0's, the mean, the min, the max."""
    import dsml.cli.bench as cli_module

    def fake_bench_rank(comm, spec):
        yield comm.compute(0.0)
        return [1e-6 * (comm.rank + 1)] * spec["repeats"], 0
    monkeypatch.setattr(cli_module, "bench_rank", fake_bench_rank)
    want = {"0": 1.0, "1": 2.5, "2": 1.0, "3": 4.0}
    for average, micros in want.items():
        code, out, _, rows = run_bench(capsys, "allreduce", "--engine", "threads", "-p", "4",
                                       "-b", "64", "-e", "64", "-a", average, "--no-check")
        assert code == 0, out
        assert float(rows[0]["time (µs)"]) == pytest.approx(micros)


def test_defaults_follow_nccl_tests_and_the_header_says_so(capsys, monkeypatch):
    import dsml.cli.bench as cli_module

    seen = {}

    def fake_bench_rank(comm, spec):
        seen.update(spec)
        yield comm.compute(0.0)
        return [3e-6, 1e-6, 2e-6], 0
    monkeypatch.setattr(cli_module, "bench_rank", fake_bench_rank)
    code, out, _, rows = run_bench(capsys, "allreduce", "--engine", "threads", "-p", "2",
                                   "-b", "64", "-e", "64", "--no-check")
    assert code == 0
    assert seen["warmup"] == 5 and seen["repeats"] == 3
    assert "after 5 untimed warm-up collectives; over ranks, the mean (-a 1)" in out
    assert rows[0]["time (µs)"] == "2.00" and rows[0]["spread (µs)"] == "1.00-3.00"


def test_output_file_writes_the_table_as_csv(capsys, tmp_path):
    import csv

    path = tmp_path / "table.csv"
    code, _, _, rows = run_bench(capsys, *sim_args("allreduce", 4, "-b", "64", "-e", "1K",
                                                   "-f", "4", "-F", path))
    assert code == 0
    with open(path, newline="") as file:
        table = list(csv.DictReader(file))
    assert [r["size_B"] for r in table] == [r["size (B)"] for r in rows]
    assert [float(r["time_us"]) for r in table] == pytest.approx(
        [float(r["time (µs)"]) for r in rows], abs=0.006)
    assert {r["wrong"] for r in table} == {"0"}


@pytest.mark.parametrize("collective", ["allreduce", "reduce", "reduce_scatter"])
@pytest.mark.parametrize("engine", ["sim", "threads"])
def test_avg_is_the_sum_over_p_and_checks_clean(capsys, collective, engine):
    argv = (sim_args(collective, 3, "--op", "avg", "-b", "96", "-e", "96")
            if engine == "sim" else
            [collective, "--engine", "threads", "-p", "3", "--op", "avg", "-b", "96",
             "-e", "96", "-n", "2", "--repeats", "1", "-w", "1"])
    code, out, _, rows = run_bench(capsys, *argv)
    assert code == 0, out
    assert rows[0]["redop"] == "mean" and rows[0]["#wrong"] == "0"   # the one name printed


def test_avg_of_integers_is_refused(capsys):
    assert main(["bench", "allreduce", "--engine", "sim", "--op", "avg", "-d", "int32"]) == 2
    assert "--op mean (or avg) needs a float --dtype" in capsys.readouterr().err


def test_engine_mpi_outside_a_job_is_refused_not_a_one_rank_table(capsys, monkeypatch):
    import dsml.comm.mpi as mpi_module

    monkeypatch.setattr(mpi_module, "job_size", lambda: 1)      # not started by mpiexec
    monkeypatch.setattr(mpi_module, "job_rank", lambda: 0)
    assert main(["bench", "allreduce", "--engine", "mpi", "-e", "8"]) == 2
    captured = capsys.readouterr()
    assert "--engine mpi runs inside an MPI job of two or more processes" in captured.err
    assert "mpiexec" in captured.err and captured.out == ""
