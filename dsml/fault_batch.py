"""Plumbing (hand-written): the NumPy speed path of week 6's checkpointed job.

Section 1 of the notebook builds one simulator of a job that works, checkpoints, crashes and
restarts: the rank program `dsml.fault.checkpointed_job`, whose time comes from simulator
events. A Monte-Carlo estimate of the waste needs thousands of such jobs per interval, far
too many for one `dsml.run` each, so this module advances the same state machine for many
runs at once with NumPy arrays. It is a speed path, not a second model: the notebook and
`tests/test_fault.py` hold it equal to the rank program run by run (wall time, failures,
checkpoints), synchronous and asynchronous.
"""
from __future__ import annotations

import numpy as np

from dsml.validate_args import positive_number


def simulate_checkpointed_jobs(work: float, interval, checkpoint_cost: float,
                               restart_cost: float, failure_times: np.ndarray, horizon: float,
                               write_time: float = 0.0) -> dict:
    """The same job as `checkpointed_job`, for many runs at once with NumPy (row r of
    `failure_times`, shape (runs, K) sorted and +inf padded as `renewal_failure_times`
    makes, holds run r's crash times in seconds). `interval` is a number or one per run.

    Each loop iteration moves every unfinished run by one step of the same state machine:
    a piece of work plus its checkpoint, or a crash, or a restart. Returns a dict of
    arrays of shape (runs,): wall, lost, restart, checkpoint (s blocked), failures,
    checkpoints. Raises if a run outlives `horizon`, beyond which no crash was drawn.
    """
    failure_times = np.asarray(failure_times, dtype=float)
    if failure_times.ndim != 2 or failure_times.shape[1] == 0:
        raise ValueError(f"failure_times must have shape (runs, K ≥ 1), got {failure_times.shape}")
    runs = failure_times.shape[0]
    interval = np.broadcast_to(np.asarray(interval, dtype=float), (runs,)).copy()
    if not (np.all(interval > 0) and np.all(np.isfinite(interval))):
        raise ValueError(f"interval must be finite and > 0 (s), got {interval[~(interval > 0)][:1]}")
    # The checks of dsml.fault.check_job, made here: dsml.fault imports this module, not back.
    work = positive_number("work", work)
    checkpoint_cost = positive_number("checkpoint_cost", checkpoint_cost, allow_zero=True)
    write_time = positive_number("write_time", write_time, allow_zero=True)
    restart_cost = positive_number("restart_cost", restart_cost, allow_zero=True)
    horizon = positive_number("horizon", horizon)
    rows = np.arange(runs)
    t = np.zeros(runs)
    progress, durable = np.zeros(runs), np.zeros(runs)
    pending_progress, pending_done = np.zeros(runs), np.zeros(runs)
    has_pending = np.zeros(runs, bool)
    restarting, finished = np.zeros(runs, bool), np.zeros(runs, bool)
    pointer = np.zeros(runs, int)
    lost, restart, blocked = np.zeros(runs), np.zeros(runs), np.zeros(runs)
    failures, checkpoints = np.zeros(runs, int), np.zeros(runs, int)
    last_column = failure_times.shape[1] - 1
    while not finished.all():
        crash = failure_times[rows, np.minimum(pointer, last_column)]
        # Runs restarting after a crash: finish the restart, or crash again during it.
        in_restart = restarting & ~finished
        ok = in_restart & (t + restart_cost <= crash)
        again = in_restart & ~ok
        restart += np.where(ok, restart_cost, 0.0) + np.where(again, crash - t, 0.0)
        t = np.where(ok, t + restart_cost, np.where(again, crash, t))
        pointer += again
        failures += again
        restarting &= ~ok
        # Runs training: a piece of work and its checkpoint, unless a crash comes first.
        training = ~restarting & ~finished & ~in_restart
        piece = np.minimum(interval, work - progress)
        last = piece == work - progress
        waits = has_pending & ~last
        wait = np.where(waits, np.maximum(0.0, pending_done - (t + piece)), 0.0)
        end = t + piece + np.where(last, 0.0, wait + checkpoint_cost)
        ok = training & (end <= crash)
        crashed = training & ~ok
        # ... the piece went through: mirror the rank program's clock step by step.
        after_piece = t + piece
        after_wait = np.where(waits, np.maximum(after_piece, pending_done), after_piece)
        after_checkpoint = after_wait + checkpoint_cost
        saves = ok & ~last
        durable = np.where(saves & has_pending, pending_progress, durable)
        if write_time > 0:
            pending_progress = np.where(saves, progress + piece, pending_progress)
            pending_done = np.where(saves, after_checkpoint + write_time, pending_done)
            has_pending = has_pending | saves
        else:
            durable = np.where(saves, progress + piece, durable)
        blocked += np.where(saves, after_checkpoint - after_piece, 0.0)
        checkpoints += saves
        progress = np.where(ok, progress + piece, progress)
        t = np.where(saves, after_checkpoint, np.where(ok, after_piece, t))
        finished |= ok & last
        # ... or it crashed: keep what is on storage, then restart.
        lost += np.where(crashed, crash - t, 0.0)
        written = crashed & has_pending & (pending_done <= crash)
        durable = np.where(written, pending_progress, durable)
        progress = np.where(crashed, durable, progress)
        has_pending &= ~crashed
        t = np.where(crashed, crash, t)
        pointer += crashed
        failures += crashed
        restarting |= crashed
    if t.max(initial=0.0) > horizon:
        raise ValueError(f"a run lasted {t.max():.6g} s, beyond the horizon {horizon:.6g} s "
                         f"of its failure times; draw them over a longer horizon")
    return {"wall": t, "lost": lost, "restart": restart, "checkpoint": blocked,
            "failures": failures, "checkpoints": checkpoints}
