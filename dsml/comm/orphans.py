"""Plumbing (hand-written): a processes-engine rank whose parent has gone ends by itself.

Linux sends the rank SIGTERM when its parent dies (`die_with_parent`); SIGTERM, and the
time-based checks of `PipeTransport` elsewhere, end it through `orphaned`, which unlinks the
segments it created first. The module docstring of `dsml.comm.processes` describes the whole
engine.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

from dsml.comm.segments import _forget_attached, _unlink_quietly

ORPHANED = 70               # exit code of a rank whose parent has gone
_transport = None       # this rank's PipeTransport (in a child), for `orphaned`


def orphaned(signum=None, frame=None) -> None:
    """The run is over for this rank without its parent (the parent died, or this rank was
    sent SIGTERM): unlink the segments this rank created — nobody else will once the parent
    is gone — and exit at once. Also SIGTERM's handler in a rank."""
    transport = _transport
    if transport is not None:
        for name in list(transport.segments.owned):
            _unlink_quietly(name)
        _forget_attached(transport.segments.attached)
    os._exit(ORPHANED if signum is None else 128 + signum)


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Ask Linux to send this process SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG),
    and make SIGTERM end it through `orphaned`. Elsewhere only the time-based checks remain
    (`PipeTransport.checkpoint` between requests, and every POLL seconds while waiting).
    The parent (`parent`, its pid; None to skip the check) may have died before the request
    took effect: then end now."""
    signal.signal(signal.SIGTERM, orphaned)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if parent is not None and os.getppid() != parent:
        orphaned()
