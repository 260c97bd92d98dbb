"""Plumbing (hand-written): the processes engine's parent watching its ranks.

`_collect` waits for every child's result (read without blocking, `_Result`) within the
run's deadline, asks `driver.hopeless` every 50 ms whether the run can still go on, and
raises the first failure, the deadlock, or the timeout (naming a stopped process,
`_stopped`). `_SigtermCleansUp` turns SIGTERM during a run into `Terminated`, so the run's
clean-up happens. The module docstring of `dsml.comm.processes` describes the whole engine.
"""
from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from multiprocessing.connection import wait

from dsml.comm.api import RankError
from dsml.comm.driver import (CHECK_EVERY, DONE, RankDied, hopeless, rank_failed, timed_out)
from dsml.comm.frames import _FRAME


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while a run was under way: raised like Ctrl-C's KeyboardInterrupt, so
    that the run cleans up (children stopped, segments unlinked); the signal's own effect
    follows (`_SigtermCleansUp`)."""


class _SigtermCleansUp:
    """While a run is under way in the main thread, SIGTERM raises Terminated (the clean-up
    of the run's `finally` happens), and afterwards the previous handler gets the signal —
    by default this process then ends by SIGTERM, as it would have."""

    def __enter__(self):
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGTERM)
            if previous not in (signal.SIG_IGN, None):
                self.previous = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise Terminated("SIGTERM during a run of the processes engine")

    def __exit__(self, kind, error, tb):
        if self.previous is None:
            return False
        signal.signal(signal.SIGTERM, self.previous)
        if kind is Terminated:
            if self.previous is signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGTERM)      # ends this process, as SIGTERM does
            elif callable(self.previous):
                self.previous(signal.SIGTERM, None)
        return False


class _Result:
    """The parent's end of one child's result pipe, read without blocking: the message is
    an 8-byte length and a pickle (`_write_result`)."""

    def __init__(self, conn):
        self.fd = conn.fileno()
        os.set_blocking(self.fd, False)
        self.buf = bytearray()
        self.closed = False

    def read(self):
        """Read what is there now; the message if it is complete, else None."""
        while not self.closed:
            try:
                chunk = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            self.buf += chunk
        if len(self.buf) >= 8:
            (size,) = _FRAME.unpack_from(self.buf)
            if len(self.buf) >= 8 + size:
                with memoryview(self.buf) as view:
                    return pickle.loads(view[8:8 + size])
        return None


def _stopped(children, pending) -> set:
    """Unfinished ranks whose process the operating system has stopped (Linux: state T or t
    in /proc/<pid>/stat), e.g. by SIGSTOP or a debugger."""
    stopped = set()
    for rank in pending:
        try:
            with open(f"/proc/{children[rank].pid}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state in ("T", "t"):
            stopped.add(rank)
    return stopped


def _collect(children, result_conns, status, deadline, timeout, failures="stop"):
    """Wait for every child's result; raise RankError naming the first failure, or a
    deadlock as soon as `hopeless` sees one. Returns the outcomes and, with failures="notify",
    {rank: (its exception, start, time of the failure)}; a rank that dies is failed too."""
    world_size = len(children)
    outcomes = [None] * world_size
    failed = {}
    pending = set(range(world_size))
    results = [_Result(conn) for conn in result_conns]
    started = time.monotonic()
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise timed_out(pending, status, world_size, timeout, _stopped(children, pending))
        objects = {}
        for r in pending:
            objects[results[r].fd] = r
            objects[children[r].sentinel] = r
        ready = wait(list(objects), timeout=min(remaining, CHECK_EVERY))
        if not ready:
            deadlock = hopeless(status, world_size, time.monotonic() - started, "processes")
            if deadlock is not None:
                raise deadlock
            continue
        for handle in ready:
            rank = objects[handle]
            if rank not in pending:
                continue
            message = results[rank].read()
            if message is None:
                if children[rank].is_alive():
                    continue        # the rest of the result is still on its way
                message = results[rank].read()      # all it wrote is in the pipe by now
            if message is None:     # the child is gone and sent no whole result
                children[rank].join(timeout=1)
                code = children[rank].exitcode
                if failures != "notify":
                    raise RankError(rank, f"died (exit code {code}) before returning a result")
                now = time.perf_counter()
                failed[rank] = (RankDied(f"rank {rank} died (exit code {code}) before "
                                         f"returning a result"), now, now)
                status.set(rank, DONE)
            elif message[0] == "error":
                raise rank_failed(rank, message[1], message[2])
            elif message[0] == "failed":      # failures="notify": its peers have been told
                failed[rank] = message[1:]
            else:
                outcomes[rank] = message[1]
            pending.discard(rank)
    return outcomes, failed
