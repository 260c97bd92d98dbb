"""Generated from notebooks/week4_async_and_parameter_servers.ipynb — do not edit; edit the notebook and run `make export`."""

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.comm.failures import PeerFailed


# -- cell 8
import copy
import math
from typing import NamedTuple

import numpy as np

from dsml.data_parallel import flatten, shard_bounds, unflatten
from dsml.train.models import loss_and_grads

PUSH, REPLY = 41, 42          # tags: worker → server (a gradient or a first pull), and back


class Update(NamedTuple):
    """One gradient a server applied: whose, the version the worker had read, the version it
    was applied to (staleness = their difference), and when (simulated or measured seconds)."""
    worker: int
    step: int
    read_version: int
    applied_to: int
    time: float

    @property
    def staleness(self) -> int:
        return self.applied_to - self.read_version


class Read(NamedTuple):
    """A reply a server sent a worker to start `step` with, and the slowest worker's clock
    (steps pushed) at that moment — what the SSP bound constrains."""
    worker: int
    step: int
    version: int
    slowest_clock: int
    time: float


def key_ranges(n: int, servers: int) -> list:
    """[start, stop) of each server's keys: the flat parameter vector cut as np.array_split cuts."""
    if servers < 1:
        raise ValueError(f"need at least one server, got {servers}")
    return [shard_bounds(n, servers, s) for s in range(servers)]


def check_bound(bound):
    """The SSP staleness bound: an integer ≥ 0, or math.inf for fully asynchronous."""
    if bound == math.inf:
        return bound
    if isinstance(bound, bool) or not isinstance(bound, (int, np.integer)) or bound < 0:
        raise ValueError(f"the staleness bound s must be an integer ≥ 0 or math.inf, got {bound!r}")
    return int(bound)


# -- cell 9
class ServerState:
    """What one parameter server holds while it serves: its keys' values (`shard`) and version
    (updates applied so far), each worker's clock (steps pushed), the workers waiting for an
    answer, and the log it returns when done."""

    def __init__(self, comm, shard, keys, workers, steps: int, bound, t0: float):
        self.comm, self.shard, self.keys, self.workers = comm, shard, keys, workers
        self.steps, self.bound, self.t0 = steps, bound, t0
        self.version = 0
        self.clock = dict.fromkeys(workers, 0)       # steps each worker has pushed
        self.heard = dict.fromkeys(workers, 0)       # messages from each worker so far
        self.remaining = len(workers) * (steps + 1)  # messages still to come: a pull, then pushes
        self.held = []                               # ssp: workers the bound keeps waiting
        self.step_grads = {}                         # bsp: step -> {worker: gradient}
        self.updates, self.reads, self.failures, self.dropped = [], [], [], []
        self.snapshots = [(0.0, 0, shard.copy())]

    def answer(self, worker, now):
        """Send `worker` the current keys and version, and log that read."""
        self.reads.append(Read(worker, self.clock[worker] + 1, self.version,
                               min(self.clock.values()), now))
        yield self.comm.send(worker, (self.version, self.shard), tag=REPLY)

    def log(self) -> dict:
        return {"updates": self.updates, "reads": self.reads, "snapshots": self.snapshots,
                "keys": self.keys, "failures": self.failures, "dropped": self.dropped}


# -- cell 10
def release_held(state: ServerState, now=None):
    """Answer every held worker the SSP bound now lets go on: one that has pushed its last step,
    or one at most `bound` steps ahead of the slowest worker still running. `now`: the time
    to log, or None to read the clock at each answer."""
    slowest = min(state.clock.values())
    for worker in [w for w in state.held
                   if state.clock[w] == state.steps or state.clock[w] - slowest <= state.bound]:
        state.held.remove(worker)
        if now is None:
            yield from state.answer(worker, (yield state.comm.now()) - state.t0)
        else:
            yield from state.answer(worker, now)


def drop_failed_worker(state: ServerState, failure, mode: str):
    """A worker failed. "bsp" needs every worker's gradient, so that is an error; "ssp" logs it,
    stops waiting for its messages and, since the slowest may have been the one that died,
    answers the held workers the bound now lets go on. Returns False when no worker is left."""
    if mode == "bsp":
        raise RuntimeError(f"server {state.comm.rank}: worker {failure.rank} failed; a "
                           f"synchronous step needs every worker's gradient, so "
                           f"training cannot go on ({failure})") from failure
    state.failures.append((failure.rank, (yield state.comm.now()) - state.t0))
    state.remaining -= state.steps + 1 - state.heard.pop(failure.rank)
    del state.clock[failure.rank]
    if failure.rank in state.held:
        state.held.remove(failure.rank)
    if not state.clock:
        return False
    yield from release_held(state)
    return True


