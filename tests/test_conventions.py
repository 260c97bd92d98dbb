"""Plumbing (hand-written): the conventions dsml shares with nccl-tests, torch.distributed and
MPI (docs/conventions.md) — "avg" is another name for "mean" and "mean" is printed; an integer
mean is refused, not turned into float64; nccl-tests' bench flags mean the same or are refused
naming dsml's; -o is the op, never an output; an empty size range is refused; times print in µs;
the help shows no plumbing label; calibrate's --output is checked before anything is measured.
"""
from __future__ import annotations

import io
import re
import sys
import tokenize
from pathlib import Path

import numpy as np
import pytest

import dsml
from dsml import RankError
from dsml.cli import main
from dsml.collectives import ALLREDUCE_ALGORITHMS, allreduce

ROOT = Path(__file__).resolve().parent.parent
NET = dsml.net.AlphaBeta(alpha=5e-6, beta=1e-9)


def mean_program(comm, inputs, op, algorithm):
    return (yield from allreduce(comm, inputs[comm.rank], op=op, algorithm=algorithm))


def run_allreduce(engine, inputs, op, algorithm="ring"):
    return dsml.run(mean_program, len(inputs), engine=engine,
                    network=NET if engine == "sim" else None, args=(inputs, op, algorithm),
                    timeout=60).values


# --- the library: op names --------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["sim", "threads"])
@pytest.mark.parametrize("algorithm", ALLREDUCE_ALGORITHMS)
def test_avg_is_another_name_for_mean(engine, algorithm):
    rng = np.random.default_rng(7)
    inputs = [rng.random(10) for _ in range(3)]
    averaged = run_allreduce(engine, inputs, "avg", algorithm)
    meaned = run_allreduce(engine, inputs, "mean", algorithm)
    for got, want in zip(averaged, meaned):
        assert got.dtype == np.float64 and np.array_equal(got, want)
    np.testing.assert_allclose(averaged[0], sum(inputs) / 3)


def test_the_generated_allreduce_takes_avg_too():
    """The submodule's function (the notebook's own), not only the traced one of the package."""
    generated = sys.modules["dsml.collectives.allreduce"].allreduce

    def program(comm):
        return (yield from generated(comm, np.full(2, comm.rank + 1.0), op="avg"))
    assert [list(v) for v in dsml.run(program, 2, network=NET).values] == [[1.5, 1.5]] * 2


@pytest.mark.parametrize("engine", ["sim", "threads"])
@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8"])
@pytest.mark.parametrize("op", ["mean", "avg"])
def test_an_integer_mean_is_refused_with_what_to_do(engine, dtype, op):
    inputs = [np.arange(4, dtype=dtype) for _ in range(2)]
    with pytest.raises(RankError) as info:
        run_allreduce(engine, inputs, op)
    message = str(info.value)
    article = "a" if dtype.startswith("u") else "an"
    assert f"ValueError: allreduce: op='mean' on {article} {dtype} array would return float64" \
        in message
    assert "x.astype(np.float64)" in message and "op='sum' and divide" in message


def test_an_integer_sum_and_a_float_mean_keep_their_dtype():
    ints = run_allreduce("sim", [np.arange(3, dtype=np.int64)] * 2, "sum")
    floats = run_allreduce("sim", [np.ones(3, dtype=np.float32)] * 2, "mean")
    assert ints[0].dtype == np.int64 and floats[0].dtype == np.float32


# --- dsml bench: nccl-tests' flags ------------------------------------------------------------

def bench(capsys, *argv):
    """`dsml bench` on the simulator: (exit status, stdout, stderr, rows as lists of fields)."""
    code = main(["bench", *argv, "--engine", "sim", "-p", "4"])
    out, err = capsys.readouterr()
    rows = [line.split() for line in out.splitlines() if line.strip() and line[0] != "#"]
    return code, out, err, rows


def refused_by_the_parser(capsys, argv) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("op", ["mean", "avg"])
@pytest.mark.parametrize("collective", ["allreduce", "reduce", "reduce_scatter"])
def test_bench_takes_mean_and_avg_and_prints_mean(capsys, op, collective):
    code, out, _, rows = bench(capsys, collective, "-o", op, "-b", "64", "-e", "64")
    assert code == 0, out
    assert rows[0][3] == "mean" and rows[0][-1] == "0"
    assert "op mean" in out and "avg" not in out


