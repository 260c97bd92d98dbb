"""Tests for the exercise harness and week 1's checkers: each reference solution passes,
each named plausible mistake fails, untouched stubs are "not attempted", and a learner's
crash or deadlock becomes a ✗ instead of an exception. The contract every week keeps is in
exercise_contract; this module adds week 1's mistakes, hints and the harness itself."""
from __future__ import annotations

import math

import pytest

import exercise_contract as contract
from dsml.exercises import FAILED, PASSED, Grade, check, grade, known_ids

solution = contract.solution_module(1)
NOTEBOOK = contract.ROOT / "notebooks" / "week1_foundations_and_communication.ipynb"


# --- plausible wrong answers, one named function per mistake --------------------------------

# 1.1: solves n = f(α + nβ)/β as if nβ on the right were absent: f·α/β.
def fraction_size_drops_n_beta(alpha, beta, fraction):
    return fraction * alpha / beta


# 1.1: the ratio upside down: (1 − f)/f · α/β (right only at f = ½).
def fraction_size_inverted(alpha, beta, fraction):
    return (1 - fraction) / fraction * alpha / beta


# 1.1: Hockney's n½ = α/β whatever the fraction: f never enters.
def fraction_size_n_half(alpha, beta, fraction):
    return alpha / beta


# 1.2: Hockney's n½ = α/β: ignores the hops and the chunks.
def break_even_n_half(hops, chunks, alpha, beta):
    return alpha / beta


# 1.2: h instead of h − 1: kα/(hβ).
def break_even_h_not_h_minus_1(hops, chunks, alpha, beta):
    return chunks * alpha / (hops * beta)


# 1.2: a size a little below the break-even: just above it pipelining still loses.
def break_even_slightly_low(hops, chunks, alpha, beta):
    return 0.999 * chunks * alpha / ((hops - 1) * beta)


# 1.3: one inter-machine hop only: forgets the core switch between the two machines.
def two_level_one_inter_hop(nbytes, intra_latency, intra_bandwidth, inter_latency,
                            inter_bandwidth):
    return (2 * (intra_latency + nbytes / intra_bandwidth)
            + (inter_latency + nbytes / inter_bandwidth))


# 1.3: forgets the hops inside the machines (rank ↔ its machine's switch).
def two_level_no_intra_hops(nbytes, intra_latency, intra_bandwidth, inter_latency,
                            inter_bandwidth):
    return 2 * (inter_latency + nbytes / inter_bandwidth)


# 1.4: h instead of h − 1 in k* = √((h − 1)nβ/α).
def chunks_with_h(nbytes, hops, alpha, beta):
    return max(1, round(math.sqrt(hops * nbytes * beta / alpha)))


# 1.4: the continuous optimum, not rounded to a whole number of chunks.
def chunks_unrounded(nbytes, hops, alpha, beta):
    return math.sqrt((hops - 1) * nbytes * beta / alpha)


# 1.4: rounds the continuous optimum to the nearest integer; T(k) is not symmetric about
# k*, so the better neighbour can be the farther one (k* ≈ 2.47: T(3) < T(2)).
def chunks_rounded_to_nearest(nbytes, hops, alpha, beta):
    return max(1, round(math.sqrt((hops - 1) * nbytes * beta / alpha)))


# 1.5: p steps instead of p − 1 (a rank does not send to itself).
def shifted_p_steps(p, nbytes, alpha, beta):
    return p * (alpha + nbytes * beta)


# 1.5: pays the bandwidth term once, as if the steps' bytes overlapped.
def shifted_bandwidth_once(p, nbytes, alpha, beta):
    return (p - 1) * alpha + nbytes * beta


# 1.6: forgets the receiver's overhead (one o only).
def loggp_one_overhead(nbytes, L, o, g, G):
    return o + (nbytes - 1) * G + L


# 1.6: nG: charges the gap per byte for the first byte too.
def loggp_n_gaps(nbytes, L, o, g, G):
    return o + nbytes * G + L + o


# 1.6: adds the gap g, which spaces consecutive messages and does not enter a single one.
def loggp_counts_gap(nbytes, L, o, g, G):
    return o + (nbytes - 1) * G + L + o + g


