"""Plumbing (hand-written): bad input to `dsml.run`, to a network file and to the CLI gets a
clear error naming the argument and its valid range (or a documented meaning), never an
internal error, a hang, or memory exhausted."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

import dsml
from dsml import cli
from dsml.net.saved import load_network
from leaks import nothing_left_behind  # noqa: F401

NET = dsml.net.AlphaBeta(1e-6, 1e-9)
TIMEOUT = 60.0


def two_ranks(comm):
    yield comm.compute(0.0)
    return comm.rank


@pytest.mark.parametrize("engine", ["threads", "processes"])
@pytest.mark.parametrize("timeout", [None, math.inf])
def test_timeout_none_or_inf_means_no_limit(engine, timeout):
    assert dsml.run(two_ranks, 2, engine=engine, timeout=timeout).values == [0, 1]


@pytest.mark.parametrize("engine", ["sim", "threads", "processes"])
@pytest.mark.parametrize("timeout", [0, -1.0, math.nan, "10", True])
def test_a_bad_timeout_names_the_argument_and_range(engine, timeout):
    network = NET if engine == "sim" else None
    with pytest.raises(ValueError, match=r"timeout must be > 0 seconds \(or None for no limit\)"):
        dsml.run(two_ranks, 2, engine=engine, network=network, timeout=timeout)


@pytest.mark.parametrize("max_events", [1.5, "10", math.nan, -1, 0, True])
def test_a_bad_max_events_names_the_argument_and_range(max_events):
    with pytest.raises(ValueError, match=r"max_events must be an integer ≥ 1 .*got"):
        dsml.run(two_ranks, 2, network=NET, max_events=max_events)


def test_max_events_given_as_a_numpy_integer_still_guards():
    def forever(comm):
        while True:
            yield comm.compute(1e-3)

    with pytest.raises(dsml.sim.SimulationError, match=r"stopped after max_events=100"):
        dsml.run(forever, 2, network=NET, max_events=np.int64(100))


def test_a_network_that_is_not_a_model_is_named():
    with pytest.raises(TypeError, match=r"network must be a network model such as "
                                        r"dsml.net.AlphaBeta.*got 'x'"):
        dsml.run(two_ranks, 2, network="x")


def test_a_huge_world_size_on_sim_is_refused_at_once():
    with pytest.raises(ValueError, match=r"world_size must be at most 100,000 on engine='sim'"):
        dsml.run(two_ranks, 10**100, network=NET)


@pytest.mark.parametrize("engine", ["sim", "threads", "processes"])
def test_a_huge_tag_works_on_every_engine(engine):
    def tagged(comm):
        if comm.rank == 0:
            yield comm.send(1, np.arange(3.0), tag=2**70)
            yield comm.send(1, np.zeros(10_000), tag=2**64 + 1)      # shared memory, too
            return None
        first = yield comm.recv(0, tag=2**70)
        second = yield comm.recv(0, tag=2**64 + 1)
        return float(first.sum() + second.sum())

    network = NET if engine == "sim" else None
    kwargs = {} if engine == "sim" else {"timeout": TIMEOUT}
    assert dsml.run(tagged, 2, engine=engine, network=network, **kwargs).values[1] == 3.0


# --- a network file --------------------------------------------------------------------------

def write_network(tmp_path, **fields):
    record = {"format": "dsml-network/1", "model": "AlphaBeta", "alpha": 1e-6, "beta": 1e-9,
              "gamma": 0.0}
    record.update(fields)
    path = tmp_path / "net.json"
    path.write_text(json.dumps(record))
    return path


@pytest.mark.parametrize("field, value, shown", [
    ("alpha", True, "got True"),
    ("alpha", int("9" * 400), "got 99999999999999999999… (400 digits)"),
    ("beta", math.inf, "got inf"),
    ("gamma", "fast", "got 'fast'"),
])
def test_a_network_file_with_a_bad_number_names_the_field(tmp_path, field, value, shown):
    path = write_network(tmp_path, **{field: value})
    with pytest.raises(ValueError, match=rf'"{field}" must be a (finite )?number of s') as error:
        load_network(path)
    assert str(error.value).endswith(shown)


# --- the CLI -----------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["pingpong", "--round-trips", "0"], "--round-trips must be ≥ 1, got 0"),
    (["pingpong", "--repeats", "0"], "--repeats must be ≥ 1, got 0"),
    (["bench", "allreduce", "-e", "99999999G"], "-e/--end 107,374,181,326,258,176 B needs "
                                               "about"),
    (["bench", "allreduce", "--engine", "sim", "--world-size", "100000"],
     "--world-size must be in 1..1024, got 100000"),
    (["memory", "--model", "gpt2", "--search", "--devices", "1000000000", "--global-batch",
      "8", "--device-memory", "80"], "--devices must be at most 1,048,576 for --search"),
])
def test_the_cli_refuses_bad_arguments_at_once(capsys, argv, message):
    assert cli.main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("dsml: error: ") and message in error


# --- arguments checked by dsml.validate_args ---------------------------------------------------

def reduced(comm, name, x):
    from dsml import collectives
    return (yield from getattr(collectives, name)(comm, x))


@pytest.mark.parametrize("name", ["allreduce", "reduce", "reduce_scatter"])
@pytest.mark.parametrize("x, dtype", [(np.array(["x0", "yy"]), "<U2"),
                                      (np.array([1, "a"], dtype=object), "object")])
def test_reducing_strings_or_objects_names_the_dtype(name, x, dtype):
    # NumPy "adds" strings by cutting them to the first one's width: ['x0', 'yy'], not an error.
    with pytest.raises(dsml.RankError, match=rf"{name}: x must be an array of numbers .* "
                                             rf"got dtype {dtype}"):
        dsml.run(reduced, 2, network=NET, args=(name, x))


def chain_broadcast(comm, x, chunks):
    from dsml.collectives import broadcast
    return (yield from broadcast(comm, x, algorithm="chain", chunks=chunks))


@pytest.mark.parametrize("chunks", [50, 10**9])
def test_chain_broadcast_cuts_at_most_one_piece_an_element(chunks):
    x = np.arange(5.0)                               # 5 elements: at most 5 pieces
    result = dsml.run(chain_broadcast, 3, network=NET, args=(x, chunks), timeout=TIMEOUT)
    assert all(np.array_equal(value, x) for value in result.values)
    expected = dsml.collectives.cost("broadcast", "chain", 3, x.nbytes, NET.alpha, NET.beta,
                                     chunks=5)
    assert math.isclose(result.time, expected, rel_tol=1e-12)


@pytest.mark.parametrize("argument, value, message", [
    ("args", 5, "args must be a tuple or list of the rank program's arguments, got int 5"),
    ("args", "ab", "args must be a tuple or list of the rank program's arguments, got str 'ab'"),
    ("kwargs", [1], "kwargs must be a dict of the rank program's keyword arguments (or None), "
                    "got list [1]"),
])
def test_run_names_args_or_kwargs_that_are_not_arguments(argument, value, message):
    with pytest.raises(TypeError) as error:
        dsml.run(two_ranks, 2, network=NET, **{argument: value})
    assert str(error.value) == message
    assert isinstance(error.value, ValueError)       # what callers caught before


@pytest.mark.parametrize("seconds", ["1ms", None, True])
def test_compute_names_seconds_as_a_number(seconds):
    comm = dsml.comm.Comm(0, 2)
    with pytest.raises(TypeError, match=rf"compute seconds must be a finite number ≥ 0, "
                                        rf"got {re.escape(repr(seconds))}$"):
        comm.compute(seconds)


@pytest.mark.parametrize("field", ["alpha", "beta", "gamma"])
@pytest.mark.parametrize("value", ["5us", True, -1.0, math.nan, math.inf])
def test_alpha_beta_names_a_bad_parameter(field, value):
    kwargs = {"alpha": 1e-6, "beta": 1e-9, field: value}
    with pytest.raises(ValueError, match=rf"^{field} must be a finite number ≥ 0, got "):
        dsml.net.AlphaBeta(**kwargs)


@pytest.mark.parametrize("argument, value, message", [
    ("latency", "1us", r"latency of link 0-1 must be a finite number ≥ 0, got '1us'"),
    ("bandwidth", "10G", r"bandwidth of link 0-1 must be a finite number > 0 \(bytes/s\), "
                         r"got '10G'"),
    ("bandwidth", math.inf, r"bandwidth of link 0-1 must be a finite number > 0"),
    ("overhead", "1us", r"overhead must be a finite number ≥ 0, got '1us'"),
    ("overhead", -1e-6, r"overhead must be a finite number ≥ 0, got -1e-06"),
])
def test_topology_names_a_bad_parameter(argument, value, message):
    with pytest.raises(ValueError, match=message):
        dsml.net.ring(4, **{argument: value})


def test_the_validators_name_the_argument_the_rule_and_the_value():
    from dsml.validate_args import ArgumentTypeError, integer, numeric_array, positive_number
    assert positive_number("t", np.float64(2.5)) == 2.5 and positive_number("t", 3) == 3.0
    assert positive_number("t", 0, allow_zero=True) == 0.0
    assert positive_number("t", math.inf, allow_inf=True) == math.inf
    with pytest.raises(ValueError, match=r"^t must be a finite number > 0 \(s\), got 0$"):
        positive_number("t", 0, unit="s")
    with pytest.raises(ArgumentTypeError, match=r"^t must be a finite number > 0, got '1'$"):
        positive_number("t", "1")
    assert integer("n", np.int64(3), 1) == 3 and type(integer("n", np.int64(3))) is int
    with pytest.raises(TypeError, match=r"^n must be an integer ≥ 1, got 2.0$"):
        integer("n", 2.0, 1)
    with pytest.raises(ValueError, match=r"^n must be an integer ≥ 1, got 0$"):
        integer("n", 0, 1)
    assert numeric_array("x", np.zeros(2, bool)) is not None
    with pytest.raises(TypeError, match=r"^x must be an array of numbers .* got dtype "
                                        r"datetime64\[s\]$"):
        numeric_array("x", np.zeros(2, "datetime64[s]"))


def test_the_readme_and_week_1_say_what_timeout_bounds_on_the_simulator():
    # The simulator reads the clock between steps: a rank that never yields is not stopped.
    root = __import__("pathlib").Path(__file__).resolve().parent.parent
    readme = " ".join((root / "README.md").read_text().split())
    assert ("a rank that loops in its own Python code without ever yielding is not stopped by "
            "it" in readme)
    week1 = " ".join((root / "notebooks/week1_foundations_and_communication.ipynb")
                     .read_text().replace('\\n",', " ").replace('"', " ").split())
    assert "a loop that never yields (no request at all) is not stopped by `timeout`" in week1
    assert "a rank that never yields is not stopped" in dsml.run.__doc__
