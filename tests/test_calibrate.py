"""dsml.comm.calibrate: the timed ping-pong measures α + nβ exactly on the simulator, `measure`
takes the slowest rank and the chosen statistic over runs, and γ is a positive time per byte."""
from __future__ import annotations

import numpy as np
import pytest

from dsml.comm.calibrate import measure, ping_pong, reduction_seconds_per_byte
from dsml.comm.run import run
from dsml.net.alphabeta import AlphaBeta


@pytest.mark.parametrize("nbytes", [0, 1, 4096, 1 << 20])
def test_ping_pong_on_the_simulator_is_alpha_plus_n_beta(nbytes):
    net = AlphaBeta(3e-6, 2e-10)
    values = run(ping_pong, 2, network=net, args=(nbytes, 5)).values
    assert values == [pytest.approx(3e-6 + nbytes * 2e-10, rel=1e-12)] * 2


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