# 1.7: every rank receives before it sends: deadlock.
def ring_pass_receive_first(comm, x, rounds):
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    for _ in range(rounds):
        x = yield comm.recv(left)
        yield comm.send(right, x)
    return x


# 1.7: passes leftward (to rank − 1) instead of rightward.
def ring_pass_leftward(comm, x, rounds):
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    for _ in range(rounds):
        x = yield comm.sendrecv(left, x, right)
    return x


# 1.7: sends but keeps its own array, dropping what arrives.
def ring_pass_keeps_own(comm, x, rounds):
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    for _ in range(rounds):
        yield comm.sendrecv(right, x, left)
    return x


# 1.7: one round short: the loop starts at 1.
def ring_pass_one_round_short(comm, x, rounds):
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    for _ in range(1, rounds):
        x = yield comm.sendrecv(right, x, left)
    return x


# 1.7: a plain function, not a generator: forgets that rank programs yield.
def ring_pass_not_generator(comm, x, rounds):
    return x


# 1.8: store-and-forward over the two hops: ignores the chunks.
def ring_star_ignores_chunks(p, nbytes, rounds, overhead, latency, bandwidth, chunks):
    return rounds * (overhead + 2 * (latency + nbytes / bandwidth))


# 1.8: one hop per message, as on AlphaBeta: ignores the switch.
def ring_star_ignores_switch(p, nbytes, rounds, overhead, latency, bandwidth, chunks):
    return rounds * (overhead + latency + nbytes / bandwidth)


# 1.8: h·k chunk-times per round: the chunks do not overlap across the two hops.
def ring_star_chunks_not_pipelined(p, nbytes, rounds, overhead, latency, bandwidth, chunks):
    return rounds * (overhead + 2 * chunks * (latency + nbytes / bandwidth / chunks))


# 1.8: the host overhead paid again by every chunk on every hop, like the hop latency.
def ring_star_overhead_per_chunk(p, nbytes, rounds, overhead, latency, bandwidth, chunks):
    return rounds * (chunks + 1) * (overhead + latency + nbytes / bandwidth / chunks)


# 1.8: forgets the host overhead.
def ring_star_no_overhead(p, nbytes, rounds, overhead, latency, bandwidth, chunks):
    return rounds * (chunks + 1) * (latency + nbytes / bandwidth / chunks)


# 1.9: forgets the wrap-around links: cuts each ring once.
def bisection_no_wraparound(rows, cols):
    return min(rows, cols)


# 1.9: half the hosts, not the links between the halves.
def bisection_half_hosts(rows, cols):
    return rows * cols // 2


WRONG = {
    "1.1": [fraction_size_drops_n_beta, fraction_size_inverted, fraction_size_n_half],
    "1.2": [break_even_n_half, break_even_h_not_h_minus_1, break_even_slightly_low],
    "1.3": [two_level_one_inter_hop, two_level_no_intra_hops],
    "1.4": [chunks_with_h, chunks_unrounded, chunks_rounded_to_nearest],
    "1.5": [shifted_p_steps, shifted_bandwidth_once],
    "1.6": [loggp_one_overhead, loggp_n_gaps, loggp_counts_gap],
    "1.7": [ring_pass_receive_first, ring_pass_leftward, ring_pass_keeps_own,
            ring_pass_one_round_short, ring_pass_not_generator],
    "1.8": [ring_star_ignores_chunks, ring_star_ignores_switch,
            ring_star_chunks_not_pipelined, ring_star_overhead_per_chunk,
            ring_star_no_overhead],
    "1.9": [bisection_no_wraparound, bisection_half_hosts],
}

RANK_PROGRAMS = ["1.7"]     # the exercises whose answer is a rank program (a generator)


def reference(exercise_id):
    return contract.reference(1, exercise_id, solution)


# --- the contract every week keeps -------------------------------------------------------------

globals().update(contract.contract_tests(
    1, 9, solution, WRONG, not_attempted_id="1.4", rank_programs=RANK_PROGRAMS))


def test_no_stub_shadows_a_name_the_notebook_body_defines():
    contract.assert_no_stub_shadows_the_body(
        1, NOTEBOOK, {"pipelined_time", "ping_pong", "incast", "half_performance_size"})


# --- week 1's hints --------------------------------------------------------------------------

