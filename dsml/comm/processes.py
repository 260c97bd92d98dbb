"""Plumbing (hand-written): the `processes` engine — rank programs on real OS processes.

Each rank is a child process that drives its rank program's generator. Messages travel
through one inbound `multiprocessing.Queue` per rank; `Queue.put` hands the pickled message
to a feeder thread, so a send never blocks on a full pipe (the eager-send semantics of the
simulator hold here too, and a program that runs on one engine does not deadlock on another).

Start method: "fork" where the platform has it (Linux, macOS), because a rank program
defined in a notebook cell lives in the kernel's `__main__`, which a "spawn"ed child cannot
import. Set DSML_START_METHOD=spawn (or forkserver) to override; then the program and its
arguments must be importable/picklable.

Failure handling: the parent waits on every child's result pipe and process sentinel with
a deadline. A rank that raises sends its traceback; a rank that dies is noticed through its
sentinel; on timeout each unfinished rank's last request is read from a shared status array
("rank 1 waits for a message from rank 0 (tag 0)"). In every case all children are killed
and joined before the error is raised, so nothing is left behind.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from multiprocessing.connection import wait

from dsml.comm.api import (Combine, Comm, Compute, RankError, Recv, RunResult, Send, SendRecv,
                           payload_nbytes, start_rank)
from dsml.sim import Trace

# Per-rank status in shared memory: what the rank is doing, for timeout reports.
_RUNNING, _RECEIVING, _SENDING, _DONE = 0, 1, 2, 3
_STATUS_FIELDS = 3   # state, peer, tag
_HELLO = -1          # tag of the start-up handshake (user tags are ≥ 0)


def start_method() -> str:
    """The multiprocessing start method used (see the module docstring)."""
    method = os.environ.get("DSML_START_METHOD")
    if method:
        if method not in mp.get_all_start_methods():
            raise ValueError(f"DSML_START_METHOD must be one of {mp.get_all_start_methods()}, "
                             f"got {method!r}")
        return method
    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"


class _Transport:
    """A rank's end of the message queues, with a stash for messages that came early."""

    def __init__(self, rank, inboxes, status, deadline):
        self.rank = rank
        self.inboxes = inboxes
        self.status = status
        self.deadline = deadline
        self.early = {}   # (src, tag) -> list of payloads, in arrival order
        size = len(inboxes)
        self.sent = [0] * size       # user messages sent to each peer
        self.received = [0] * size   # user messages taken by a receive from each peer

    def connect(self):
        """Say hello to every peer and hear from every peer, before the clock starts.

        Each Queue starts a feeder thread on its first put; doing that here keeps thread
        start-up out of the first measured message."""
        size = len(self.inboxes)
        for peer in range(size):
            if peer != self.rank:
                self.send(peer, _HELLO, None)
        for peer in range(size):
            if peer != self.rank:
                self.recv(peer, _HELLO)
        self.sent = [0] * size       # the hellos do not count
        self.received = [0] * size

    def set_status(self, state, peer=-1, tag=-1):
        base = self.rank * _STATUS_FIELDS
        self.status[base], self.status[base + 1], self.status[base + 2] = state, peer, tag

    def send(self, dst, tag, payload):
        self.inboxes[dst].put((self.rank, tag, payload))
        self.sent[dst] += 1

    def recv(self, src, tag):
        self.received[src] += 1
        key = (src, tag)
        stash = self.early.get(key)
        if stash:
            return stash.pop(0)
        self.set_status(_RECEIVING, src, tag)
        inbox = self.inboxes[self.rank]
        while True:
            remaining = self.deadline - time.monotonic()
            try:
                # Wake up now and then: the parent enforces the deadline and kills us.
                got_src, got_tag, payload = inbox.get(timeout=max(0.01, min(remaining, 1.0)))
            except queue.Empty:
                continue
            if (got_src, got_tag) == key:
                self.set_status(_RUNNING)
                return payload
            self.early.setdefault((got_src, got_tag), []).append(payload)


def _child_main(rank, size, program, args, kwargs, inboxes, status, barrier, result_conn,
                record_trace, deadline):
    transport = _Transport(rank, inboxes, status, deadline)
    records = [] if record_trace else None
    try:
        gen = start_rank(program, Comm(rank, size), args, kwargs)
        transport.connect()
        barrier.wait(timeout=max(0.0, deadline - time.monotonic()))
        t0 = time.perf_counter()
        value = None
        while True:
            try:
                request = gen.send(value)
            except StopIteration as stop:
                t_end = time.perf_counter()
                transport.set_status(_DONE)
                result_conn.send(("ok", stop.value, t0, t_end, records,
                                  transport.sent, transport.received))
                break
            start = time.perf_counter()
            kind = type(request)
            if kind is Send:
                transport.send(request.dst, request.tag, request.payload)
                value, op, src, dst = None, "send", rank, request.dst
            elif kind is Recv:
                value = transport.recv(request.src, request.tag)
                op, src, dst = "recv", request.src, rank
            elif kind is SendRecv:
                transport.send(request.dst, request.tag, request.payload)
                value = transport.recv(request.src, request.tag)
                op, src, dst = "sendrecv", request.src, request.dst
            elif kind is Compute or kind is Combine:
                value, op, src, dst = None, "compute" if kind is Compute else "combine", -1, -1
            else:
                raise TypeError(f"yielded {request!r}, which is not a request; yield "
                                f"comm.send(...), comm.recv(...), comm.sendrecv(...), "
                                f"comm.compute(...) or comm.combine(...)")
            if records is not None:
                nbytes = payload_nbytes(value) if kind is Recv else getattr(request, "nbytes", 0)
                records.append((rank, op, start, time.perf_counter(), src, dst, nbytes,
                                getattr(request, "tag", 0)))
    except BaseException as error:   # report everything, including KeyboardInterrupt
        result_conn.send(("error", f"{type(error).__name__}: {error}",
                          traceback.format_exc()))
    finally:
        result_conn.close()


