"""gather, scatter and barrier (dsml.collectives.rooted): NumPy's answer on every engine, for
awkward world sizes and any root; simulated times equal to the closed forms on AlphaBeta; a
barrier that holds every rank until the last arrives."""
import numpy as np
import pytest

import dsml
from dsml.collectives import barrier, cost, gather, rooted_cost, scatter
from dsml.comm.api import SizeOnly

ALPHA, BETA = 2e-6, 1e-9
TIMEOUT = 60
ENGINES = ["sim", "threads", "processes"]


def data(rank, rows=2):
    """Rank r's array: distinct values, 2-D so that shapes are kept."""
    return np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) + 100 * rank


def run(program, p, engine, **kwargs):
    if engine == "sim":
        return dsml.run(program, p, network=dsml.net.AlphaBeta(ALPHA, BETA), kwargs=kwargs)
    return dsml.run(program, p, engine=engine, timeout=TIMEOUT, kwargs=kwargs)


def gathers(comm, root, algorithm):
    return (yield from gather(comm, data(comm.rank), root=root, algorithm=algorithm))


def scatters(comm, root, algorithm):
    p = comm.size
    whole = np.concatenate([data(r) for r in range(p)]) if comm.rank == root \
        else np.zeros((2 * p, 3))
    return (yield from scatter(comm, whole, root=root, algorithm=algorithm))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("algorithm", ["binomial", "naive"])
@pytest.mark.parametrize("p,root", [(1, 0), (3, 0), (3, 2), (5, 1), (5, 4), (6, 3)])
def test_gather_and_scatter_equal_numpy(engine, algorithm, p, root):
    whole = np.concatenate([data(r) for r in range(p)])
    result = run(gathers, p, engine, root=root, algorithm=algorithm)
    for rank, value in enumerate(result.values):
        if rank == root:
            np.testing.assert_array_equal(value, whole)
        else:
            assert value is None
    result = run(scatters, p, engine, root=root, algorithm=algorithm)
    for rank, value in enumerate(result.values):
        np.testing.assert_array_equal(value, data(rank))


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 7, 8, 13])
@pytest.mark.parametrize("op,algorithm", [("gather", "binomial"), ("gather", "naive"),
                                          ("scatter", "binomial"), ("scatter", "naive"),
                                          ("barrier", "dissemination")])
def test_simulated_time_equals_the_closed_form(p, op, algorithm):
    block = 1000                                     # bytes a rank's block holds
    root = p // 2

    def program(comm):
        if op == "barrier":
            return (yield from barrier(comm))
        collective = gather if op == "gather" else scatter
        x = SizeOnly(block) if op == "gather" else SizeOnly(block * p)
        return (yield from collective(comm, x, root=root, algorithm=algorithm))

    result = dsml.run(program, p, network=dsml.net.AlphaBeta(ALPHA, BETA))
    expected = cost(op, algorithm, p, block * p, ALPHA, BETA)
    assert expected == rooted_cost(op, algorithm, p, block * p, ALPHA, BETA)
    assert result.time == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_barrier_holds_every_rank_until_the_last_arrives(p):
    def program(comm):
        yield comm.compute(1e-3 * (comm.rank * 7 % p + 1))       # arrivals in a mixed order
        arrived = yield comm.now()
        yield from barrier(comm)
        left = yield comm.now()
        return arrived, left

    result = dsml.run(program, p, network=dsml.net.AlphaBeta(ALPHA, BETA))
    last = max(arrived for arrived, _ in result.values)
    assert last == pytest.approx(1e-3 * p)
    for arrived, left in result.values:
        assert left >= last                  # no rank leaves before the last has arrived
        assert left == pytest.approx(last + rooted_cost("barrier", "dissemination", p, 0,
                                                        ALPHA, 0), abs=2 * ALPHA * p)


@pytest.mark.parametrize("engine", ["threads", "processes"])
def test_barrier_returns_on_real_engines(engine):
    def program(comm):
        for _ in range(3):
            yield from barrier(comm)
        return comm.rank

    assert run(program, 5, engine).values == list(range(5))


def test_bad_arguments_name_what_is_valid():
    def program(comm, **kwargs):
        return (yield from scatter(comm, **kwargs))

    with pytest.raises(dsml.RankError, match=r"cut into 3 equal blocks.*got 4 along axis 0"):
        run(program, 3, "sim", x=np.zeros(4))
    with pytest.raises(dsml.RankError, match=r"root must be a rank in 0..2, got 3"):
        run(program, 3, "sim", x=np.zeros(3), root=3)
    with pytest.raises(ValueError, match="unknown gather algorithm 'ring'"):
        rooted_cost("gather", "ring", 4, 1, 1, 1)


def test_ranks_passing_different_shapes_get_a_mismatch_error():
    def program(comm):
        return (yield from gather(comm, np.zeros(3 if comm.rank == 2 else 2)))

    with pytest.raises(dsml.RankError, match="gather: rank 0 passed shape"):
        run(program, 3, "sim")
