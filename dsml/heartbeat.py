"""Generated from notebooks/week6_fault_tolerance_and_scaling.ipynb — do not edit; edit the notebook and run `make export`."""

# imports repeated from earlier cells of the same notebook (added by the exporter)
from dsml.comm.failures import PeerFailed

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.elastic import InjectedCrash, pause
from dsml.membership_store import STORE_TAG, propose


# -- cell 158
import multiprocessing
import os
import signal

HEARTBEAT_TAG = 41


def heartbeat_worker(comm, monitor: int, period: float, stalls, crash_at=None,
                     how: str = "raise"):
    """Rank program: send `monitor` a heartbeat ("beat", fencing token) after each `period`
    s of work, late by `stalls[k]` s for beat k (a straggler), then ("bye", token). With
    `crash_at` = k it fails instead of beat k: how="raise" ends it fail-stop (the time on the
    error's `.time`), how="kill" SIGKILLs its own process (engine="processes" only). The
    token is the epoch the worker was admitted in: 0."""
    token = 0
    for k, stall in enumerate(stalls):
        if k == crash_at:
            yield from fail_now(comm, how, f"rank {comm.rank} failed before heartbeat {k}")
        yield from pause(comm, period + float(stall))
        yield comm.send(monitor, ("beat", token), tag=HEARTBEAT_TAG)
    yield comm.send(monitor, ("bye", token), tag=HEARTBEAT_TAG)
    return "finished"


def heartbeat_clock(comm, monitor: int, every: float):
    """Rank program: the monitor's timer. A rank program can only wait for messages, so time
    passing is a message too: a tick every `every` s, each answered "go on" or "stop"."""
    while True:
        yield from pause(comm, every)
        yield comm.send(monitor, ("tick", 0), tag=HEARTBEAT_TAG)
        if (yield comm.recv(monitor, tag=HEARTBEAT_TAG)) == "stop":
            return "stopped"


def fail_now(comm, how: str, why: str):
    """Fail this rank: raise InjectedCrash (its `.time` the failure's), or with how="kill"
    send its own process SIGKILL — no exception, no goodbye: the pipe just goes silent."""
    if how == "kill":
        if multiprocessing.parent_process() is None:
            raise ValueError("how='kill' needs engine='processes' (it kills the process)")
        os.kill(os.getpid(), signal.SIGKILL)
    if how != "raise":
        raise ValueError(f"how must be 'raise' or 'kill', got {how!r}")
    error = InjectedCrash(why)
    error.time = yield comm.now()
    raise error


# -- cell 159
def heartbeat_monitor(comm, workers, clock: int, timeout: float, store=None):
    """Rank program: the failure detector and membership. It takes the next message from
    anyone: a heartbeat notes when its worker was last heard; a tick from the `clock` rank
    suspects each member silent for more than `timeout` s and removes it — a new epoch, its
    token revoked, whatever it sends later refused (fenced). The engine's failure notice
    (PeerFailed) only says a worker will send nothing more; it never decides a suspicion.
    With `store` (a membership_store's rank), each suspicion goes to the store, which decides
    the new membership's generation by compare-and-set.
    Returns, once every worker has said bye or been suspected, and has gone quiet,
    {"suspected": {rank: time}, "fenced": [(time, rank)], "epoch", "finished": {ranks},
    "last": {rank: when last heard}} (times from comm.now())."""
    last = dict.fromkeys(workers, 0.0)
    revoked, suspected, fenced, finished, quiet = set(), {}, [], set(), set()
    epoch = 0
    while any((w not in finished and w not in suspected) or w not in quiet for w in workers):
        try:
            src, (kind, token) = yield comm.recv_any(HEARTBEAT_TAG)
        except PeerFailed as failure:
            quiet.add(failure.rank)                # silence from now on
            continue
        now = yield comm.now()
        if src == clock:
            for worker in workers:
                if worker not in finished and worker not in suspected \
                        and now - last[worker] > timeout:
                    suspected[worker] = now
                    revoked.add((worker, 0))
                    alive = [w for w in workers if w not in suspected]
                    epoch = epoch + 1 if store is None else \
                        (yield from propose(comm, store, alive, epoch))
            yield comm.send(clock, "go on", tag=HEARTBEAT_TAG)
            continue
        if (src, token) in revoked:
            fenced.append((now, src))              # a revoked token: refused
        else:
            last[src] = now
            if kind == "bye":
                finished.add(src)
        if kind == "bye":
            quiet.add(src)
    yield comm.recv(clock, tag=HEARTBEAT_TAG)      # the clock's next tick: tell it to stop
    yield comm.send(clock, "stop", tag=HEARTBEAT_TAG)
    if store is not None:
        yield comm.send(store, ("bye",), tag=STORE_TAG)
    return {"suspected": suspected, "fenced": fenced, "epoch": epoch, "finished": finished,
            "last": last}
