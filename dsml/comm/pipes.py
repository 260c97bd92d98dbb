"""Plumbing (hand-written): `PipeTransport`, a processes-engine rank's ends of the pipes.

One pipe per ordered pair of ranks, written directly and without blocking by its one sender
(a per-destination backlog when it is full); receives match by (source, tag), with the
small-message path inline, and wait by spinning, then sleeping in poll(). The module
docstring of `dsml.comm.processes` describes the whole engine.
"""
from __future__ import annotations

import os
import select
import time
from collections import deque

import numpy as np

from dsml.comm.driver import (FAILED, NOT_ARRIVED, RECEIVING, RUNNING, MatchingTransport,
                              PeerGone, RankDied, STATUS_FIELDS)
from dsml.comm.frames import (_ACK, _BYE, _FRAME, _HEADS, _RAW, decode_frame, decode_whole,
                              encode_frame, portable)
from dsml.comm.orphans import orphaned
from dsml.comm.segments import Segments

POLL = 1.0                  # s: how often a waiting child checks that its parent is alive
SPIN = 5e-3                 # s: how long a pinned rank's receive polls its pipe before sleeping
YIELD_SPIN = 200e-6         # s: the same without a core of its own (sched_yield between polls)
READ_SIZE = 1 << 18         # bytes asked of a pipe per read