# -- cell 11
def bsp_push(state: ServerState, src, read_version: int, gradient, lr: float, backups: int, now):
    """A BSP gradient: keep it until all workers but `backups` have sent theirs for its step,
    then apply their mean once and answer those workers. A gradient whose step was applied
    without it, or that comes after the last step, is dropped and its worker answered at once."""
    step = read_version + 1                      # the step this gradient is for
    if step <= state.version or state.version == state.steps:
        state.dropped.append((src, step, now))
        yield from state.answer(src, now)
        return
    state.step_grads.setdefault(step, {})[src] = gradient
    if len(state.step_grads[step]) < len(state.workers) - backups:
        return
    arrived = state.step_grads.pop(step)
    senders = [w for w in state.workers if w in arrived]
    state.shard -= lr * np.mean([arrived[w] for w in senders], axis=0)
    state.updates += [Update(w, step, state.version, state.version, now) for w in senders]
    state.version += 1
    state.snapshots.append((now, state.version, state.shard.copy()))
    for w in senders:
        yield from state.answer(w, now)


def ssp_push(state: ServerState, src, step: int, read_version: int, gradient, lr: float,
             staleness_aware: bool, snapshot_every: int, now):
    """An SSP gradient: apply it at once (its staleness is the number of updates applied since
    its worker read), hold the worker, and answer whoever the bound now lets go on."""
    staleness = state.version - read_version
    state.shard -= (lr / max(1, staleness) if staleness_aware else lr) * gradient
    state.updates.append(Update(src, step, read_version, state.version, now))
    state.version += 1
    if state.version % snapshot_every == 0:
        state.snapshots.append((now, state.version, state.shard.copy()))
    state.held.append(src)
    yield from release_held(state, now)


# -- cell 12
def serve(comm, shard, keys, workers, steps: int, lr: float, mode: str = "ssp",
          bound=math.inf, staleness_aware: bool = False, snapshot_every: int = 1,
          backups: int = 0):
    """Rank program body of one parameter server, which owns `shard`, the values of keys
    [start, stop) = `keys` of the flat parameter vector, and serves `workers` (ranks), each of which pulls once, then pushes
    `steps` gradients, each answered with the server's current keys and version.

    mode "bsp": a barrier per step — wait for the gradients of a step from every worker but
    `backups` of them (Chen et al.'s backup workers; 0: from all), apply their mean once and
    answer those workers; a gradient that arrives after its step was applied, or after the last
    step, is dropped (logged in "dropped") and its worker answered at once with the current
    keys. mode "ssp": apply each gradient the moment it arrives (its
    staleness is the number of updates applied since the worker read), and answer a worker only
    while it is at most `bound` steps ahead of the slowest: 0 keeps the workers in lock step,
    math.inf is fully asynchronous. `staleness_aware` divides the learning rate by the
    staleness (at least 1). A worker that fails (run with failures="notify") is logged and
    dropped in "ssp" mode; in "bsp" mode, which needs every worker, it is an error.
    Returns the log: updates, reads, snapshots (time, version, keys), failures (rank, time),
    dropped (worker, step, time)."""
    bound = check_bound(bound)
    if not isinstance(backups, (int, np.integer)) or not 0 <= backups < len(workers):
        raise ValueError(f"backups must be an integer in 0..{len(workers) - 1} (fewer than the "
                         f"{len(workers)} workers), got {backups!r}")
    if mode not in ("bsp", "ssp"):
        raise ValueError(f"unknown mode {mode!r}; choose 'bsp' or 'ssp'")
    start, stop = keys
    state = ServerState(comm, shard, (start, stop), workers, steps, bound, t0=(yield comm.now()))
    while state.remaining:
        try:
            src, (read_version, step, pushed_keys, gradient) = yield comm.recv_any(PUSH)
        except PeerFailed as failure:
            if not (yield from drop_failed_worker(state, failure, mode)):
                break
            continue
        state.remaining -= 1
        now = (yield comm.now()) - state.t0
        if src not in state.clock:
            raise ValueError(f"server {comm.rank}: a push from rank {src}, which is not a worker")
        state.heard[src] += 1
        if gradient is None:                     # the first pull
            yield from state.answer(src, now)
            continue
        if pushed_keys != (start, stop) or np.shape(gradient) != shard.shape:
            raise ValueError(f"server {comm.rank} owns keys [{start}, {stop}); rank {src} pushed "
                             f"{np.size(gradient)} values for keys [{pushed_keys[0]}, "
                             f"{pushed_keys[1]})")
        state.clock[src] += 1
        if mode == "bsp":
            yield from bsp_push(state, src, read_version, gradient, lr, backups, now)
        else:
            yield from ssp_push(state, src, step, read_version, gradient, lr, staleness_aware,
                                snapshot_every, now)
    return state.log()


