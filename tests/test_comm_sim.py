"""Plumbing (hand-written): tests for the request vocabulary and the sim engine over the α–β model."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsml
from dsml import DeadlockError, RankError, SizeOnly
from dsml.sim import LimitExceeded
from dsml.comm.api import SCALAR_BYTES, STRUCT_HEADER_BYTES, Comm, payload_nbytes
from dsml.net import AlphaBeta

ALPHA, BETA = 5e-6, 1e-9
NET = AlphaBeta(alpha=ALPHA, beta=BETA)


def t_msg(nbytes, alpha=ALPHA, beta=BETA):
    return alpha + nbytes * beta


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


# --- rank programs ------------------------------------------------------------------

def ping_pong(comm, nbytes):
    if comm.rank == 0:
        yield comm.send(1, np.zeros(nbytes, np.uint8))
        reply = yield comm.recv(1)
        return reply.nbytes
    got = yield comm.recv(0)
    yield comm.send(0, got)
    return got.nbytes


def one_way(comm, payload):
    if comm.rank == 0:
        yield comm.send(1, payload)
        return None
    return (yield comm.recv(0))


def ring_shift(comm, data, rounds):
    """Rank i starts with data[i]; each round passes it to the right neighbour."""
    x = data[comm.rank]
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    for _ in range(rounds):
        x = yield comm.sendrecv(right, x, left)
    return x


# --- timing against α + nβ --------------------------------------------------------------

@pytest.mark.parametrize("nbytes", [0, 1, 7, 64, 1000, 4096, 65536, 1 << 20, 10_000_000])
def test_ping_pong_one_way_time_is_alpha_plus_n_beta(nbytes):
    result = dsml.run(ping_pong, 2, network=NET, args=(nbytes,))
    assert result.values == [nbytes, nbytes]
    assert close(result.time / 2, t_msg(nbytes))
    first_send = result.trace.of_rank(0)[0]
    assert first_send.op == "send" and first_send.start == 0.0
    assert close(first_send.end, t_msg(nbytes))
    assert result.engine == "sim" and result.world_size == 2


def test_ping_pong_with_other_parameters_and_zero_alpha():
    for alpha, beta in [(0.0, 2e-9), (1e-3, 0.0), (3.3e-6, 1.35e-10)]:
        result = dsml.run(ping_pong, 2, network=AlphaBeta(alpha, beta), args=(12345,))
        assert close(result.time, 2 * t_msg(12345, alpha, beta))


@pytest.mark.parametrize("p", range(2, 10))
def test_ring_sendrecv_costs_one_message_time_per_round(p):
    n, rounds = 250, 3      # float64: 2000 bytes per message
    data = [np.full(n, float(r)) for r in range(p)]
    result = dsml.run(ring_shift, p, network=NET, args=(data, rounds))
    assert close(result.time, rounds * t_msg(8 * n))
    for r in range(p):
        assert close(result.finish_times[r], rounds * t_msg(8 * n))
        np.testing.assert_array_equal(result.values[r], data[(r - rounds) % p])
    # One sendrecv record per rank per round, each exactly one message time long.
    for record in result.trace:
        assert record.op == "sendrecv" and close(record.end - record.start, t_msg(8 * n))


def incast(comm, nbytes):
    if comm.rank == 0:
        got = []
        for src in range(comm.size - 1, 0, -1):      # receive in reverse order: still fine
            got.append((yield comm.recv(src)))
        return len(got)
    yield comm.send(0, np.zeros(nbytes, np.uint8))
    return comm.rank


@pytest.mark.parametrize("senders", [1, 2, 3, 5, 8, 13])
def test_incast_serializes_at_the_receiver_in_port(senders):
    nbytes = 10_000
    result = dsml.run(incast, senders + 1, network=NET, args=(nbytes,))
    assert result.values[0] == senders
    assert close(result.time, senders * t_msg(nbytes))
    # Deterministic order: senders are served in the order they issued (rank order here),
    # and an eager send completes when its message has left, after waiting for the port.
    for rank in range(1, senders + 1):
        assert close(result.finish_times[rank], rank * t_msg(nbytes))


def test_single_port_a_sender_serializes_its_own_messages():
    def fan_out(comm):
        if comm.rank == 0:
            yield comm.send(1, np.zeros(100, np.uint8))
            yield comm.send(2, np.zeros(100, np.uint8))
        else:
            yield comm.recv(0)

    result = dsml.run(fan_out, 3, network=NET)
    assert close(result.finish_times[1], t_msg(100))
    assert close(result.finish_times[2], 2 * t_msg(100))


def test_full_duplex_two_ranks_exchanging_take_one_message_time():
    def exchange(comm):
        other = 1 - comm.rank
        yield comm.send(other, np.full(500, comm.rank, np.float64))
        got = yield comm.recv(other)
        return got[0]

    result = dsml.run(exchange, 2, network=NET)
    assert result.values == [1.0, 0.0]
    assert close(result.time, t_msg(4000))
    assert not close(result.time, 2 * t_msg(4000))


def test_send_is_eager_it_does_not_wait_for_the_receive():
    def late_receiver(comm):
        if comm.rank == 0:
            yield comm.send(1, np.zeros(10, np.uint8))
            yield comm.send(1, np.ones(10, np.uint8))
            return "sent"
        yield comm.compute(1.0)
        first = yield comm.recv(0)
        second = yield comm.recv(0)
        return int(first.sum()), int(second.sum())

    result = dsml.run(late_receiver, 2, network=NET)
    assert result.values == ["sent", (0, 10)]
    assert close(result.finish_times[0], 2 * t_msg(10))
    assert result.finish_times[1] == 1.0       # both messages were already there


def test_compute_advances_simulated_time():
    def work_then_send(comm):
        if comm.rank == 0:
            yield comm.compute(0.25)
            yield comm.compute(0.0)
            yield comm.send(1, np.zeros(8, np.uint8))
        else:
            yield comm.recv(0)

    result = dsml.run(work_then_send, 2, network=NET)
    assert close(result.time, 0.25 + t_msg(8))
    compute = [r for r in result.trace if r.op == "compute"]
    assert [(r.rank, r.start, r.end) for r in compute] == [(0, 0.0, 0.25), (0, 0.25, 0.25)]


def test_trace_of_a_ping_pong():
    n = 100
    result = dsml.run(ping_pong, 2, network=NET, args=(n,))
    T = t_msg(n)
    got = [(r.rank, r.op, r.start, r.end, r.src, r.dst, r.nbytes, r.tag) for r in result.trace]
    expected = [
        (1, "recv", 0.0, T, 0, 1, n, 0),
        (0, "send", 0.0, T, 0, 1, n, 0),
        (0, "recv", T, 2 * T, 1, 0, n, 0),
        (1, "send", T, 2 * T, 1, 0, n, 0),
    ]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g[:2] == e[:2] and g[4:] == e[4:]
        assert close(g[2], e[2]) or g[2] == e[2] == 0.0
        assert close(g[3], e[3])
    assert result.trace.ranks() == [0, 1]


def test_trace_off_gives_the_same_time_and_no_trace():
    data = [np.arange(5.0) + r for r in range(4)]
    on = dsml.run(ring_shift, 4, network=NET, args=(data, 3))
    off = dsml.run(ring_shift, 4, network=NET, args=(data, 3), trace=False)
    assert off.trace is None
    assert off.time == on.time
    for a, b in zip(on.values, off.values):
        np.testing.assert_array_equal(a, b)


# --- payloads ----------------------------------------------------------------------------

def test_send_snapshots_the_payload():
    def mutate_after_send(comm):
        if comm.rank == 0:
            x = np.zeros(4)
            nested = {"grad": np.zeros(2), "parts": [np.zeros(1)]}
            yield comm.send(1, x)
            yield comm.send(1, nested, tag=1)
            x[:] = 99.0                 # after the send: must change nothing received
            nested["grad"][:] = 99.0
            nested["parts"][0][:] = 99.0
            nested["parts"].append(np.ones(1))
            nested["new"] = 1
            return None
        yield comm.compute(1.0)         # receive long after the mutation
        x = yield comm.recv(0)
        nested = yield comm.recv(0, tag=1)
        return x, nested

    result = dsml.run(mutate_after_send, 2, network=NET)
    x, nested = result.values[1]
    np.testing.assert_array_equal(x, np.zeros(4))
    np.testing.assert_array_equal(nested["grad"], np.zeros(2))
    assert len(nested["parts"]) == 1 and nested["parts"][0][0] == 0.0
    assert set(nested) == {"grad", "parts"}


@pytest.mark.parametrize("engine", ["sim", "threads", "processes"])
def test_the_snapshot_is_taken_when_the_request_is_yielded(engine):
    """Building a request does nothing; the engine copies the payload as it handles the
    request. So a change between building and yielding is sent, one after yielding is not."""
    def ring_and_mutate(comm):
        x = np.full(3, float(comm.rank))
        req = comm.sendrecv(1 - comm.rank, x, 1 - comm.rank)
        x[:] = 10.0 + comm.rank         # before yielding: part of the message
        got = yield req
        x[:] = -1.0                     # after: must change nothing the peer received
        yield comm.sendrecv(1 - comm.rank, np.zeros(1), 1 - comm.rank, tag=1)
        return got

    options = {"network": NET} if engine == "sim" else {"timeout": 60}
    result = dsml.run(ring_and_mutate, 2, engine=engine, **options)
    np.testing.assert_array_equal(result.values[0], np.full(3, 11.0))
    np.testing.assert_array_equal(result.values[1], np.full(3, 10.0))


def test_structured_payload_size_follows_the_documented_rule():
    grad = np.zeros(10, np.float64)          # 80 B
    idx = np.arange(3, dtype=np.int32)       # 12 B
    payload = (grad, idx, 7, 2.5, np.float32(1.0), None, True)
    expected = STRUCT_HEADER_BYTES + 80 + 12 + 5 * SCALAR_BYTES
    assert STRUCT_HEADER_BYTES == 16 and SCALAR_BYTES == 8
    assert payload_nbytes(payload) == expected == 148
    # Nesting adds no extra header; dict keys count like scalars (a str by its UTF-8 length).
    assert payload_nbytes({"v": 3, "g": grad}) == 16 + (1 + 8) + (1 + 80)
    assert payload_nbytes([grad, (idx, 1)]) == 16 + 80 + 12 + 8
    assert payload_nbytes(grad) == 80                    # a bare array has no header
    assert payload_nbytes(SizeOnly(123)) == 123
    assert payload_nbytes((SizeOnly(100), 1)) == 16 + 100 + 8

    result = dsml.run(one_way, 2, network=NET, args=(payload,))
    got = result.values[1]
    assert isinstance(got, tuple) and got[2:] == (7, 2.5, np.float32(1.0), None, True)
    np.testing.assert_array_equal(got[0], grad)
    np.testing.assert_array_equal(got[1], idx)
    assert close(result.time, t_msg(expected))
    assert [r.nbytes for r in result.trace] == [expected, expected]


def test_size_only_payloads_cost_their_size_and_arrive_as_placeholders():
    result = dsml.run(one_way, 2, network=NET, args=(SizeOnly(1_000_000),))
    assert result.values[1] == SizeOnly(1_000_000)
    assert close(result.time, t_msg(1_000_000))
    data = [SizeOnly(4096) for _ in range(6)]
    ring = dsml.run(ring_shift, 6, network=NET, args=(data, 5), trace=False)
    assert close(ring.time, 5 * t_msg(4096))
    assert ring.values == data
    assert repr(SizeOnly(3)) == "SizeOnly(3)" and hash(SizeOnly(3)) == hash(SizeOnly(3))


@pytest.mark.parametrize("bad", [-1, 1.5, "10", None])
def test_size_only_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match=r"SizeOnly nbytes must be an integer ≥ 0"):
        SizeOnly(bad)


# --- tags ---------------------------------------------------------------------------------

def test_tags_match_including_out_of_order():
    def tagged(comm):
        if comm.rank == 0:
            yield comm.send(1, np.array([1.0]), tag=1)
            yield comm.send(1, np.array([2.0]), tag=2)
            yield comm.send(1, np.array([3.0]), tag=1)
            yield comm.send(1, np.array([4.0]))
            return None
        b = yield comm.recv(0, tag=2)       # the second message, first
        d = yield comm.recv(0)              # tag 0
        a = yield comm.recv(0, tag=1)       # same (src, tag): first in, first out
        c = yield comm.recv(0, tag=1)
        return [float(v[0]) for v in (a, b, c, d)]

    result = dsml.run(tagged, 2, network=NET)
    assert result.values[1] == [1.0, 2.0, 3.0, 4.0]


def test_messages_from_different_sources_are_told_apart():
    def two_sources(comm):
        if comm.rank == 0:
            from2 = yield comm.recv(2)
            from1 = yield comm.recv(1)
            return int(from1[0]), int(from2[0])
        yield comm.send(0, np.array([comm.rank * 10]))

    assert dsml.run(two_sources, 3, network=NET).values[0] == (10, 20)


# --- property: the ring shift equals np.roll ------------------------------------------------

@settings(deadline=None, max_examples=40)
@given(p=st.integers(2, 9), n=st.integers(0, 12), rounds=st.integers(0, 6),
       seed=st.integers(0, 2**32 - 1))
def test_ring_shift_equals_numpy_roll(p, n, rounds, seed):
    data = np.random.default_rng(seed).standard_normal((p, n))
    result = dsml.run(ring_shift, p, network=NET, args=(list(data), rounds))
    np.testing.assert_array_equal(np.stack(result.values), np.roll(data, rounds, axis=0))
    assert math.isclose(result.time, rounds * t_msg(8 * n), rel_tol=1e-12, abs_tol=1e-300)


# --- bad input ------------------------------------------------------------------------------

def noop(comm):
    yield comm.compute(0.0)


@pytest.mark.parametrize("world_size", [0, -1, 1.5, True, "2"])
def test_bad_world_size(world_size):
    with pytest.raises(ValueError, match=r"world_size must be an integer ≥ 1, got "
                       + repr(world_size).replace(".", r"\.")):
        dsml.run(noop, world_size, network=NET)


def test_unknown_engine():
    with pytest.raises(ValueError, match=r"unknown engine 'gpu'; choose one of sim, threads, processes"):
        dsml.run(noop, 2, engine="gpu", network=NET)


def test_sim_without_network():
    with pytest.raises(ValueError, match=r"engine='sim' needs a network model"):
        dsml.run(noop, 2)


def test_a_plain_function_is_rejected_naming_it():
    def plain_function(comm):
        return comm.rank

    with pytest.raises(TypeError, match=r"program plain_function must be a generator function"
                       r".*returned int"):
        dsml.run(plain_function, 2, network=NET)


def test_a_non_callable_program_is_rejected():
    with pytest.raises(TypeError, match=r"program must be a generator function, got str"):
        dsml.run("ring", 2, network=NET)


def test_yielding_a_non_request_names_the_rank():
    def yields_junk(comm):
        if comm.rank == 1:
            yield 42
        yield comm.compute(0.0)

    with pytest.raises(RankError, match=r"rank 1 yielded 42, which is not a request") as info:
        dsml.run(yields_junk, 2, network=NET)
    assert info.value.rank == 1


@pytest.mark.parametrize("dst, why", [(2, r"dst must be a rank in 0\.\.1, got 2"),
                                      (5, r"dst must be a rank in 0\.\.1, got 5"),
                                      (-1, r"dst must be a rank in 0\.\.1, got -1"),
                                      (0, r"dst is this rank itself"),
                                      (1.0, r"dst must be a rank in 0\.\.1, got 1\.0")])
def test_send_to_a_bad_rank(dst, why):
    def bad_send(comm):
        yield comm.send(dst, np.zeros(1))

    with pytest.raises(ValueError, match=r"rank 0: " + why):
        Comm(0, 2).send(dst, np.zeros(1))
    # Inside a run the rank fails, and the run names it with the ValueError chained.
    with pytest.raises(RankError, match=r"rank 0 failed at t=0 s: ValueError: rank 0: " + why) \
            as info:
        dsml.run(bad_send, 2, network=NET)
    assert isinstance(info.value.__cause__, ValueError)


def test_recv_and_sendrecv_check_their_peers_too():
    comm = Comm(1, 3)
    with pytest.raises(ValueError, match=r"rank 1: src must be a rank in 0\.\.2, got 3"):
        comm.recv(3)
    with pytest.raises(ValueError, match=r"rank 1: src is this rank itself"):
        comm.sendrecv(0, np.zeros(1), 1)
    with pytest.raises(ValueError, match=r"rank 1: tag must be an integer ≥ 0, got -1"):
        comm.recv(0, tag=-1)
    with pytest.raises(ValueError, match=r"compute seconds must be a finite number ≥ 0, got nan"):
        comm.compute(float("nan"))
    with pytest.raises(ValueError, match=r"compute seconds must be a finite number ≥ 0, got -1"):
        comm.compute(-1)


@pytest.mark.parametrize("payload, kind", [(object(), "object"), ({1: object()}, "object"),
                                           ((np.zeros(1), {2, 3}), "set")])
def test_a_payload_that_is_not_an_array_is_a_type_error(payload, kind):
    with pytest.raises(TypeError, match=r"a payload must be a NumPy array, a SizeOnly "
                       r"placeholder, or a tuple/list/dict of arrays and scalars; got " + kind):
        Comm(0, 2).send(1, payload)
    with pytest.raises(TypeError, match=r"got " + kind):
        Comm(0, 2).sendrecv(1, payload, 1)
    with pytest.raises(RankError, match=r"rank 0 failed .*TypeError: a payload must be") as info:
        dsml.run(one_way, 2, network=NET, args=(payload,))
    assert isinstance(info.value.__cause__, TypeError)


@pytest.mark.parametrize("name", ["alpha", "beta", "gamma"])
@pytest.mark.parametrize("value", [-1e-9, float("nan"), float("inf")])
def test_bad_network_parameters_name_the_parameter(name, value):
    params = {"alpha": 1e-6, "beta": 1e-9, "gamma": 0.0, name: value}
    with pytest.raises(ValueError, match=rf"{name} must be a finite number ≥ 0, got "):
        AlphaBeta(**params)


def test_good_network_parameters_are_kept():
    net = AlphaBeta(1e-6, 2e-9, gamma=3e-10)
    assert (net.alpha, net.beta, net.gamma) == (1e-6, 2e-9, 3e-10)
    assert close(net.message_time(1000), 1e-6 + 2e-6)
    assert "alpha=1e-06" in repr(net)


def test_deadlock_names_each_rank_and_whom_it_waits_for():
    def everyone_receives_first(comm):
        got = yield comm.recv((comm.rank - 1) % comm.size)
        yield comm.send((comm.rank + 1) % comm.size, got)

    with pytest.raises(DeadlockError) as info:
        dsml.run(everyone_receives_first, 3, network=NET)
    message = str(info.value)
    assert "deadlock at t=0 s" in message and "3 process(es) still wait" in message
    for rank in range(3):
        assert f"rank {rank} waits for a message from rank {(rank - 1) % 3} (tag 0)" in message


def test_deadlock_after_some_progress_names_only_the_waiting_ranks():
    def half_stuck(comm):
        if comm.rank == 0:
            yield comm.send(1, np.zeros(10, np.uint8))
            yield comm.send(2, np.zeros(10, np.uint8))
            return None
        yield comm.recv(0)
        if comm.rank == 1:
            yield comm.sendrecv(2, np.zeros(1), 2, tag=5)
        else:
            yield comm.recv(1, tag=6)

    with pytest.raises(DeadlockError) as info:
        dsml.run(half_stuck, 3, network=NET)
    message = str(info.value)
    assert "2 process(es) still wait" in message
    assert "rank 0 waits" not in message
    assert "rank 1 waits in sendrecv for a message from rank 2 (tag 5) while sending " \
           "to rank 2" in message
    assert "rank 2 waits for a message from rank 1 (tag 6)" in message


def test_a_tag_mismatch_is_reported_with_the_unreceived_message():
    def mismatched(comm):
        if comm.rank == 0:
            yield comm.send(1, np.zeros(3), tag=1)
        else:
            yield comm.recv(0, tag=0)

    with pytest.raises(DeadlockError, match=r"rank 1 waits for a message from rank 0 \(tag 0\)"
                       r"(.|\n)*never received(.|\n)*rank 0 -> rank 1 \(tag 1\): 1 message"):
        dsml.run(mismatched, 2, network=NET)


def test_a_message_never_received_when_all_ranks_finish_is_an_error():
    def forgetful(comm):
        if comm.rank == 0:
            yield comm.send(1, np.zeros(3))
            yield comm.send(1, np.zeros(3))
        else:
            yield comm.recv(0)

    with pytest.raises(RankError, match=r"rank 1 finished without receiving messages sent to "
                       r"it(.|\n)*rank 0 -> rank 1 \(tag 0\): 1 message") as info:
        dsml.run(forgetful, 2, network=NET)
    assert info.value.rank == 1


def test_a_rank_that_raises_is_named_with_the_original_exception_chained():
    class Boom(Exception):
        pass

    def raises_on_rank_2(comm):
        yield comm.compute(0.5)
        if comm.rank == 2:
            raise Boom("the gradient is NaN")
        yield comm.compute(1.0)

    with pytest.raises(RankError, match=r"rank 2 failed at t=0\.5 s: Boom: the gradient is NaN") \
            as info:
        dsml.run(raises_on_rank_2, 4, network=NET)
    assert info.value.rank == 2
    assert isinstance(info.value.__cause__, Boom)


def test_a_rank_that_raises_when_woken_by_another_ranks_message_is_the_one_named():
    def raises_after_recv(comm):
        if comm.rank == 0:
            yield comm.send(1, np.zeros(1))
            yield comm.compute(5.0)
        else:
            got = yield comm.recv(0)
            got[1]          # IndexError, raised while rank 0's delivery event runs

    with pytest.raises(RankError, match=r"rank 1 failed at t=5e-06 s: IndexError") as info:
        dsml.run(raises_after_recv, 2, network=AlphaBeta(5e-6, 0.0))
    assert info.value.rank == 1 and isinstance(info.value.__cause__, IndexError)


# --- limits that bound a simulation (dsml.sim_support) ------------------------------

def forever_computing(comm):
    while True:
        yield comm.compute(1e-3)


@pytest.mark.parametrize("request_", ["compute(0)", "now()", "combine(0)"])
def test_a_loop_of_requests_answered_at_once_is_stopped_by_max_events(request_):
    """These requests cost no event: the guard counts them as steps all the same."""
    def loop(comm):
        while True:
            yield eval(f"comm.{request_}")
    with pytest.raises(LimitExceeded, match=r"stopped after max_events=1,000 steps") as info:
        dsml.run(loop, 2, network=NET, max_events=1000)
    # It names what each rank was doing, as a deadlock report does: rank 0 never gave the
    # event loop back, so rank 1 never started.
    assert f"\n  rank 0 {info.value.waiting[0].waiting_for.describe()}\n" in str(info.value)
    assert "\n  rank 1 has not started\n" in str(info.value)
    assert {p.name for p in info.value.waiting} == {"rank 0", "rank 1"}


def test_a_never_ending_program_stops_at_the_default_guard_without_arguments():
    from dsml import sim_support
    with pytest.raises(LimitExceeded, match=r"rank 0 computes for 0.001 s"):
        simulate_with_small_default(forever_computing, sim_support)


def simulate_with_small_default(program, sim_support):
    saved = sim_support.DEFAULT_MAX_EVENTS
    sim_support.DEFAULT_MAX_EVENTS = 5_000
    try:
        return dsml.run(program, 2, network=NET)        # no max_events, no timeout
    finally:
        sim_support.DEFAULT_MAX_EVENTS = saved


def test_the_wall_clock_timeout_stops_a_simulation():
    with pytest.raises(LimitExceeded, match=r"stopped after timeout=0.05 s of wall-clock time"
                       r".*\n  rank 0 computes for 0.001 s"):
        dsml.run(forever_computing, 2, network=NET, timeout=0.05)


def test_max_events_is_exact_and_a_run_within_it_is_untouched():
    def steps(comm, n):
        for _ in range(n):
            yield comm.compute(0)                       # answered at once: one step each
        return n
    assert dsml.run(steps, 1, network=NET, args=(50,), max_events=51).values == [50]
    with pytest.raises(LimitExceeded, match="max_events=50 steps"):
        dsml.run(steps, 1, network=NET, args=(50,), max_events=50)


@pytest.mark.parametrize("bad", [1.5, "10", float("nan"), -1, 0, True])
def test_max_events_that_would_disable_the_guard_is_refused(bad):
    with pytest.raises(ValueError, match=r"max_events must be an integer ≥ 1 .*got"):
        dsml.run(forever_computing, 2, network=NET, max_events=bad)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "5", True])
def test_a_bad_timeout_is_refused_on_the_simulator(bad):
    with pytest.raises(ValueError, match=r"timeout must be > 0 seconds"):
        dsml.run(forever_computing, 2, network=NET, timeout=bad)


def test_the_limit_report_lists_at_most_16_processes():
    with pytest.raises(LimitExceeded, match=r"… and 4 more") as info:
        dsml.run(forever_computing, 20, network=NET, max_events=100)
    assert "20 process(es) had not finished" in str(info.value)


# --- a collective called without `yield from` ---------------------------------------

def exchange(comm, x):
    """A stand-in collective: a generator function meant for `yield from`."""
    peer = 1 - comm.rank
    other = yield comm.sendrecv(peer, x, peer)
    return x + other


def test_yielding_a_collective_says_use_yield_from():
    def wrong(comm):
        x = yield exchange(comm, np.ones(2))            # should be `yield from`
        return x
    with pytest.raises(RankError, match=r"rank 0 yielded a generator \(exchange\(\.\.\.\)\), "
                       r"not a request; call a collective with `yield from`, e.g. "
                       r"`x = yield from allreduce\(comm, x\)`"):
        dsml.run(wrong, 2, network=NET)


def test_returning_a_collective_that_never_ran_says_use_yield_from():
    def wrong(comm):
        x = exchange(comm, np.ones(2))                  # never runs: no `yield from`
        yield comm.compute(0)
        return x
    with pytest.raises(RankError, match=r"rank 0 returned a generator \(exchange\(\.\.\.\)\) "
                       r"that never ran.*`yield from`"):
        dsml.run(wrong, 2, network=NET)


def test_the_right_call_runs():
    def right(comm):
        x = yield from exchange(comm, np.ones(2))
        return x
    assert [list(v) for v in dsml.run(right, 2, network=NET).values] == [[2, 2], [2, 2]]


def test_sending_a_collective_that_never_ran_hints_at_yield_from():
    def wrong(comm):
        x = exchange(comm, np.ones(2))                  # a generator, not an array
        if comm.rank == 0:
            yield comm.send(1, x)
    with pytest.raises(RankError, match=r"got generator \(a collective called without "
                       r"`yield from`\?\)"):
        dsml.run(wrong, 2, network=NET)


def test_yielding_a_collective_uncalled_says_use_yield_from():
    def wrong(comm):
        yield exchange                                  # not even called
    with pytest.raises(RankError, match=r"rank 0 yielded the generator function exchange "
                       r"itself, not a request; call a collective with `yield from`"):
        dsml.run(wrong, 2, network=NET)