def test_learner_exception_message_names_the_error():
    def size_for_fraction(alpha, beta, fraction):
        return alpha / "beta"
    message = grade("1.1", size_for_fraction).message
    assert message.startswith("your code raised TypeError: unsupported operand")


def test_deadlock_hint_says_every_rank_receives_first():
    message = grade("1.7", ring_pass_receive_first).message
    assert "deadlock" in message
    assert "every rank waits to receive" in message
    assert "sendrecv" in message and "send before receiving" in message


def test_fraction_hint_states_input_returned_and_what_it_achieves():
    message = grade("1.1", fraction_size_drops_n_beta).message
    assert "alpha=3e-06" in message and "beta=8e-11" in message       # the input
    assert "fraction=0.9" in message
    assert "returned 33750 B" in message                               # the answer
    assert "0.4737 of the peak" in message                             # what it achieves
    assert "too small" in message and "nβ in the denominator was dropped" in message
    assert "f and 1 − f changed places" in grade("1.1", fraction_size_inverted).message
    assert "answer for f = ½ only" in grade("1.1", fraction_size_n_half).message


def test_fraction_hints_never_give_the_expected_size():
    # A learner who collects the hints must not get a table of answers: answers right on the
    # cases before case i and 10 % off on case i get hints without case i's size.
    cases = [(3e-6, 8e-11, 0.9), (1.5e-4, 1e-9, 0.25), (2e-6, 5e-11, 0.5)]
    for i, (alpha, beta, fraction) in enumerate(cases):
        truth = solution.size_for_fraction(alpha, beta, fraction)

        def off_on_case_i(a, b, f, i=i):
            right = solution.size_for_fraction(a, b, f)
            return 1.1 * right if (a, b, f) == cases[i] else right
        message = grade("1.1", off_on_case_i).message
        assert f"fraction={fraction:g}" in message
        assert "too large" in message
        for shown in (f"{truth:.6g}", f"{truth:g}", f"{truth:,.0f}", f"{truth:.0f}"):
            assert shown not in message, (shown, message)


def test_loggp_hints_name_the_mistake_and_never_the_derivation():
    assert "receiving CPU pay one too" in grade("1.6", loggp_one_overhead).message
    assert "first byte wait" in grade("1.6", loggp_n_gaps).message
    assert "gap g is counted" in grade("1.6", loggp_counts_gap).message
    fallback = grade("1.6", lambda nbytes, L, o, g, G: L).message
    assert "too short" in fallback and "Perhaps" not in fallback
    assert "n − 1" not in fallback and "o + " not in fallback and "expected" not in fallback
    assert "Follow one message" in fallback


def test_ring_pass_hints_tell_one_round_short_from_the_wrong_direction():
    short = grade("1.7", ring_pass_one_round_short).message
    wrong_way = grade("1.7", ring_pass_leftward).message
    assert "p=5" in short and "rounds=2" in short
    assert "one round short" in short and "wrong way" not in short
    assert "wrong way" in wrong_way and "one round short" not in wrong_way
    assert "kept its own array" in grade("1.7", ring_pass_keeps_own).message


@pytest.mark.parametrize("exercise_id, arguments, stated", [
    ("1.1", (10e-6, 4e-11, 0.8), 1_000_000),
    ("1.2", (3, 4, 10e-6, 1e-9), 20_000),
    ("1.3", (1e6, 1e-6, 100e9, 5e-6, 10e9), 232e-6),
    ("1.4", (1e6, 3, 10e-6, 1e-9), 14),
    ("1.5", (6, 1e6, 10e-6, 1e-10), 550e-6),
    ("1.6", (1000, 2e-6, 1e-6, 3e-6, 1e-9), 4.999e-6),
    ("1.8", (4, 1e6, 2, 1e-6, 0.3e-6, 10e9, 4), 255e-6),
    ("1.9", (4, 8), 8),
])
def test_worked_examples_in_the_statements_are_right(exercise_id, arguments, stated):
    # The example each statement types in is the reference solution's answer.
    assert math.isclose(reference(exercise_id)(*arguments), stated, rel_tol=1e-9)