# -- cell 13
def work(comm, servers, model, ranges, X, y, batch: int, steps: int, seconds_per_step: float,
         rng, straggle_prob: float = 0.0, straggle_factor: float = 1.0, fail_at=None):
    """Rank program body of a worker: pull every server's keys, then `steps` times compute a
    mini-batch gradient (taking `seconds_per_step`, or straggle_factor times that with
    probability straggle_prob), push each server its keys of it, and wait for their answers.
    `fail_at`: the step at which this worker crashes (raises), to study failures.
    Returns the mini-batch losses and the time of each step's push."""
    vector, layout = flatten(model.params)
    versions = [0] * len(servers)
    for s, keys in zip(servers, ranges):
        yield comm.send(s, (None, 0, keys, None), tag=PUSH)
    losses, times = [], []
    for step in range(steps + 1):
        for i, (s, (a, b)) in enumerate(zip(servers, ranges)):
            versions[i], vector[a:b] = yield comm.recv(s, tag=REPLY)
        if step == steps:
            break
        if step == fail_at:
            raise RuntimeError(f"worker {comm.rank} crashed at step {step} (injected)")
        for name, value in unflatten(vector, layout).items():
            model.params[name][...] = value
        chosen = rng.choice(len(X), size=batch, replace=False)
        loss, grads = loss_and_grads(model, X[chosen], y[chosen])
        gradient, _ = flatten(grads)
        slow = straggle_factor if rng.random() < straggle_prob else 1.0
        yield comm.compute(seconds_per_step * slow)
        losses.append(loss)
        times.append((yield comm.now()))
        for i, (s, (a, b)) in enumerate(zip(servers, ranges)):
            yield comm.send(s, (versions[i], step + 1, (a, b), gradient[a:b]), tag=PUSH)
    return {"losses": losses, "times": times}


# -- cell 14
def worker_speeds(workers: int, spread: float, seed: int) -> np.ndarray:
    """Seconds-per-step multipliers of heterogeneous workers: log-normal with σ = spread,
    scaled so the fastest is 1."""
    speeds = np.exp(spread * np.random.default_rng(seed).standard_normal(workers))
    return speeds / speeds.min()


def parameter_server(comm, servers: int, model, X, y, steps: int, lr: float, batch: int = 32,
                     mode: str = "ssp", bound=math.inf, staleness_aware: bool = False,
                     seconds_per_step: float = 0.0, speeds=None, straggle_prob: float = 0.0,
                     straggle_factor: float = 1.0, seed: int = 0, snapshot_every: int = 1,
                     fail_at=None, backups: int = 0):
    """Rank program: ranks 0 … servers−1 are parameter servers, each owning a contiguous range
    of the flat parameter vector of `model` (key_ranges); the other ranks are workers training
    on (X, y). See serve and work. Every rank starts from `model`'s parameters; each worker's
    speed multiplies seconds_per_step (`speeds`, one per worker, default all 1).
    `fail_at` = {worker rank: step} makes those workers crash at that step (run with
    failures="notify" to let the others go on). `backups`: in mode "bsp", how many of the
    slowest workers' gradients each step goes on without (see serve)."""
    bound = check_bound(bound)
    if not 1 <= servers < comm.size:
        raise ValueError(f"need 1 ≤ servers < world size {comm.size}, got servers={servers}")
    vector, _ = flatten(model.params)
    ranges = key_ranges(vector.size, servers)
    if comm.rank < servers:
        a, b = ranges[comm.rank]
        return (yield from serve(comm, vector[a:b].copy(), (a, b), list(range(servers, comm.size)),
                                 steps, lr, mode, bound, staleness_aware, snapshot_every,
                                 backups))
    worker = comm.rank - servers
    speed = 1.0 if speeds is None else float(speeds[worker])
    return (yield from work(comm, list(range(servers)), copy.deepcopy(model), ranges, X, y,
                            batch, steps, seconds_per_step * speed,
                            np.random.default_rng([seed, worker]), straggle_prob, straggle_factor,
                            (fail_at or {}).get(comm.rank)))


