"""Plumbing (hand-written): dsml.comm — the request vocabulary, the communicator and the engines."""
from dsml.comm.api import Comm, RankError, RunResult, SizeOnly
from dsml.comm.run import ENGINES, run

__all__ = ["Comm", "RankError", "RunResult", "SizeOnly", "run", "ENGINES"]
