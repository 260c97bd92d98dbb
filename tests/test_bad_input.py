"""Plumbing (hand-written): bad input to `dsml.run`, to a network file and to the CLI gets a
clear error naming the argument and its valid range (or a documented meaning), never an
internal error, a hang, or memory exhausted."""
from __future__ import annotations

import json
import math

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
