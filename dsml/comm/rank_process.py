"""Plumbing (hand-written): a processes-engine rank's process, from start to result.

`_child_main` is what each child runs: it sets itself up (dies with its parent, one BLAS
thread, malloc keeps freed memory), opens its ends of the pipes, drives its rank program
(`driver.drive`) and writes its result to the parent (`_write_result`). The module docstring
of `dsml.comm.processes` describes the whole engine.
"""
from __future__ import annotations

import ctypes
import itertools
import os
import pickle
import time

from dsml.comm import orphans
from dsml.comm.blas import one_blas_thread
from dsml.comm.driver import DONE, Status, describe_exception, drive
from dsml.comm.frames import _FRAME, portable
from dsml.comm.orphans import die_with_parent, orphaned
from dsml.comm.pipes import READ_SIZE, PipeTransport
from dsml.comm.segments import Segments

MMAP_THRESHOLD = 1 << 30    # bytes: smaller allocations come from (and go back to) the heap


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse instead of handing it back to the
    kernel; True if it agreed. By default an array of ≥ 128 KiB (the threshold adapts, up to
    32 MiB) is an mmap of its own and its pages are returned when it is freed, so the next
    array of that size page-faults every page again — for a collective that allocates a few
    blocks per step, that cost about as much as the copies themselves. A rank lives for one
    run, so what it keeps is bounded by the most it held at once."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):     # not glibc (macOS, musl): leave malloc alone
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(M_TRIM_THRESHOLD, MMAP_THRESHOLD))


def _write_result(conn, message) -> None:
    """Send the result to the parent: its length (8 bytes) and its pickle, written whole
    (a blocking write; the parent reads it without blocking, within its deadline). If the
    parent has gone, the write fails (every other process closed its copy of the pipe's
    read end) and the rank ends as an orphan."""
    body = pickle.dumps(message, protocol=5)
    head = _FRAME.pack(len(body))
    fd = conn.fileno()
    try:
        os.set_blocking(fd, True)
        if len(body) < READ_SIZE:
            _write_all(fd, memoryview(head + body))
        else:
            _write_all(fd, memoryview(head))
            _write_all(fd, memoryview(body))
    except BrokenPipeError:
        orphaned()


def _write_all(fd, data) -> None:
    while len(data):
        data = data[os.write(fd, data):]


def _child_main(rank, size, program, args, kwargs, channels, status_cells, created, result_conn,
                record_trace, prefix, failures="stop", parent=None, inherited=()):
    die_with_parent(parent)
    for conn in inherited:       # other ranks' result pipes, copied by fork: not ours to hold
        conn.close()
    one_blas_thread()
    keep_freed_memory()
    readers, writers = {}, {}
    for (src, dst), (read_end, write_end) in channels.items():
        if dst == rank:
            write_end.close()
            readers[src] = read_end
        elif src == rank:
            read_end.close()
            writers[dst] = write_end
        else:
            read_end.close()
            write_end.close()
    for conn in itertools.chain(readers.values(), writers.values()):
        os.set_blocking(conn.fileno(), False)
    transport = PipeTransport(rank, Status(status_cells),
                              {src: conn.fileno() for src, conn in readers.items()},
                              {dst: conn.fileno() for dst, conn in writers.items()},
                              Segments(prefix, rank, created))
    transport.notify = failures == "notify"
    orphans._transport = transport         # for `orphans.orphaned`

    try:
        # The hellos of connect() are the common start: a rank is through them only when
        # every rank has reached them (an all-to-all), so no separate barrier is needed.
        outcome = drive(rank, size, program, args, kwargs, transport, record_trace)
        if transport.notify:
            transport.say_goodbye()
        # Protocol 5, as for messages: NumPy's older protocols lose a non-native byte order.
        _write_result(result_conn, ("ok", outcome))
    except Exception as error:
        if failures != "notify":
            _write_result(result_conn, ("error",) + describe_exception(error))
            return
        # failures="notify": tell the peers (after what this rank sent them before), then the
        # parent; the run goes on without this rank.
        failed_at = time.perf_counter()
        started = transport.started if transport.started is not None else failed_at
        error = portable(error)
        transport.notify_peers(size, error)
        transport.status.set(rank, DONE)
        _write_result(result_conn, ("failed", error, started, failed_at))
    except BaseException as error:   # report everything, including KeyboardInterrupt
        _write_result(result_conn, ("error",) + describe_exception(error))
        return
    finally:
        result_conn.close()
    # Reported; now deliver what is still queued for ranks that may yet receive it. The
    # parent kills this process once every rank has reported.
    transport.finish()
