"""Tests for `dsml pingpong`: on the simulator the fit must give back the α and β it was run
with; a fit that resolves no size dependence (β held at 0) is reported, not divided by."""
from __future__ import annotations

import re

import pytest

from dsml import cli


def fitted(output: str) -> tuple[float, float]:
    match = re.search(r"alpha = ([\d.]+) µs, beta = ([\d.]+) ns/B", output)
    assert match, output
    return float(match.group(1)) * 1e-6, float(match.group(2)) * 1e-9


def test_pingpong_on_sim_recovers_alpha_and_beta(capsys):
    code = cli.main(["pingpong", "--engine", "sim", "-b", "1", "-e", "1M", "-f", "16",
                     "--alpha", "3e-6", "--beta", "2e-10", "--round-trips", "2",
                     "--repeats", "1"])
    out = capsys.readouterr().out
    assert code == 0
    alpha, beta = fitted(out)
    assert alpha == pytest.approx(3e-6, rel=1e-3)
    assert beta == pytest.approx(2e-10, rel=1e-3)
    assert "n_half = 15000 B" in out                    # α/β
    rows = [line for line in out.splitlines() if line and not line.startswith("#")
            and not line.lstrip().startswith("size")]
    assert [int(r.split()[0]) for r in rows] == [1, 16, 256, 4096, 65536, 1048576]


def test_pingpong_reports_a_flat_fit_instead_of_dividing_by_zero(capsys, monkeypatch):
    monkeypatch.setattr("dsml.net.fit.fit_alpha_beta", lambda sizes, times: (4e-5, 0.0))
    code = cli.main(["pingpong", "--engine", "sim", "-b", "1", "-e", "64", "-f", "4",
                     "--round-trips", "1", "--repeats", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "beta = 0.0000 ns/B" in out and "no size dependence" in out


@pytest.mark.parametrize("argv,message", [
    (["-b", "8", "-e", "4"], "begin"),
    (["-f", "1"], "factor"),
])
def test_pingpong_bad_ranges_are_named(capsys, argv, message):
    assert cli.main(["pingpong", "--engine", "sim"] + argv) == 2
    assert message in capsys.readouterr().err