def test_break_even_hint_says_which_side_is_wrong():
    message = grade("1.2", break_even_slightly_low).message
    assert "just above your answer, pipelining is still slower" in message
    early = grade("1.2", lambda hops, chunks, alpha, beta:
                  1.001 * chunks * alpha / ((hops - 1) * beta)).message
    assert "just below your answer, pipelining already wins" in early


def test_break_even_rejects_a_size_that_is_not_positive():
    message = grade("1.2", lambda hops, chunks, alpha, beta: 0.0).message
    assert "a message size is > 0" in message


def test_non_number_answer_is_failed_with_its_type():
    def size_for_fraction(alpha, beta, fraction):
        return "337500"
    message = grade("1.1", size_for_fraction).message
    assert "returned '337500' (str); expected a number" in message


def test_missing_return_is_named():
    def two_level_time(nbytes, intra_latency, intra_bandwidth, inter_latency, inter_bandwidth):
        2 * (intra_latency + nbytes / intra_bandwidth)
    assert "forget a `return`" in grade("1.3", two_level_time).message


def test_optimal_chunks_accepts_any_tied_integer():
    # Returning a float that is a whole number (13.0) is accepted as a count.
    def optimal_chunks(nbytes, hops, alpha, beta):
        return float(solution.optimal_chunks(nbytes, hops, alpha, beta))
    assert grade("1.4", optimal_chunks).status == PASSED


@pytest.mark.parametrize("exercise_id, words", [
    ("1.3", "the simulator sent 4096 B across two_level(3, 2, ...)"),
    ("1.5", "the simulator ran the exchange on 5 ranks"),
    ("1.8", "the simulator ran the ring pass on star(5) with 4 chunks"),
])
def test_pass_message_reports_the_simulation(exercise_id, words):
    result = grade(exercise_id, reference(exercise_id))
    assert words in result.message, result.line()


def test_simulated_checks_measure_rather_than_assume():
    # The checkers compare with the simulator, not with the reference formula: where the
    # formula's assumptions fail the simulation departs from it, and the checker would follow.
    from dsml.exercises.week1 import simulate_ring_pass_on_star, simulate_shifted_exchange
    alpha, beta = 2e-6, 1e-10
    assert math.isclose(simulate_shifted_exchange(5, 1000, alpha, beta),
                        solution.shifted_exchange_time(5, 1000, alpha, beta), rel_tol=1e-12)
    # k does not divide n: the first n mod k chunks are one byte larger, so each round
    # takes ⌈n/k⌉β − nβ/k longer than o + (k + 1)(ℓ + nβ/k).
    p, nbytes, rounds, overhead, latency, bandwidth, chunks = 5, 100_001, 2, 1e-6, 3e-7, 25e9, 4
    simulated = simulate_ring_pass_on_star(p, nbytes, rounds, overhead, latency, bandwidth,
                                           chunks)
    closed = solution.predict_ring_pass_time(p, nbytes, rounds, overhead, latency, bandwidth,
                                             chunks)
    extra = rounds * (math.ceil(nbytes / chunks) - nbytes / chunks) / bandwidth
    assert not math.isclose(simulated, closed, rel_tol=1e-9)
    assert math.isclose(simulated, closed + extra, rel_tol=1e-12)


def test_ring_pass_on_star_cases_keep_the_closed_form_exact():
    # The statement promises that k divides n (and n > 0); the checker's inputs keep it.
    from dsml.exercises.week1 import RING_PASS_ON_STAR_CASES
    assert any(chunks == 1 for *_, chunks in RING_PASS_ON_STAR_CASES)
    assert any(chunks > 1 for *_, chunks in RING_PASS_ON_STAR_CASES)
    for p, nbytes, rounds, overhead, latency, bandwidth, chunks in RING_PASS_ON_STAR_CASES:
        assert nbytes > 0 and nbytes % chunks == 0, (nbytes, chunks)


# --- the harness: printing, ids, arity ------------------------------------------------------

def test_check_prints_one_line_per_status_and_returns_none(capsys):
    def stub(alpha, beta, fraction):
        raise NotImplementedError
    assert check("1.1", solution.size_for_fraction) is None
    assert check("1.1", fraction_size_inverted) is None
    assert check("1.1", stub) is None
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert lines[0] == "✓ Exercise 1.1 (size for a fraction of the peak): correct"
    assert lines[1].startswith("✗ Exercise 1.1 (size for a fraction of the peak): "
                               "size_for_fraction(alpha=3e-06, beta=8e-11, fraction=0.9) "
                               "returned")
    assert lines[2] == "· Exercise 1.1 (size for a fraction of the peak): not attempted yet"


