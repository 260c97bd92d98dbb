"""What a run of a real engine may leave behind, and the fixture that checks for it.

A test module that runs real engines imports the fixture, which then runs around each of its
tests (autouse)::

    from leaks import nothing_left_behind  # noqa: F401
"""
from __future__ import annotations

import multiprocessing
import os
import threading

import pytest

HAVE_DEV_SHM = os.path.isdir("/dev/shm")


def our_segments() -> list[str]:
    """Shared-memory segments of processes-engine runs started by this test process (other
    processes on the machine may run their own)."""
    if not HAVE_DEV_SHM:
        return []
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"dsml_{os.getpid()}_"))


def rank_threads() -> list[threading.Thread]:
    """Threads-engine ranks still alive."""
    return [t for t in threading.enumerate() if t.name.startswith("dsml-rank")]


@pytest.fixture(autouse=True)
def nothing_left_behind():
    """After every test, failed runs included: no segment, no child process, no rank thread."""
    assert our_segments() == []
    yield
    assert our_segments() == []
    assert multiprocessing.active_children() == []
    assert rank_threads() == []