class PipeTransport(MatchingTransport):
    """A rank's ends of the pipes: one in from every peer, one out to every peer."""

    engine = "processes"        # whose α, β, γ "auto" collectives choose by (dsml.comm.costs)

    def __init__(self, rank, status, readers: dict, writers: dict, segments: Segments):
        super().__init__(rank, status)
        self.readers = readers                   # src -> fd (non-blocking)
        self.writers = writers                   # dst -> fd (non-blocking)
        self.dst_of = {fd: dst for dst, fd in writers.items()}
        self.segments = segments
        self.inbuf = {src: bytearray() for src in readers}
        self.inpos = dict.fromkeys(readers, 0)
        self.backlog = {dst: deque() for dst in writers}
        self.pending = set()                     # destinations with a backlog
        self.parent = os.getppid()
        self.finished = set()                    # peers that said goodbye (failures="notify")
        self.polls = {}                          # src -> poll() of a poll object on its pipe
        for src, fd in readers.items():
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            self.polls[src] = poller.poll
        self.state_at = rank * STATUS_FIELDS     # this rank's status record, in self.cells
        # Spin hard only when this rank has a core of its own (pinned): on a core it shares
        # with a peer, spinning would take the time that peer needs to send what we wait
        # for. Without one, give the CPU away between polls (sched_yield), so that a peer
        # that is ready runs at once, and poll again when the scheduler comes back.
        pinned = _pin_to_own_core(rank, len(writers) + 1)
        self.pause = None if pinned else getattr(os, "sched_yield", None)
        self.spin = SPIN if pinned else YIELD_SPIN if self.pause is not None else 0.0

    # sending
    def send(self, dst, tag, payload):
        head = None
        if type(payload) is np.ndarray and payload.flags.c_contiguous:
            # The small-message path: a head cached for this tag, dtype and shape (only
            # arrays below SHM_THRESHOLD have one), then the array's bytes.
            head = _HEADS.get((tag, payload.dtype, payload.shape))
        if head is not None:
            frame = b"".join((head, payload))
        else:
            frame = encode_frame(tag, self.segments.encode(payload, dst, self._make_room))
        self.cells[self.sent_at] += 1        # counted before it can be taken
        if self.segments.returned:
            frame = self._acknowledge(dst) + frame       # one write for both
        if self.pending:                     # a backlog, to dst or another: keep the order
            self._send_frame(dst, frame)
            return
        try:
            written = os.write(self.writers[dst], frame)
        except BlockingIOError:
            written = 0
        except BrokenPipeError:              # dst has gone (the parent reports why)
            return
        if written < len(frame):
            self.backlog[dst].append(memoryview(frame)[written:])
            self.pending.add(dst)

    def _acknowledge(self, dst=None) -> bytes:
        """Tell each peer which of its segments this rank's program is done with; the frame
        for `dst` is returned instead, for the caller to send with its own."""
        for_dst = b""
        for src, names in self.segments.take_returned().items():
            if src == dst:
                for_dst = encode_frame(_ACK, names)
            else:
                self._send_frame(src, encode_frame(_ACK, names))
        return for_dst

    def _send_frame(self, dst, frame):
        if dst in self.pending and not self._flush(dst):
            self.backlog[dst].append(frame)
            return
        written = self._write_some(dst, frame)
        if written is not None and written < len(frame):
            self.backlog[dst].append(memoryview(frame)[written:])
            self.pending.add(dst)

    def _write_some(self, dst, data) -> int | None:
        """Write as much of `data` as the channel to dst takes now, without waiting: the
        number of bytes written, or None if dst is gone (the parent reports why)."""
        try:
            return os.write(self.writers[dst], data)
        except BlockingIOError:
            return 0
        except BrokenPipeError:
            return None

    def _make_room(self, dst, nbytes):
        """No segment for dst is free: read what dst has sent so far (without waiting), so
        that its acknowledgements free ours; its messages go to the stash, in order."""
        if self._fill(dst):
            while True:
                frame = self._parse(dst)
                if frame is None:
                    break
                tag, payload = frame
                self.cells[self.taken_at] += 1
                self.stash(dst, tag, payload)

    def _flush(self, dst) -> bool:
        """Write as much of dst's backlog as the channel takes now; True if it is all out."""
        backlog = self.backlog[dst]
        while backlog:
            data = backlog[0]
            written = self._write_some(dst, data)
            if written is None:
                backlog.clear()
                break
            if written < len(data):
                backlog[0] = data[written:]
                return False
            backlog.popleft()
        self.pending.discard(dst)
        return True

    def send_notice(self, dst, error):
        """A failure notice (failures="notify"), after this rank's earlier frames to dst."""
        self.cells[self.sent_at] += 1
        self._send_frame(dst, encode_frame(FAILED, portable(error)))

    def say_goodbye(self) -> None:
        """This rank's program has returned (failures="notify"): tell every peer, after its
        last message, so that the end of file that follows is not taken for a death."""
        for dst in self.writers:
            self._send_frame(dst, encode_frame(_BYE, None))

    def died(self, src):
        """src's pipe is at its end with no goodbye and no failure notice (failures="notify"):
        src died. The FAILED notice that stands for it, as `_next` returns one; it was never
        sent, so it is not counted as taken either."""
        self.cells[self.taken_at] -= 1
        return (src, FAILED, RankDied(f"rank {src}'s process ended without a result"))

    def gone(self, src) -> bool:
        """True if src's end of file means it died (see `died`)."""
        return self.notify and src not in self.finished and src not in self.failed

    def checkpoint(self):
        """A busy rank checks that its parent is still there (see `orphaned`)."""
        if os.getppid() != self.parent:
            orphaned()

    def finish(self):
        """After the program has returned: deliver what is still in the backlogs."""
        while self.pending:
            self._wait(None)

    # receiving
    def _parse(self, src):
        """The next complete (tag, payload) frame from src already read, or None.
        Acknowledgements are handled here; arrays in shared memory come out as views of
        their segments (see Segments.take)."""
        buf = self.inbuf[src]
        while True:
            pos = self.inpos[src]
            available = len(buf) - pos
            if available < 8:
                return None
            (size,) = _FRAME.unpack_from(buf, pos)
            if available < 8 + size:
                return None
            tag, payload = decode_frame(buf, pos, size)
            pos += 8 + size
            if pos == len(buf):
                buf.clear()
                pos = 0
            self.inpos[src] = pos
            if tag == _ACK:
                for name in payload:
                    self.segments.release(name)
                continue
            if tag == _BYE:
                self.finished.add(src)
                continue
            if type(payload) is not np.ndarray:
                payload = self.segments.decode(payload, src)
            return tag, payload

    def _fill(self, src):
        """Read what src's pipe holds now, without waiting: True if something came, False
        if nothing has, None if src's end is closed (it died)."""
        buf, pos = self.inbuf[src], self.inpos[src]
        if pos:
            del buf[:pos]
            self.inpos[src] = 0
        try:
            chunk = os.read(self.readers[src], READ_SIZE)
        except BlockingIOError:
            return False
        if not chunk:
            return None
        buf += chunk
        return True

    def recv(self, src, tag):
        """MatchingTransport.recv, with the pipe's small-message path inline: a frame that
        arrives whole and alone is decoded straight from what `os.read` returned
        (`decode_whole`); the status record says RECEIVING only once the rank has to wait."""
        early = self.early_payload(src, tag)
        if early is not NOT_ARRIVED:
            return early
        cells, at = self.cells, self.state_at
        waiting = False
        while True:
            frame = self._take(src)
            if frame is None:
                if not waiting:
                    # Peer and tag before the state, so that a report never shows stale ones.
                    cells[at + 1], cells[at + 2], cells[at] = src, tag, RECEIVING
                    waiting = True
                self._await(src)
                continue
            got_tag, payload = frame
            if got_tag == tag or got_tag == FAILED:
                # RUNNING before the count: the parent reads counts, states, counts again
                # (`hopeless`), so it never sees this rank waiting with its message taken.
                if waiting:
                    cells[at] = RUNNING
                cells[self.taken_at] += 1
                if got_tag == tag:
                    return payload
                self.note_failure(src, payload)
                raise PeerGone(src, payload)
            cells[self.taken_at] += 1          # still waiting: a message for later
            self.stash(src, got_tag, payload)

    def _take(self, src):
        """The next (tag, payload) from src: a whole frame already read, else what its pipe
        holds now; None if no whole frame is there yet. When src's process has ended: the
        FAILED notice of `died` if that means it died, else None after a wait (the parent
        ends the run). (It reads without polling first: in an exchange the peer's message is
        usually there by the time the rank's own send is out.)"""
        buf = self.inbuf[src]
        if buf:                              # bytes read before: frames first, in order
            frame = self._parse(src)
            if frame is not None:
                return frame
        try:
            chunk = os.read(self.readers[src], READ_SIZE)
        except BlockingIOError:
            return None
        if not chunk:                        # src's process has ended
            if self.gone(src):
                return self.died(src)[1:]
            self._wait(None)
            return None
        if not buf and len(chunk) > 8 and chunk[8] == _RAW \
                and len(chunk) == 8 + _FRAME.unpack_from(chunk)[0]:
            return decode_whole(chunk)       # one whole raw frame: the common case
        pos = self.inpos[src]
        if pos:
            del buf[:pos]
            self.inpos[src] = 0
        buf += chunk
        return self._parse(src)

    def _await(self, src) -> bool:
        """Wait until src's pipe has something to read (or has ended) and return True: poll
        it without waiting — cheaper than a read that fails — for `spin` seconds, then sleep
        in poll() (`_wait`; False if that returned for another reason). First acknowledge
        segments the program is done with: the peer may want them back."""
        if self.segments.returned:
            self._acknowledge()
        poll = self.polls[src]
        if self.spin:
            # Poll a little before sleeping: a wake-up through the kernel costs tens of µs.
            clock, pause = time.perf_counter, self.pause
            until = clock() + self.spin
            while True:
                if poll(0):
                    return True
                if clock() >= until:
                    break
                if pause is not None:
                    pause()
        elif poll(0):
            return True
        self._wait(self.readers[src])
        return False

    def _next(self, src):
        while True:
            frame = self._take(src)
            if frame is not None:
                return (src,) + frame
            self._await(src)

    def _next_any(self, sources):
        """The next message from any of `sources` (a set of ranks: the peers that a rank's
        activities wait for, week 3), as `_next` waits for one: parse what is already read,
        read what the pipes hold, spin, then sleep in poll() on all of their pipes at once.
        With no source (every activity waits in join) it only waits, writing out backlogs,
        until the parent ends the run."""
        if len(sources) == 1:
            for src in sources:
                return self._next(src)
        sources = sorted(sources)
        closed = set()                # sources whose sender has gone (end of file)
        while True:
            for src in sources:
                frame = self._parse(src)
                if frame is not None:
                    return (src,) + frame
            got = self._fill_any(sources, closed)
            for src in closed:
                if self.gone(src):
                    return self.died(src)
            if not got and self.segments.returned:
                self._acknowledge()
            if not got and self.spin and sources:
                until = time.perf_counter() + self.spin
                pause = self.pause
                while not got and time.perf_counter() < until:
                    if pause is not None:
                        pause()
                    got = self._fill_any(sources, closed)
            if not got:
                self._wait(None, [self.readers[src] for src in sources if src not in closed])

    def _fill_any(self, sources, closed) -> bool:
        """`_fill` every source not known to be closed: True if anything came from any."""
        got = False
        for src in sources:
            if src not in closed:
                filled = self._fill(src)
                if filled:
                    got = True
                elif filled is None:
                    closed.add(src)
        return got

    def _wait(self, fd, more=()):
        """Block until `fd` (if given) or one of the descriptors in `more` is readable, or
        a backlogged pipe has room, writing out backlogs meanwhile; give up after POLL
        seconds to check on the parent."""
        poller = select.poll()
        if fd is not None:
            poller.register(fd, select.POLLIN)
        for other in more:
            poller.register(other, select.POLLIN)
        for dst in self.pending:
            poller.register(self.writers[dst], select.POLLOUT)
        ready = poller.poll(POLL * 1000)
        if not ready and os.getppid() != self.parent:
            orphaned()
        for ready_fd, _ in ready:
            dst = self.dst_of.get(ready_fd)
            if dst is not None and ready_fd != fd:
                self._flush(dst)



def _pin_to_own_core(rank: int, size: int) -> bool:
    """Bind this process to one CPU of those it may use, a different one for each rank, when
    there are enough (Linux); True if it is now bound."""
    if not hasattr(os, "sched_setaffinity"):
        return False
    cpus = sorted(os.sched_getaffinity(0))
    if size > len(cpus):
        return False
    try:
        os.sched_setaffinity(0, {cpus[rank]})
    except OSError:
        return False
    return True