@pytest.mark.parametrize("given, dtype", [("float", "float32"), ("double", "float64"),
                                          ("float32", "float32"), ("int64", "int64")])
def test_bench_takes_nccl_tests_type_names(capsys, given, dtype):
    code, out, _, rows = bench(capsys, "allreduce", "-d", given, "-b", "64", "-e", "64")
    assert code == 0, out
    assert rows[0][2] == dtype and f"dtype {dtype}" in out


@pytest.mark.parametrize("flag, value, words", [
    ("-d", "half", "'half' is not a type dsml bench runs; choose one of float32"),
    ("-d", "bfloat16", "NumPy has no bfloat16"),
    ("-d", "all", "'all' (every type in turn, in nccl-tests) is not supported"),
    ("-o", "all", "'all' (every op in turn, in nccl-tests) is not supported"),
    ("-o", "mulsum", "invalid op 'mulsum': choose one of sum, prod, max, min, mean"),
    ("-t", "2", "nccl-tests' threads per process; dsml bench runs -p/--world-size ranks"),
    ("-g", "8", "nccl-tests' GPUs per thread; dsml bench runs -p/--world-size ranks"),
])
def test_bench_refuses_what_it_has_no_equivalent_for_naming_its_own(capsys, flag, value,
                                                                    words):
    assert words in refused_by_the_parser(capsys, ["bench", "allreduce", flag, value])


@pytest.mark.parametrize("argv, wrong", [(["-c", "0"], "N/A"), (["-c", "1"], "0"),
                                         (["-c", "1", "--check"], "0"),
                                         (["-c", "0", "--no-check"], "N/A")])
def test_bench_dash_c_is_check_on_or_off(capsys, argv, wrong):
    code, out, _, rows = bench(capsys, "allreduce", *argv, "-b", "64", "-e", "64")
    assert code == 0, out
    assert rows[0][-1] == wrong


@pytest.mark.parametrize("argv, words", [
    (["-c", "5"], "-c 5: nccl-tests checks that many iterations; dsml bench checks the last "
                  "result of every size: -c 1 (as --check, the default) or -c 0"),
    (["-c", "1", "--no-check"], "-c 1 and --no-check disagree"),
    (["-m", "4"], "-m/--agg-iters 4: nccl-tests groups that many collectives into one timed "
                  "iteration"),
    (["-i", "64", "-f", "2"], "give -f/--factor (each size a multiple of the one before) or "
                              "-i/--step-bytes"),
    (["-i", "0"], "-i/--step-bytes must be at least 1 byte, got 0"),
    (["-b", "8", "-e", "64M", "-i", "1"], "is 67,108,857 sizes; at most 1,000"),
])
def test_bench_refuses_nccl_tests_values_it_cannot_honour(capsys, argv, words):
    code, out, err, _ = bench(capsys, "allreduce", *argv)
    assert code == 2 and out == ""
    assert err.startswith("dsml: error: ") and words in err, err


def test_bench_dash_m_1_is_what_dsml_does(capsys):
    code, out, _, rows = bench(capsys, "allreduce", "-m", "1", "-b", "64", "-e", "64")
    assert code == 0 and len(rows) == 1, out


def test_bench_dash_i_steps_sizes_by_bytes(capsys):
    code, out, _, rows = bench(capsys, "allreduce", "-b", "64", "-e", "256", "-i", "64")
    assert code == 0, out
    assert [int(row[0]) for row in rows] == [64, 128, 192, 256]
    code, out, _, rows = bench(capsys, "allreduce", "-b", "64", "-e", "256")   # -f 2 by default
    assert [int(row[0]) for row in rows] == [64, 128, 256]


# --- -o is the op; calibrate writes to --output -------------------------------------------------

@pytest.fixture
def no_measuring(monkeypatch):
    """Any measurement fails the test: a refusal must come before it."""
    def measured(*args, **kwargs):
        raise AssertionError("measured before the arguments were checked")
    monkeypatch.setattr("dsml.comm.calibrate.calibrate", measured)
    monkeypatch.setattr("dsml.comm.calibrate.measure", measured)