def params_at(server_logs, t: float) -> np.ndarray:
    """The flat parameter vector the servers held at time t: each server's last snapshot taken
    at or before t, concatenated in key order."""
    parts = []
    for log in sorted(server_logs, key=lambda log: log["keys"]):
        times = [time for time, _, _ in log["snapshots"]]
        parts.append(log["snapshots"][max(0, np.searchsorted(times, t, side="right") - 1)][2])
    return np.concatenate(parts)


# -- cell 20
from dsml.comm.api import SizeOnly


def push_order(worker: int, servers: int, staggered: bool) -> list:
    """The servers a worker pushes to, in order. Naive: 0, 1, …, S − 1 for every worker, so all
    of them queue at server 0 first. Staggered: worker w starts at server w mod S and goes round,
    so that while S = W each server hears from one worker at a time."""
    first = worker % servers if staggered else 0
    return [(first + i) % servers for i in range(servers)]


def ps_exchange(comm, servers, nbytes, staggered=False, colocated=False):
    """One step's communication of a parameter server: every worker pushes each server its
    share of n bytes (key_ranges) and gets as much back. Dedicated (default): ranks 0 … S − 1
    only serve, the other ranks only work, and a server answers each push as it arrives.
    colocated: every rank is a worker and a server (servers = world size) sharing one port;
    its own shard stays on the machine, and each round it pushes one shard, answers one push,
    and takes one answer."""
    ranges = key_ranges(nbytes, servers)
    if colocated:
        if servers != comm.size:
            raise ValueError(f"co-located: every rank is a server, so servers must equal the "
                             f"world size {comm.size}, got servers={servers}")
        a, b = ranges[comm.rank]
        for s in [s for s in push_order(comm.rank, servers, staggered) if s != comm.rank]:
            yield comm.send(s, SizeOnly(ranges[s][1] - ranges[s][0]), tag=PUSH)
            src, _ = yield comm.recv_any(PUSH)
            yield comm.send(src, SizeOnly(b - a), tag=REPLY)
            yield comm.recv(s, tag=REPLY)
        return
    if not 1 <= servers < comm.size:
        raise ValueError(f"need 1 ≤ servers < world size {comm.size}, got servers={servers}")
    if comm.rank < servers:
        a, b = ranges[comm.rank]
        for _ in range(comm.size - servers):
            src, _ = yield comm.recv_any(PUSH)
            yield comm.send(src, SizeOnly(b - a), tag=REPLY)
        return
    order = push_order(comm.rank - servers, servers, staggered)
    for s in order:
        yield comm.send(s, SizeOnly(ranges[s][1] - ranges[s][0]), tag=PUSH)
    for s in order:
        yield comm.recv(s, tag=REPLY)


# -- cell 26
def sparse_parameter_server(comm, problem, steps: int, lr: float, batch: int, sparse: bool = True,
                            seed: int = 0):
    """Rank program: rank 0 serves w of a SparseProblem (d keys, from 0); every other rank is a
    worker that, `steps` times, pulls w, computes a mini-batch gradient of the least squares
    problem, and pushes it, asynchronously. sparse: the pull names, and the push carries, only
    the keys the mini-batch touches (keys, values); dense: all d. Returns the server's w."""
    if not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be an integer ≥ 1, got {steps!r}")
    if not 1 <= batch <= problem.n:
        raise ValueError(f"batch must be in 1..{problem.n} (the examples), got {batch!r}")
    if comm.rank == 0:
        w = np.zeros(problem.d)
        for _ in range(2 * steps * (comm.size - 1)):       # a pull and a push per worker step
            src, (keys, values) = yield comm.recv_any(PUSH)
            if values is None:                             # a pull: answer the keys asked for
                yield comm.send(src, w.copy() if keys is None else w[keys], tag=REPLY)
            elif keys is None:
                w -= lr * values
            else:
                w[keys] -= lr * values
        return w
    rng = np.random.default_rng([seed, comm.rank])
    for _ in range(steps):
        chosen = rng.choice(problem.n, size=batch, replace=False)
        idx, vals = problem.idx[chosen], problem.vals[chosen]
        keys = np.unique(idx) if sparse else None
        yield comm.send(0, (keys, None), tag=PUSH)
        local = yield comm.recv(0, tag=REPLY)              # w at keys (sparse) or all of w
        where = np.searchsorted(keys, idx) if sparse else idx
        residual = np.einsum("ij,ij->i", vals, local[where]) - problem.y[chosen]
        gradient = np.zeros(len(local))
        np.add.at(gradient, where, residual[:, None] * vals / batch)
        yield comm.send(0, (keys, gradient), tag=PUSH)


