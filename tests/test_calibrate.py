"""Calibration and validation: the timed ping-pong measures α + nβ exactly on the simulator,
`measure` takes the slowest rank and the chosen statistic over runs, γ is a positive time per
byte; `calibrate` fits them, the network file round-trips and names what is wrong with a bad
one; `validate` runs every all-reduce for real beside the simulator's prediction; and the
`dsml calibrate`, `dsml validate` and `dsml bench --network` commands."""
from __future__ import annotations

import numpy as np
import pytest

from dsml import cli
from dsml.collectives import ALLREDUCE_ALGORITHMS, cost
from dsml.collectives.validate import (Validation, allreduce_iterations, available_cores,
                                       measure_allreduce, miss, predicted_allreduce, summary,
                                       timed_allreduce, validate)
from dsml.comm.calibrate import (calibrate, fit_warnings, measure, ping_pong,
                                 reduction_seconds_per_byte)
from dsml.comm.run import run
from dsml.net.alphabeta import AlphaBeta
from dsml.net.saved import load_measurement, load_network, save_network


@pytest.mark.parametrize("nbytes", [0, 1, 4096, 1 << 20])
def test_ping_pong_on_the_simulator_is_alpha_plus_n_beta(nbytes):
    net = AlphaBeta(3e-6, 2e-10)
    values = run(ping_pong, 2, network=net, args=(nbytes, 5)).values
    assert values == [pytest.approx(3e-6 + nbytes * 2e-10, rel=1e-12)] * 2


def test_ping_pong_takes_the_median_round_trip():
    """One round trip during which the core was busy elsewhere (2 s → 12 s) moves the mean
    (1.4 s one way) but not the median (0.5 s one way)."""
    class Rank0:
        rank = 0

        def now(self):
            return "now"

        def send(self, dst, payload):
            return "send"

        def recv(self, src):
            return "recv"

    clock = iter([0.0, 1.0, 2.0, 12.0, 13.0, 14.0])
    program = ping_pong(Rank0(), 8, 5)
    request = next(program)
    with pytest.raises(StopIteration) as stop:
        while True:
            reply = {"now": lambda: next(clock), "recv": lambda: np.zeros(8, np.uint8),
                     "send": lambda: None}[request]()
            request = program.send(reply)
    assert stop.value.value == 0.5


def test_measure_takes_the_slowest_rank_and_the_statistic():
    def reports(comm, base):
        if False:
            yield
        return base + comm.rank                    # rank 1 is the slowest
    assert measure(reports, 2, (10.0,), repeats=3, engine="threads") == 11.0
    assert measure(reports, 3, (1.0,), repeats=2, engine="threads", statistic=min) == 3.0


def test_ping_pong_runs_on_real_processes():
    assert measure(ping_pong, 2, (64, 3), repeats=1) > 0


def test_reduction_time_per_byte_is_positive():
    gamma = reduction_seconds_per_byte(1 << 16, repeats=2)
    assert 0 < gamma < 1e-6 and np.isfinite(gamma)


# --- calibrate: the ping-pong fitted, γ measured, the result saved and loaded ---------------------

def test_calibrate_on_the_simulator_recovers_alpha_beta_and_gamma():
    """On the simulator an exchange step costs α + nβ each way at once, and adding charges nγ
    more: the fit gives the network back."""
    net = AlphaBeta(4e-6, 3e-10, 1e-10)
    calibration = calibrate("sim", sizes=[8, 1024, 1 << 20], steps=2, repeats=1, network=net)
    assert calibration.step_seconds == [pytest.approx(4e-6 + n * 3e-10, rel=1e-12)
                                        for n in (8, 1024, 1 << 20)]
    assert calibration.add_seconds == [pytest.approx(4e-6 + n * 4e-10, rel=1e-12)
                                       for n in (8, 1024, 1 << 20)]
    got = calibration.network
    assert (got.alpha, got.beta, got.gamma) == (pytest.approx(4e-6, rel=1e-9),
                                                pytest.approx(3e-10, rel=1e-9),
                                                pytest.approx(1e-10, rel=1e-6))
    assert calibration.warnings == []