def test_calibrate_refuses_dash_o_pointing_to_output(capsys, no_measuring, tmp_path):
    err = refused_by_the_parser(capsys, ["calibrate", "-o", str(tmp_path / "net.json")])
    assert "-o is the reduction op of dsml bench" in err and "--output FILE" in err


@pytest.mark.parametrize("where, reason", [
    (lambda tmp: "/proc/net.json", "No such file or directory (creating a file in /proc)"),
    (lambda tmp: str(tmp / "missing" / "net.json"), "does not exist"),
    (lambda tmp: str(tmp), "it is a directory"),
])
def test_calibrate_output_that_cannot_be_written_is_refused_before_measuring(
        capsys, no_measuring, tmp_path, where, reason):
    path = where(tmp_path)
    assert main(["calibrate", "--engine", "threads", "--output", path]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"dsml: error: cannot write --output {path}: ") and reason in err


def test_calibrate_output_check_leaves_nothing_behind(capsys, tmp_path, monkeypatch):
    """The write test creates a file beside the output and removes it."""
    def stop(*args, **kwargs):
        raise ValueError("stopped after the checks")
    monkeypatch.setattr("dsml.comm.calibrate.calibrate", stop)
    monkeypatch.setattr("dsml.comm.calibrate.measure", stop)
    assert main(["calibrate", "--engine", "threads", "--output",
                 str(tmp_path / "net.json")]) == 2
    assert "stopped after the checks" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# --- empty ranges -------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["allreduce", "-b", "3", "-e", "3"],
     "the range -b 3 … -e 3 holds no allreduce size: each must be at least one float32 "
     "element, 4 B"),
    (["allreduce", "-d", "float64", "-b", "4", "-e", "7"], "one float64 element, 8 B"),
    (["allgather", "-b", "8", "-e", "12"],
     "holds no allgather size: each must be at least p × itemsize = 4 × 4 B = 16 B"),
    (["allreduce", "-b", "64", "-e", "8"], "the range -b 64 … -e 8 is empty"),
    (["allreduce", "-b", "0"], "-b/--begin must be at least 1 byte, got 0"),
    (["allreduce", "-f", "1"], "-f/--factor must be ≥ 2"),
])
def test_bench_refuses_a_range_with_no_size(capsys, argv, words):
    code, out, err, _ = bench(capsys, *argv)
    assert code == 2 and out == "", out
    assert err.startswith("dsml: error: ") and words in err, err


@pytest.mark.parametrize("argv, words", [
    (["pingpong", "-b", "64", "-e", "8"], "the range -b 64 … -e 8 is empty"),
    (["pingpong", "-f", "0"], "-f/--factor must be ≥ 2"),
    (["calibrate", "-b", "1M", "-e", "1K"], "the range -b 1M … -e 1K is empty"),
    (["validate", "-b", "3", "-e", "3"],
     "dsml validate times float64 vectors: every size must be a multiple of 8 B; "
     "-b 3 -e 3 -f 16 gives 3 B"),
    (["calibrate", "-b", "12", "-e", "1K", "-f", "3"],
     "dsml calibrate times float64 vectors: every size must be a multiple of 8 B; -b 12 -e 1K "
     "-f 3 gives 12 B, 36 B, 108 B …"),
    (["calibrate", "-b", "64", "-e", "64"], "dsml calibrate fits α, β and γ to a line through "
                                            "the sizes: -b 64 -e 64 -f 2 gives one size (64 B)"),
    (["pingpong", "-b", "1K", "-e", "2K", "-f", "4"], "dsml pingpong fits α and β to a line "
                                                      "through the sizes: -b 1K -e 2K -f 4 "
                                                      "gives one size (1K)"),
    (["validate", "-b", "4K", "-e", "1K"], "the range -b 4K … -e 1K is empty"),
])
def test_pingpong_calibrate_and_validate_refuse_a_bad_range_before_measuring(
        capsys, no_measuring, tmp_path, argv, words):
    if argv[0] == "calibrate":
        argv = argv + ["--output", str(tmp_path / "net.json")]
    assert main(argv + ["--engine", "threads"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("dsml: error: ") and words in err, err


# --- what users see ---------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [[], ["pingpong"], ["calibrate"], ["validate"],
                                  ["bench"], ["memory"]])
