"""Plumbing (hand-written): dsml — Distributed Systems for Machine Learning from first principles.

The package the course builds: `dsml.run` runs a rank program on an engine ("sim",
"threads" or "processes"); `dsml.net` holds network models; `dsml.sim` the discrete-event
simulator.
"""
from dsml import net, sim
from dsml.comm.api import RankError, RunResult, SizeOnly
from dsml.comm.deadlock import DeadlockError
from dsml.comm.run import ENGINES, run

__version__ = "0.1.0"
__all__ = ["run", "ENGINES", "RunResult", "RankError", "DeadlockError", "SizeOnly",
           "net", "sim"]