def test_passed_note_stays_on_the_same_line(capsys):
    check("1.9", solution.torus_bisection_links)
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert out.startswith("✓ Exercise 1.9 (torus bisection): correct — ")


def test_grade_is_a_small_dataclass():
    result = grade("1.6", solution.loggp_time)
    assert isinstance(result, Grade)
    assert (result.exercise_id, result.title, result.status) == \
        ("1.6", "one message in LogGP", "passed")
    assert result.passed
    assert str(result) == result.line()


@pytest.mark.parametrize("bad_id", ["9.9", "1.99", "1.10", "one", "1"])
def test_unknown_id_lists_known_ids(bad_id):
    with pytest.raises(ValueError, match=r"unknown exercise id .*known ids: 1\.1, 1\.2"):
        grade(bad_id, solution.size_for_fraction)


@pytest.mark.parametrize("bad_id, shown", [(1.1, "the float 1.1"), (3, "the int 3"),
                                           (None, "the NoneType None")])
def test_an_id_that_is_not_a_string_is_refused_as_such(bad_id, shown):
    with pytest.raises(ValueError) as refused:
        grade(bad_id, solution.size_for_fraction)
    message = str(refused.value)
    assert message.startswith("an exercise id is a string, such as '")
    assert f"got {shown}" in message
    assert "unknown exercise id" not in message      # 1.1 is not listed as if it were known
    assert "The ids are '1.1', '1.2'" in message
    if isinstance(bad_id, float):
        assert "check('1.1', …)" in message


@pytest.mark.parametrize("answer, shown", [(1e6, "the float 1000000.0"), (42, "the int 42"),
                                           ("f", "the str 'f'")])
def test_an_answer_that_is_not_a_function_is_named_as_such(answer, shown):
    result = grade("1.1", answer)
    assert result.status == FAILED
    assert result.message == (f"check('1.1', …) expects a function (size_for_fraction, defined "
                              f"with def in the exercise cell); got {shown}")
    assert "raised" not in result.message


def test_unknown_id_error_also_from_check():
    with pytest.raises(ValueError, match="1.9"):
        check("0.1", solution.size_for_fraction)


def test_wrong_number_of_answers_is_failed():
    result = grade("1.1", solution.size_for_fraction, solution.pipelining_break_even)
    assert result.status == FAILED
    assert "takes 1 answer(s) (size_for_fraction), got 2" in result.message


def test_known_ids_include_week1_in_order():
    ids = known_ids()
    assert ids[:9] == [f"1.{k}" for k in range(1, 10)]


# --- answers copied from hints do not pass; the library's bisection is refused ----------------

def test_a_table_of_answers_copied_from_hints_fails_1_2_and_1_9():
    # On main, such a table passed 1.2 after 4 checks and 1.9 after 5.
    learned = contract.copied_answers_never_pass(
        "1.2", r"pipelining_break_even\(hops=(\S+), chunks=(\S+), alpha=(\S+), beta=(\S+)\)",
        r"expected (\S+) B")
    assert learned <= 3                                   # the fixed cases at most
    learned = contract.copied_answers_never_pass(
        "1.9", r"torus_bisection_links\(rows=(\S+), cols=(\S+)\)", r"expected (\d+)")
    assert learned == 1                                   # only the first case shows its count


def test_fresh_cases_1_2_keep_the_contract_for_every_base():
    contract.fresh_cases_keep_the_contract("1.2", solution.pipelining_break_even, WRONG, {})


def torus_bisection_from_library(rows, cols):
    from dsml.net import bisection_bandwidth, torus2d
    return round(bisection_bandwidth(torus2d(rows, cols, bandwidth=1.0), max_hosts=32))


def test_an_answer_that_calls_the_library_bisection_is_refused():
    result = grade("1.9", torus_bisection_from_library)
    assert result.status == FAILED
    assert result.message.startswith("exercise 1.9 asks you to build this yourself: your code "
                                     "called dsml.net.topology.bisection_bandwidth")