def test_help_shows_no_plumbing_label(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "Plumbing" not in out and "hand-written" not in out
    description = out.split("\n\n")[1]          # after the usage: what the command does
    assert description[0].isupper() and not description.startswith(("options", "positional"))


def printed_strings(path: Path):
    """The string literals of a Python file (f-strings whole), with their line numbers."""
    text = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.STRING or token.type == getattr(tokenize, "FSTRING_MIDDLE",
                                                                    None):
            yield token.start[0], token.string


@pytest.mark.parametrize("folder", ["dsml", "benchmarks", "tools"])
def test_times_print_in_microseconds_as_µs(folder):
    """No printed 'us' for microseconds: every command and benchmark prints µs."""
    ascii_micro = re.compile(r"\bus\b")
    found = [f"{path.relative_to(ROOT)}:{line}: {text[:80]}"
             for path in sorted((ROOT / folder).rglob("*.py"))
             for line, text in printed_strings(path) if ascii_micro.search(text)]
    assert not found, "write µs, not us:\n" + "\n".join(found)


def test_the_conventions_table_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(docs/conventions.md)" in readme
    table = (ROOT / "docs" / "conventions.md").read_text(encoding="utf-8")
    for needle in ("torch.distributed", "mpi4py", "avg", "mean", "µs", "busbw"):
        assert needle in table


# --- the facts docs/conventions.md states about torch.distributed and mpi4py ---------------------

TORCH_FACTS = r'''
import inspect, json, os, tempfile
import torch, torch.distributed as dist
ops = [n for n in ("SUM", "PRODUCT", "MAX", "MIN", "AVG", "MEAN") if hasattr(dist.ReduceOp, n)]
args = {name: list(inspect.signature(getattr(dist, name)).parameters)[:3]
        for name in ("all_reduce", "broadcast", "reduce", "reduce_scatter_tensor",
                     "all_gather_into_tensor", "send", "recv")}
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
floats = torch.tensor([1.0, 3.0])
returned = dist.all_reduce(floats, op=dist.ReduceOp.AVG)
try:
    dist.all_reduce(torch.tensor([1, 3]), op=dist.ReduceOp.AVG)
    integer_avg = "allowed"
except RuntimeError:
    integer_avg = "RuntimeError"
dist.destroy_process_group()
print(json.dumps({"ops": ops, "args": args, "returned": repr(returned),
                  "in_place": floats.tolist(), "integer_avg": integer_avg}))
'''

MPI_FACTS = r'''
import inspect, json
from mpi4py import MPI
ops = [n for n in ("SUM", "PROD", "MAX", "MIN", "AVG", "MEAN") if hasattr(MPI, n)]
comm = MPI.COMM_WORLD
args = {name: list(inspect.signature(getattr(comm, name)).parameters)
        for name in ("Allreduce", "Bcast", "Reduce", "Reduce_scatter_block", "Send", "Recv")}
print(json.dumps({"ops": ops, "args": args}))
'''


def facts(module: str, script: str) -> dict:
    import json
    import subprocess

    pytest.importorskip(module)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_torch_distributed_as_the_table_says():
    found = facts("torch", TORCH_FACTS)
    assert found["ops"] == ["SUM", "PRODUCT", "MAX", "MIN", "AVG"]      # AVG, no MEAN
    assert found["args"] == {
        "all_reduce": ["tensor", "op", "group"], "broadcast": ["tensor", "src", "group"],
        "reduce": ["tensor", "dst", "op"], "reduce_scatter_tensor": ["output", "input", "op"],
        "all_gather_into_tensor": ["output_tensor", "input_tensor", "group"],
        "send": ["tensor", "dst", "group"], "recv": ["tensor", "src", "group"]}
    assert found["returned"] == "None" and found["in_place"] == [1.0, 3.0]
    assert found["integer_avg"] == "RuntimeError"


def test_mpi4py_as_the_table_says():
    found = facts("mpi4py", MPI_FACTS)
    assert found["ops"] == ["SUM", "PROD", "MAX", "MIN"]                # no average
    assert found["args"] == {
        "Allreduce": ["sendbuf", "recvbuf", "op"], "Bcast": ["buf", "root"],
        "Reduce": ["sendbuf", "recvbuf", "op", "root"],
        "Reduce_scatter_block": ["sendbuf", "recvbuf", "op"],
        "Send": ["buf", "dest", "tag"], "Recv": ["buf", "source", "tag", "status"]}