def _describe_status(status, rank) -> str:
    base = rank * _STATUS_FIELDS
    state, peer, tag = status[base], status[base + 1], status[base + 2]
    if state == _RECEIVING:
        return f"rank {rank} waits for a message from rank {peer} (tag {tag})"
    if state == _DONE:
        return f"rank {rank} finished"
    return f"rank {rank} is running its program (not waiting on a message)"


def run_processes(program, world_size: int, args=(), kwargs=None, trace: bool = True,
                  timeout: float = 120.0) -> RunResult:
    """Run the rank program on `world_size` real processes; see the module docstring.

    `timeout` (s) bounds the whole run, from the moment the children are started.
    """
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    ctx = mp.get_context(start_method())
    inboxes = [ctx.Queue() for _ in range(world_size)]
    status = ctx.RawArray("q", world_size * _STATUS_FIELDS)
    barrier = ctx.Barrier(world_size)
    deadline = time.monotonic() + timeout
    children, result_conns = [], []
    try:
        for rank in range(world_size):
            parent_end, child_end = ctx.Pipe(duplex=False)
            child = ctx.Process(
                target=_child_main, name=f"dsml-rank-{rank}", daemon=True,
                args=(rank, world_size, program, args, kwargs or {}, inboxes, status, barrier,
                      child_end, trace, deadline))
            child.start()
            child_end.close()
            children.append(child)
            result_conns.append(parent_end)
        results = _collect(children, result_conns, status, deadline, timeout)
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
        for child in children:
            child.join(timeout=10)
        for conn in result_conns:
            conn.close()
        for inbox in inboxes:
            inbox.close()
            inbox.cancel_join_thread()
    _check_all_received(results)
    starts = [r[2] for r in results]
    ends = [r[3] for r in results]
    t0 = min(starts)
    records = None
    if trace:
        records = Trace()
        for r in results:
            for rank, op, start, end, src, dst, nbytes, tag in r[4]:
                records.add(rank, op, start - t0, end - t0, src, dst, nbytes, tag)
        records.rows.sort(key=lambda row: (row[3], row[0]))   # by end time, then rank
    return RunResult(values=[r[1] for r in results], time=max(ends) - t0, trace=records,
                     engine="processes", world_size=world_size,
                     finish_times=[end - t0 for end in ends])


def _collect(children, result_conns, status, deadline, timeout):
    """Wait for every child's result; raise RankError naming the first failure."""
    world_size = len(children)
    results = [None] * world_size
    pending = set(range(world_size))
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            waiting = "\n  ".join(_describe_status(status, r) for r in range(world_size))
            raise RankError(min(pending), f"(and {len(pending)} rank(s) in all) did not finish "
                            f"within the timeout of {timeout:g} s:\n  {waiting}")
        objects = {}
        for r in pending:
            objects[result_conns[r]] = r
            objects[children[r].sentinel] = r
        for ready in wait(list(objects), timeout=remaining):
            rank = objects[ready]
            if rank not in pending:
                continue
            message = _read_result(result_conns[rank])
            if message is None:
                if children[rank].is_alive():
                    continue        # woken without a result from a live child: wait again
                _raise_child_error(rank, children, result_conns)
            if message[0] == "error":
                raise RankError(rank, f"failed: {message[1]}\n--- traceback of rank {rank} ---\n"
                                f"{message[2]}")
            results[rank] = message
            pending.discard(rank)
    return results


def _read_result(conn):
    """The child's result message, or None if there is none (nothing sent, or the child died
    and its end of the pipe closed: poll() is then true, but recv() raises EOFError)."""
    try:
        return conn.recv() if conn.poll() else None
    except (EOFError, OSError):
        return None


def _raise_child_error(rank, children, result_conns):
    message = _read_result(result_conns[rank])
    if message is not None and message[0] == "error":
        raise RankError(rank, f"failed: {message[1]}\n--- traceback of rank {rank} ---\n"
                        f"{message[2]}")
    child = children[rank]
    child.join(timeout=1)
    raise RankError(rank, f"died (exit code {child.exitcode}) before returning a result")


def _check_all_received(results) -> None:
    """Every rank finished: compare what each sent to each peer with what that peer received,
    as the simulator does, so that a message nobody received is an error on every engine."""
    missing = [(src, dst, sent - results[dst][6][src])
               for src, result in enumerate(results) for dst, sent in enumerate(result[5])
               if sent > results[dst][6][src]]
    if missing:
        lines = "\n  ".join(f"rank {src} -> rank {dst}: {n} message(s)" for src, dst, n in missing)
        raise RankError(missing[0][1], "finished without receiving messages sent to it "
                        f"(mismatched peers or tags?):\n  {lines}")
