"""Plumbing (hand-written): the α, β, γ a rank's collectives choose their algorithm by
(`algorithm="auto"`, `dsml.collectives.auto`).

Every engine says what one message costs it, so that a collective can pick the algorithm the
α–β–γ model finds cheapest — week 2's selector, run with this engine's numbers:

- **the simulator**: its network's own numbers. An `AlphaBeta` gives α, β, γ; a `Topology` its
  host overhead plus two hops of its slowest link (host → switch → host) for α, the time per
  byte of its slowest link for β, and its γ — a rough summary of a network whose messages cost
  what their route costs, pessimistic where the slow links are few (a two-level cluster's links
  between machines set its ring's time).
- **the real engines**: the file `dsml calibrate` wrote, if the environment variable
  `DSML_NETWORK` names one (measured on your machine: the best choice), else the defaults below,
  measured with `dsml calibrate` on the development machine (docs/measurements.md). They only
  choose an algorithm; a result never depends on them beyond round-off.

A real engine stamps `comm.costs` on each rank's communicator; the simulator runs its ranks in
the caller's thread and names its network for the duration of the run (`simulating`).
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager

# (α s, β s/B, γ s/B) per real engine: `dsml calibrate --engine E` (mpi: under `mpiexec -n 2`),
# two runs each on the 2-core development machine, 2026-12-07 14:54 UTC, rounded
# (docs/measurements.md, "Real against model").
ENGINE_DEFAULTS = {
    "processes": (10e-6, 0.13e-9, 0.01e-9),
    "threads": (45e-6, 0.085e-9, 0.012e-9),
    "mpi": (18.5e-6, 0.26e-9, 0.015e-9),
}
FALLBACK = ENGINE_DEFAULTS["processes"]      # a communicator no engine stamped (a test's stand-in)
ENV = "DSML_NETWORK"

_simulated = threading.local()
_loaded = {}


def network_costs(network) -> tuple:
    """(α, β, γ) that summarise a simulator's network model (see the module docstring)."""
    if hasattr(network, "alpha") and hasattr(network, "beta"):
        return (float(network.alpha), float(network.beta), float(getattr(network, "gamma", 0.0)))
    links = getattr(network, "links", None)
    if links:                          # a Topology: (latency s, s/B) per directed link
        latency = max(lat for lat, _ in links.values())
        per_byte = max(b for _, b in links.values())
        alpha = getattr(network, "overhead", 0.0) + 2 * latency
        return (float(alpha), float(per_byte), float(getattr(network, "gamma", 0.0)))
    return FALLBACK


def engine_costs(engine: str) -> tuple:
    """(α, β, γ) for a real engine: the calibrated file `$DSML_NETWORK` if set, else the
    engine's default. The file is read once per process."""
    path = os.environ.get(ENV)
    if path:
        if path not in _loaded:
            from dsml.net.saved import load_network   # a file error names the variable
            try:
                _loaded[path] = network_costs(load_network(path))
            except ValueError as error:
                raise ValueError(f"{ENV}={path}: {error}") from None
        return _loaded[path]
    return ENGINE_DEFAULTS.get(engine, FALLBACK)


def costs_of(comm) -> tuple:
    """(α, β, γ) for this rank's collectives: what its engine stamped, else the network of the
    simulation running in this thread, else FALLBACK."""
    costs = getattr(comm, "costs", None)
    if costs is None:
        costs = getattr(_simulated, "costs", None) or FALLBACK
    return costs


@contextmanager
def simulating(network):
    """While a simulation over `network` runs in this thread, its ranks' costs are its own."""
    before = getattr(_simulated, "costs", None)
    _simulated.costs = network_costs(network)
    try:
        yield
    finally:
        _simulated.costs = before