# -- cell 38
def serve_cached(comm, shard, workers, steps: int, lr: float):
    """Rank program body of an SSP server for workers with a parameter cache (Ho et al.'s SSP
    table). A push (read_version, gradient) is applied at once and advances its worker's clock;
    a pull (None, needed) is answered (version, keys, slowest clock) as soon as the slowest
    worker's clock is at least `needed`, held until then. Returns the log: updates, snapshots
    (time, version, keys), keys."""
    clock = dict.fromkeys(workers, 0)
    version, updates, held = 0, [], []
    t0 = yield comm.now()
    snapshots = [(0.0, 0, shard.copy())]
    pushes = len(workers) * steps
    while pushes or held:
        src, (read_version, payload) = yield comm.recv_any(PUSH)
        now = (yield comm.now()) - t0
        if read_version is None:                     # a pull: needs the slowest at `payload`
            held.append((src, payload))
        else:                                        # a push
            shard -= lr * payload
            updates.append(Update(src, clock[src] + 1, read_version, version, now))
            version, pushes = version + 1, pushes - 1
            clock[src] += 1
            snapshots.append((now, version, shard.copy()))
        slowest = min(clock.values())
        for worker, needed in [pull for pull in held if pull[1] <= slowest]:
            held.remove((worker, needed))
            yield comm.send(worker, (version, shard, slowest), tag=REPLY)
    return {"updates": updates, "snapshots": snapshots, "keys": (0, shard.size)}


# -- cell 39
def work_cached(comm, model, X, y, batch: int, steps: int, lr: float, bound, seconds_per_step,
                rng, straggle_prob: float = 0.0, straggle_factor: float = 1.0):
    """Rank program body of an SSP worker with a client-side cache: at clock c it computes on
    its cached parameters while they hold every worker's first c − bound clocks (the slowest
    clock the server reported with them), and only otherwise pulls — and waits. Its own
    updates go into its cache at once (read-my-writes). Returns, for each step, (clock, the
    server version its cache came from, whether it pulled)."""
    vector, layout = flatten(model.params)
    version, slowest, used = 0, 0, []            # the cache starts as version 0: all clocks 0
    for c in range(steps):
        pulled = slowest < c - bound
        if pulled:
            yield comm.send(0, (None, c - bound), tag=PUSH)
            version, vector[:], slowest = yield comm.recv(0, tag=REPLY)
        used.append((c, version, pulled))
        for name, value in unflatten(vector, layout).items():
            model.params[name][...] = value
        chosen = rng.choice(len(X), size=batch, replace=False)
        _, grads = loss_and_grads(model, X[chosen], y[chosen])
        gradient, _ = flatten(grads)
        yield comm.compute(seconds_per_step * (straggle_factor if rng.random() < straggle_prob else 1.0))
        yield comm.send(0, (version, gradient), tag=PUSH)
        vector -= lr * gradient                      # read-my-writes
    return used


def ssp_with_cache(comm, model, X, y, steps: int, lr: float, bound, batch: int = 32,
                   seconds_per_step: float = 0.0, speeds=None, straggle_prob: float = 0.0,
                   straggle_factor: float = 1.0, seed: int = 0):
    """Rank program: rank 0 is an SSP server (serve_cached), the others workers with a
    parameter cache (work_cached) training `model` on (X, y) under staleness bound `bound`."""
    bound = check_bound(bound)
    if comm.size < 2:
        raise ValueError(f"need a server and at least one worker, got world size {comm.size}")
    if comm.rank == 0:
        vector, _ = flatten(model.params)
        return (yield from serve_cached(comm, vector.copy(), list(range(1, comm.size)), steps, lr))
    speed = 1.0 if speeds is None else float(speeds[comm.rank - 1])
    return (yield from work_cached(comm, copy.deepcopy(model), X, y, batch, steps, lr, bound,
                                   seconds_per_step * speed, np.random.default_rng([seed, comm.rank - 1]),
                                   straggle_prob, straggle_factor))


def clocks_seen(updates, version: int, workers) -> dict:
    """How many updates of each worker the server's version `version` holds: its first
    `version` applied updates, counted by worker — read from the log, not from any clock table."""
    seen = dict.fromkeys(workers, 0)
    for update in updates[:version]:
        seen[update.worker] += 1
    return seen