def test_calibrate_times_an_exchange_not_a_ping_pong():
    """Both ranks send at once: on the single-port full-duplex model the exchange costs one
    message time, and a ping-pong round trip two — the step a collective takes is the first."""
    net = AlphaBeta(1e-6, 1e-9)
    steps = calibrate("sim", sizes=[8, 4096], steps=1, repeats=1, network=net).step_seconds
    assert steps == [pytest.approx(net.message_time(n), rel=1e-12) for n in (8, 4096)]


def test_calibrate_measures_on_real_processes():
    calibration = calibrate("processes", sizes=[8, 1 << 16, 1 << 20], steps=2, repeats=1)
    assert len(calibration.step_seconds) == 3 and min(calibration.step_seconds) > 0
    assert calibration.network.alpha >= 0 and calibration.network.gamma >= 0


def test_calibrate_reports_each_size_as_it_goes():
    seen = []
    calibrate("sim", sizes=[8, 64], steps=1, repeats=1, network=AlphaBeta(1e-6, 1e-9),
              report=lambda n, copy, add: seen.append((n, copy, add)))
    assert [n for n, _, _ in seen] == [8, 64] and all(c > 0 and a >= c for _, c, a in seen)


@pytest.mark.parametrize("sizes,words", [([8, 12], "multiples of 8 bytes"),
                                         ([64], "at least 2 sizes")])
def test_calibrate_refuses_sizes_it_cannot_fit(sizes, words):
    with pytest.raises(ValueError, match=words):
        calibrate("sim", sizes=sizes, network=AlphaBeta(1e-6, 1e-9))


def test_a_size_far_off_the_line_and_a_far_half_performance_size_are_warned_of():
    sizes = [8, 64, 512, 4096]
    seconds = [10e-6, 10e-6, 40e-6, 11e-6]          # 512 B: 4× the line through the others
    warnings = fit_warnings(sizes, seconds, 10e-6, 1e-10)
    assert len(warnings) == 2
    assert warnings[0].startswith("512 B took 40.0 µs where the fitted line says 10.1 µs (3.98×)")
    assert "α/β = 100000 B lies beyond the largest size measured (4096 B)" in warnings[1]
    on_line = [10e-6 + n * 1e-8 for n in sizes]                    # n½ = 1000 B: measured
    assert fit_warnings(sizes, on_line, 10e-6, 1e-8) == []


