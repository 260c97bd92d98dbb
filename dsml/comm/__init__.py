"""Plumbing (hand-written): dsml.comm — the request vocabulary, the communicator and the engines."""
from dsml.comm.api import Comm, RankError, RunResult, SizeOnly
from dsml.comm.run import ENGINES, run
# Week 3 adds a second activity per rank (comm.spawn / comm.join); importing the module
# registers its requests with the engines, so every program can use them.
from dsml.comm.activities import Activity
# Week 4 adds a receive from any source (comm.recv_any), registered the same way.
from dsml.comm import any_source  # noqa: F401
# … and failure notices for failures="notify" (dsml.comm.failures).
from dsml.comm import failures  # noqa: F401

__all__ = ["Activity", "Comm", "RankError", "RunResult", "SizeOnly", "run", "ENGINES"]