def test_a_saved_network_loads_back_with_its_measurement(tmp_path):
    path = save_network(AlphaBeta(1.5e-5, 4e-10, 7e-11), tmp_path / "net.json",
                        {"engine": "processes", "sizes": [1, 2]})
    loaded = load_network(path)
    assert (loaded.alpha, loaded.beta, loaded.gamma) == (1.5e-5, 4e-10, 7e-11)
    assert load_measurement(path) == {"engine": "processes", "sizes": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["net.json"]     # no temporary left


@pytest.mark.parametrize("content,words", [
    (None, "no network file at"),
    ("{not json", "not JSON"),
    ('{"alpha": 1}', "expected \"format\""),
    ('{"format": "dsml-network/1", "model": "Topology"}', "unknown network model 'Topology'"),
    ('{"format": "dsml-network/1", "model": "AlphaBeta", "alpha": 1e-6, "beta": "fast"}',
     "\"beta\" must be a number of s/B (finite, ≥ 0), got 'fast'"),
    ('{"format": "dsml-network/1", "model": "AlphaBeta", "alpha": -1e-6, "beta": 1e-9, '
     '"gamma": 0}', "alpha must be a finite number ≥ 0, got -1e-06"),
])
def test_a_bad_network_file_is_named_with_what_is_wrong(tmp_path, content, words):
    path = tmp_path / "net.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match="net.json") as error:
        load_network(path)
    assert words in str(error.value)


def test_saving_into_a_missing_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        save_network(AlphaBeta(1e-6, 1e-9), tmp_path / "nowhere" / "net.json")


# --- validate: real runs against the simulator's prediction ----------------------------------

def test_the_prediction_is_the_simulated_time_which_equals_the_formula_here():
    net = AlphaBeta(2e-6, 1e-9, 5e-10)
    for p, algorithm in [(2, "ring"), (4, "ring"), (4, "recursive_doubling"),
                         (8, "halving_doubling")]:
        assert predicted_allreduce(p, 8 * 1024, net, algorithm) == pytest.approx(
            cost("allreduce", algorithm, p, 8 * 1024, net.alpha, net.beta, net.gamma),
            rel=1e-12)


def test_validate_runs_every_algorithm_for_real_and_predicts_each():
    net = AlphaBeta(1e-5, 1e-9, 1e-10)
    rows = validate(net, engine="threads", sizes=(64, 4096), world_sizes=(2, 3), repeats=1)
    assert [(r.world_size, r.algorithm, r.nbytes) for r in rows] == [
        (p, a, n) for p in (2, 3) for a in ALLREDUCE_ALGORITHMS for n in (64, 4096)]
    for r in rows:
        assert r.measured > 0
        assert r.predicted == predicted_allreduce(r.world_size, r.nbytes, net, r.algorithm)
        assert r.ratio == pytest.approx(r.measured / r.predicted)
        assert r.spread == (r.measured, r.measured)          # one repeat


def test_ratios_read_a_miss_the_same_way_on_either_side():
    """A model 3× too fast and one 3× too slow are the same size of miss; a percentage error
    would print them as +200 % and −67 %."""
    fast, slow = Validation("ring", 2, 65536, 3.0, 1.0), Validation("ring", 2, 65536, 1.0, 3.0)
    assert (fast.ratio, slow.ratio) == (3.0, pytest.approx(1 / 3))
    assert miss(fast.ratio) == miss(slow.ratio) == pytest.approx(3.0)
    small = Validation("ring", 2, 1024, 6.9, 1.0)
    median, worst = summary([fast, slow, small, Validation("tree", 2, 65536, 1.1, 1.0, (1.0, 1.2))])
    assert worst == 6.9 and median == pytest.approx(2.05)
    assert summary([fast, slow, small], smallest=65536) == (pytest.approx(5 / 3), 3.0)


def test_the_timed_loop_reports_the_median_call_not_the_mean():
    """One call in ten that lost its core for 10 ms moves a loop's mean tenfold, not the
    median call."""
    from dsml.collectives.validate import timed_loop

    class Comm:
        rank, size = 0, 1

        def now(self):
            return "now"

    stamps = iter([0.0] + [1e-3 * i for i in range(1, 10)] + [19e-3])   # the last call: 10 ms
    program = timed_loop(Comm(), np.ones(4), "ring", 0, 10)
    request = next(program)
    with pytest.raises(StopIteration) as stop:
        while True:
            request = program.send(next(stamps) if request == "now" else None)
    seconds, out = stop.value.value
    assert seconds == pytest.approx(1e-3) and np.array_equal(out, np.ones(4))


def test_the_prediction_runs_the_same_measurement_on_the_simulator():
    """Measured on engine sim, the timed loop gives exactly the prediction, for every
    algorithm — also the naive one, whose back-to-back runs overlap (the root starts the
    next reduce while the broadcast is still draining), so one isolated run is slower."""
    net = AlphaBeta(2e-5, 1e-9, 5e-10)
    sizes = [1024, 65536]
    measured = measure_allreduce(4, sizes, ALLREDUCE_ALGORITHMS, engine="sim", repeats=1,
                                 network=net)
    for algorithm in ALLREDUCE_ALGORITHMS:
        assert measured[algorithm] == pytest.approx(
            [predicted_allreduce(4, n, net, algorithm) for n in sizes], rel=1e-9)
    one_naive = cost("allreduce", "naive", 4, 65536, net.alpha, net.beta, net.gamma)
    assert measured["naive"][1] < 0.9 * one_naive


def test_iterations_fill_the_budget_within_bounds():
    assert allreduce_iterations(1024) == (5, 200)                 # capped at `most`
    assert allreduce_iterations(2**20) == (5, 64)                 # 64 MiB / 1 MiB
    assert allreduce_iterations(2**26) == (5, 5)                  # at least 5
    assert allreduce_iterations(2**20, budget=2**21, least=1) == (2, 2)


def test_timed_allreduce_checks_the_sum_and_reports_every_size():
    values = run(timed_allreduce, 3, engine="threads", args=([64, 4096], "ring", "float32",
                                                              2**16)).values
    assert len(values) == 3 and all(len(v) == 2 and min(v) > 0 for v in values)


def test_validate_refuses_sizes_that_are_not_whole_float64_vectors():
    with pytest.raises(ValueError, match="multiples of 8 bytes"):
        validate(AlphaBeta(1e-6, 1e-9), engine="threads", sizes=(12,), world_sizes=(2,))


# --- the command line ----------------------------------------------------------------------

def test_dsml_calibrate_writes_a_file_the_simulator_loads(tmp_path, capsys):
    path = tmp_path / "net.json"
    # 16 MiB copies take milliseconds, far above the noise of small messages, so β > 0
    assert cli.main(["calibrate", "--engine", "threads", "--output", str(path), "-e", "16M",
                     "-f", "16", "--repeats", "1", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert f"# wrote {path}" in out
    record = load_measurement(path)
    assert record["engine"] == "threads"
    assert record["sizes"] == [8, 128, 2048, 32768, 1 << 19, 1 << 23]
    assert len(record["step_seconds"]) == len(record["add_seconds"]) == 6
    assert load_network(path).alpha > 0


def test_dsml_calibrate_writes_nothing_when_the_fit_finds_no_bandwidth(tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.setattr("dsml.comm.calibrate.fit_alpha_beta", lambda sizes, times: (4e-5, 0.0))
    path = tmp_path / "net.json"
    assert cli.main(["calibrate", "--engine", "threads", "--output", str(path), "-e", "64",
                     "--repeats", "1", "--steps", "1"]) == 2
    assert "nothing written" in capsys.readouterr().err and not path.exists()


def test_dsml_calibrate_refuses_the_simulator(capsys):
    assert cli.main(["calibrate", "--engine", "sim"]) == 2
    assert "model already" in capsys.readouterr().err


def test_dsml_validate_prints_one_row_per_run(tmp_path, capsys):
    path = save_network(AlphaBeta(1e-5, 1e-9, 1e-10), tmp_path / "net.json")
    assert cli.main(["validate", "--engine", "threads", "--network", str(path), "-p", "2", "3",
                     "--algorithm", "ring", "-b", "1K", "-e", "16K", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip() and not line.startswith("#")]
    assert [(row[0], row[1], row[2]) for row in rows] == [
        ("2", "ring", "1024"), ("2", "ring", "16384"), ("3", "ring", "1024"),
        ("3", "ring", "16384")]
    for row in rows:
        predicted = predicted_allreduce(int(row[0]), int(row[2]), load_network(path), "ring")
        assert float(row[5]) == pytest.approx(predicted * 1e6, abs=0.06)
        low, high = map(float, row[4].split("-"))
        assert low == high == float(row[3])                 # one repeat: no spread
        assert float(row[6].rstrip("x")) == pytest.approx(float(row[3]) / float(row[5]), rel=0.01)
    cores = available_cores()
    for p in (2, 3):
        assert f"# p = {p} ({'≤' if p <= cores else '>'} {cores} cores): measured / predicted " \
               f"median" in out
    assert "%" not in out and " us" not in out


@pytest.mark.parametrize("argv,words", [
    (["--engine", "sim"], "hold the model against itself"),
    (["--algorithm", "ring", "butterfly"], "unknown allreduce algorithm 'butterfly'"),
    (["-p", "1"], "--world-sizes must be ≥ 2"),
    (["--network", "/nonexistent/net.json"], "no network file at /nonexistent/net.json"),
])
def test_dsml_validate_bad_input_is_named(capsys, argv, words):
    assert cli.main(["validate"] + argv) == 2
    assert words in capsys.readouterr().err


def test_bench_on_the_simulator_takes_a_network_file(tmp_path, capsys):
    path = save_network(AlphaBeta(3e-6, 2e-10, 1e-10), tmp_path / "net.json")
    common = ["bench", "allreduce", "--engine", "sim", "-b", "8", "-e", "4K", "-f", "8"]
    assert cli.main(common + ["--network", str(path)]) == 0
    from_file = capsys.readouterr().out
    assert cli.main(common + ["--alpha", "3e-6", "--beta", "2e-10", "--gamma", "1e-10"]) == 0
    assert capsys.readouterr().out == from_file
    assert cli.main(common + ["--network", str(path), "--alpha", "1e-6"]) == 2
    assert "not both" in capsys.readouterr().err
