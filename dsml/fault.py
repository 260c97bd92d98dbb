"""Generated from notebooks/week6_fault_tolerance_and_scaling.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 8
import bisect
import math
import numbers
from dataclasses import dataclass

import numpy as np

from dsml.collectives import allreduce
from dsml.validate_args import integer, positive_number


def check_positive(name: str, value: float) -> float:
    """A time or a rate that must be a finite number > 0 (seconds unless the name says)."""
    return positive_number(name, value)


def check_nonnegative(name: str, value: float) -> float:
    """A time that may be zero: a finite number ≥ 0 (seconds)."""
    return positive_number(name, value, allow_zero=True)


def check_count(name: str, value: int, minimum: int = 0) -> int:
    """A count: an integer ≥ minimum (not a bool, not a float)."""
    return integer(name, value, minimum)


# -- cell 9
@dataclass(frozen=True)
class ExponentialFailures:
    """Fail-stop crashes of one node with exponential lifetimes of mean `mtbf` seconds.

    Memoryless: a node that has run for an hour is as likely to fail in the next minute as
    a new one. The classic model behind Young's and Daly's formulas.
    """
    mtbf: float

    def __post_init__(self):
        object.__setattr__(self, "mtbf", check_positive("mtbf", self.mtbf))

    def lifetimes(self, rng: np.random.Generator, size) -> np.ndarray:
        """Seconds from (re)start to the next crash, independent draws of shape `size`."""
        return rng.exponential(self.mtbf, size)

    def first_failure_mean(self, nodes: int) -> float:
        """Closed form: the min of `nodes` exponentials of mean M is exponential of mean M/N."""
        return self.mtbf / check_count("nodes", nodes, 1)


@dataclass(frozen=True)
class WeibullFailures:
    """Fail-stop crashes with Weibull lifetimes of mean `mtbf` seconds and `shape` k.

    k < 1 is "infant mortality" (a new or just-repaired node fails early more often; field
    studies of HPC systems fit k ≈ 0.7–0.8), k = 1 is exponential, k > 1 is wear-out. The
    scale is λ = M / Γ(1 + 1/k) so that the mean is M. The min of N such lifetimes is
    Weibull with scale λ·N^(−1/k): its mean is M·N^(−1/k), not M/N unless k = 1.
    """
    mtbf: float
    shape: float

    def __post_init__(self):
        object.__setattr__(self, "mtbf", check_positive("mtbf", self.mtbf))
        object.__setattr__(self, "shape", check_positive("shape", self.shape))

    @property
    def scale(self) -> float:
        return self.mtbf / math.gamma(1 + 1 / self.shape)

    def lifetimes(self, rng: np.random.Generator, size) -> np.ndarray:
        return self.scale * rng.weibull(self.shape, size)

    def first_failure_mean(self, nodes: int) -> float:
        return self.mtbf * check_count("nodes", nodes, 1) ** (-1 / self.shape)


def job_mtbf(mtbf_node: float, nodes: int) -> float:
    """The formula: a job that stops when any of `nodes` independent nodes fails, each with
    exponential failures of mean `mtbf_node` seconds, fails with mean M_node / N seconds."""
    return check_positive("mtbf_node", mtbf_node) / check_count("nodes", nodes, 1)


# -- cell 10
def first_failure_times(model, nodes: int, samples: int, rng: np.random.Generator) -> np.ndarray:
    """Measured: `samples` fresh jobs on `nodes` nodes; each job's first crash (seconds) is
    the earliest of its nodes' sampled lifetimes. Shape (samples,)."""
    nodes = check_count("nodes", nodes, 1)
    samples = check_count("samples", samples, 1)
    return model.lifetimes(rng, (samples, nodes)).min(axis=1)


# -- cell 14
def renewal_failure_times(model, streams: int, horizon: float,
                          rng: np.random.Generator) -> np.ndarray:
    """Crash times (seconds) of `streams` independent nodes (or jobs) over [0, horizon).

    After each crash the node is repaired or replaced at once and draws a fresh lifetime
    from `model`: a renewal process. Returns shape (streams, K), each row sorted, padded with
    +inf after its last crash before `horizon`; every crash before `horizon` is present.
    """
    streams = check_count("streams", streams, 0)
    horizon = check_positive("horizon", horizon)
    expected = horizon / model.mtbf
    block = int(expected + 4 * math.sqrt(expected) + 8)
    times = np.cumsum(model.lifetimes(rng, (streams, block)), axis=1)
    # Rare rows outlive their block; give every row more lifetimes until all pass the horizon.
    while streams and times[:, -1].min() < horizon:
        more = model.lifetimes(rng, (streams, block))
        times = np.concatenate([times, times[:, -1:] + np.cumsum(more, axis=1)], axis=1)
    times[times >= horizon] = np.inf
    width = int(np.isfinite(times).sum(axis=1).max()) if streams else 0
    # Keep one +inf column: a reader past a row's last crash finds +inf, "never again".
    return times[:, :width + 1]


# -- cell 15
class FailureSchedule:
    """When each rank crashes: a sorted list of (time in s, rank) pairs within [0, horizon).

    Built once from a seeded failure model and handed to every rank program, so that a rank
    can ask "when do I fail next?" (`next_failure`) and the runs of every engine see the
    same failures. Iterating gives the (time, rank) pairs in time order.
    """

    def __init__(self, failures, world_size: int, horizon: float):
        self.world_size = check_count("world_size", world_size, 0)
        self.horizon = check_positive("horizon", horizon)
        pairs = sorted((float(time), int(rank)) for time, rank in failures)
        for time, rank in pairs:
            if not 0 <= rank < self.world_size:
                raise ValueError(f"failure of rank {rank}: ranks are 0..{self.world_size - 1}")
            if not 0 <= time < self.horizon:
                raise ValueError(f"failure at time {time} s is outside [0, {self.horizon}) s")
        self.failures = pairs
        self._by_rank = [[] for _ in range(self.world_size)]
        for time, rank in pairs:
            self._by_rank[rank].append(time)

    def __iter__(self):
        return iter(self.failures)

    def __len__(self) -> int:
        return len(self.failures)

    def __getitem__(self, index):
        return self.failures[index]

    def __repr__(self):
        return (f"FailureSchedule({len(self)} failures of {self.world_size} ranks "
                f"over {self.horizon:g} s)")

    def times_of(self, rank: int) -> list[float]:
        """Every crash time of `rank` (seconds, sorted)."""
        return list(self._by_rank[self._check_rank(rank)])

    def next_failure(self, rank: int, after: float = -math.inf) -> float:
        """The first crash of `rank` strictly after time `after` (s); +inf if none is left."""
        times = self._by_rank[self._check_rank(rank)]
        index = bisect.bisect_right(times, after)
        return times[index] if index < len(times) else math.inf

    def first_failure(self) -> tuple[float, int]:
        """(time, rank) of the job's first crash — when a synchronous job stops — or (inf, -1)."""
        return self.failures[0] if self.failures else (math.inf, -1)

    def _check_rank(self, rank: int) -> int:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) \
                or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be an integer in 0..{self.world_size - 1}, got {rank!r}")
        return int(rank)


# -- cell 16
def failure_schedule(ranks: int, mtbf_node: float, horizon: float, rng: np.random.Generator,
                     weibull_shape: float = 1.0) -> FailureSchedule:
    """A seeded schedule of fail-stop crashes of `ranks` nodes over [0, horizon) seconds.

    Each rank fails independently with mean time between failures `mtbf_node` (s):
    exponential lifetimes when `weibull_shape` is 1, else Weibull of that shape and the same
    mean. A crashed rank is replaced at once (it may fail again later). The job as a whole
    (any rank failing) then sees failures at rate N / mtbf_node.
    """
    ranks = check_count("ranks", ranks, 0)
    weibull_shape = check_positive("weibull_shape", weibull_shape)
    if weibull_shape == 1.0:
        model = ExponentialFailures(mtbf_node)
    else:
        model = WeibullFailures(mtbf_node, weibull_shape)
    times = renewal_failure_times(model, ranks, horizon, rng)
    pairs = [(float(time), rank) for rank in range(ranks)
             for time in times[rank] if np.isfinite(time)]
    return FailureSchedule(pairs, ranks, horizon)


# -- cell 19
@dataclass(frozen=True)
class Stragglers:
    """Slow ranks: each rank runs at a persistent speed drawn once (log-normal slowdown
    factor with log-standard-deviation `slowdown_sigma`, median 1), and at each step may
    stall for a long delay (probability `long_delay_probability`, exponential length of mean
    `long_delay_mean` seconds) — a GC pause, a throttled GPU, a noisy neighbour."""
    slowdown_sigma: float = 0.05
    long_delay_probability: float = 0.01
    long_delay_mean: float = 1.0

    def __post_init__(self):
        check_nonnegative("slowdown_sigma", self.slowdown_sigma)
        check_nonnegative("long_delay_mean", self.long_delay_mean)
        probability = self.long_delay_probability
        if isinstance(probability, bool) or not isinstance(probability, numbers.Real) \
                or not 0 <= probability <= 1:
            raise ValueError(f"long_delay_probability must be in [0, 1], got {probability!r}")

    def step_times(self, step_time: float, steps: int, ranks: int,
                   rng: np.random.Generator) -> np.ndarray:
        """Seconds of compute of each rank at each step, shape (steps, ranks): the nominal
        `step_time` times the rank's slowdown, plus any long delay."""
        step_time = check_positive("step_time", step_time)
        steps = check_count("steps", steps, 0)
        ranks = check_count("ranks", ranks, 0)
        slowdown = rng.lognormal(0.0, self.slowdown_sigma, ranks)
        stalls = rng.random((steps, ranks)) < self.long_delay_probability
        delays = rng.exponential(self.long_delay_mean, (steps, ranks)) * stalls
        return step_time * slowdown[np.newaxis, :] + delays


def synchronous_steps(comm, step_times: np.ndarray):
    """Rank program: each step, compute for this rank's time, then wait for every rank (an
    all-reduce of one number, as data parallelism's gradient all-reduce would). Returns the
    time (s) at which each step ended on this rank."""
    ends = []
    for step in range(step_times.shape[0]):
        yield comm.compute(float(step_times[step, comm.rank]))
        yield from allreduce(comm, np.zeros(1), algorithm="ring")
        ends.append((yield comm.now()))
    return ends


# -- cell 23
def young_interval(checkpoint_cost: float, mtbf: float) -> float:
    """Young (1974): the checkpoint interval (s of work between checkpoints) that minimizes
    the expected waste to first order, τ = √(2δM), for checkpoint cost δ and MTBF M (s)."""
    checkpoint_cost = check_positive("checkpoint_cost", checkpoint_cost)
    mtbf = check_positive("mtbf", mtbf)
    return math.sqrt(2 * checkpoint_cost * mtbf)


def daly_interval(checkpoint_cost: float, mtbf: float) -> float:
    """Daly (2006): the higher-order optimum of the expected wall time under exponential
    failures, τ = √(2δM)·[1 + ⅓·√(δ/(2M)) + (1/9)·(δ/(2M))] − δ for δ < 2M, else τ = M
    (a checkpoint so costly that one per MTBF is all that pays). Seconds in, seconds out."""
    checkpoint_cost = check_positive("checkpoint_cost", checkpoint_cost)
    mtbf = check_positive("mtbf", mtbf)
    if checkpoint_cost >= 2 * mtbf:
        return mtbf
    ratio = checkpoint_cost / (2 * mtbf)
    return (math.sqrt(2 * checkpoint_cost * mtbf) * (1 + math.sqrt(ratio) / 3 + ratio / 9)
            - checkpoint_cost)


def expected_wall_time(work: float, interval, checkpoint_cost: float, restart_cost: float,
                       mtbf: float):
    """Closed form (Daly 2006, exponential failures of mean M, crashes possible during work,
    checkpoints and restarts): a segment of s seconds that must run crash-free takes on
    average M·e^(R/M)·(e^(s/M) − 1). The job is ⌈W/τ⌉ segments: full ones of τ + δ and a
    last one of the remaining work without a checkpoint. Seconds; `interval` may be an array."""
    work = check_positive("work", work)
    checkpoint_cost = check_nonnegative("checkpoint_cost", checkpoint_cost)
    restart_cost = check_nonnegative("restart_cost", restart_cost)
    mtbf = check_positive("mtbf", mtbf)
    interval = np.asarray(interval, dtype=float)
    if not (np.all(interval > 0) and np.all(np.isfinite(interval))):
        raise ValueError(f"interval must be finite and > 0 (s), got {interval}")
    full = np.ceil(work / interval) - 1
    remainder = work - full * interval

    def segment(seconds):
        return mtbf * math.exp(restart_cost / mtbf) * np.expm1(seconds / mtbf)
    total = full * segment(interval + checkpoint_cost) + segment(remainder)
    return float(total) if total.ndim == 0 else total


def waste_fraction(work: float, wall_time):
    """The fraction of wall time not spent on useful work: 1 − W / T_wall."""
    return 1 - work / np.asarray(wall_time, dtype=float)


# -- cell 27
def check_job(work, interval, snapshot_cost, write_time, restart_cost) -> tuple:
    return (check_positive("work", work), check_positive("interval", interval),
            check_nonnegative("checkpoint_cost", snapshot_cost),
            check_nonnegative("write_time", write_time),
            check_nonnegative("restart_cost", restart_cost))


def background_write(comm, seconds: float):
    """Activity: the write of a snapshot from host memory to storage, beside training."""
    yield comm.compute(seconds)
    return (yield comm.now())


def restart(comm, schedule, crash: float, restart_cost: float, spent: dict):
    """Rank program body: restart after the crash at time `crash`, taking `restart_cost` s
    (added to spent["restart"]); a crash during the restart starts it again. Returns (the
    time of the last crash, how many crashes struck during the restart)."""
    again = 0
    while True:
        crash_next = schedule.next_failure(comm.rank, after=crash)
        if crash + restart_cost <= crash_next:
            yield comm.compute(restart_cost)
            spent["restart"] += restart_cost
            return crash, again
        yield comm.compute(crash_next - crash)
        spent["restart"] += crash_next - crash
        crash, again = crash_next, again + 1


# -- cell 28
def checkpointed_job(comm, work: float, interval: float, checkpoint_cost: float,
                     restart_cost: float, schedule: FailureSchedule, write_time: float = 0.0):
    """Rank program: `work` s of training, checkpointed every `interval` s of work (not after
    the last piece), crashing when `schedule` says. A checkpoint blocks for `checkpoint_cost`
    s; with `write_time` > 0 the write to storage runs beside training as an activity, one in
    flight, durable once written. A crash loses all since the last durable checkpoint, then a
    restart (`restart`). Returns seconds of `wall` (before joining writes still running),
    `work` (redone pieces again), `checkpoint` (blocked), `lost`, `restart`, `rolled_back`,
    and the counts `checkpoints`, `failures`."""
    work, interval, checkpoint_cost, write_time, restart_cost = check_job(
        work, interval, checkpoint_cost, write_time, restart_cost)
    spent = {"work": 0.0, "checkpoint": 0.0, "lost": 0.0, "restart": 0.0, "rolled_back": 0.0}
    checkpoints = failures = 0
    durable = progress = 0.0      # work saved on storage / work done since the start
    pending = None                # (activity, progress it saves, time it will be written)
    writes = []                   # every write started: all are joined before returning
    crash = -math.inf             # the crash this rank last recovered from
    now = yield comm.now()
    while progress < work:
        piece = min(interval, work - progress)
        last = piece == work - progress
        wait = max(0.0, pending[2] - (now + piece)) if pending is not None and not last else 0.0
        end = now + piece + (0.0 if last else wait + checkpoint_cost)
        crash_next = schedule.next_failure(comm.rank, after=crash)
        if end <= crash_next:
            yield comm.compute(piece)
            spent["work"] += piece
            progress += piece
            if not last:
                blocked_from = yield comm.now()
                if pending is not None:
                    yield comm.join(pending[0])   # the previous write must finish first
                    durable = pending[1]
                yield comm.compute(checkpoint_cost)
                if write_time > 0:
                    activity = yield comm.spawn(background_write(comm, write_time))
                    writes.append(activity)
                    snapshot_end = yield comm.now()
                    pending = (activity, progress, snapshot_end + write_time)
                else:
                    durable, pending = progress, None
                checkpoints += 1
                spent["checkpoint"] += (yield comm.now()) - blocked_from
            now = yield comm.now()
            continue
        # Crash during this piece, its wait or its checkpoint: keep only what is on storage.
        yield comm.compute(crash_next - now)
        spent["lost"] += crash_next - now
        if pending is not None and pending[0].done:
            durable = pending[1]                   # that write had finished before the crash
        spent["rolled_back"] += progress - durable     # finished work that must be redone
        pending, progress, failures = None, durable, failures + 1
        crash, again = yield from restart(comm, schedule, crash_next, restart_cost, spent)
        failures += again
        now = yield comm.now()
    wall = now
    for activity in writes:                       # a rank joins its activities before returning
        yield comm.join(activity)
    return dict(spent, wall=wall, checkpoints=checkpoints, failures=failures)


# -- cell 29
# The same state machine for many runs at once, with NumPy: a speed path in plumbing
# (dsml/fault_batch.py), held equal to checkpointed_job run by run in the check below.
from dsml.fault_batch import simulate_checkpointed_jobs


# -- cell 49
LLAMA3_INTERRUPTIONS = {
    "days": 54, "gpus": 16384, "total": 466, "planned": 47, "unexpected": 419,
    "hardware_share_of_unexpected": 0.78,
}
"""Llama 3 (Llama Team, "The Llama 3 Herd of Models", 2024, §3.3.4): job interruptions in
a 54-day snapshot of pre-training on up to 16,384 H100 GPUs; about 78 % of the unexpected
ones attributed to confirmed or suspected hardware issues; effective training time > 90 %."""

LLAMA3_UNEXPECTED_BY_COMPONENT = (
    # (component, category, interruptions) — Table 5 of the Llama 3 paper
    ("Faulty GPU", "GPU", 148),
    ("GPU HBM3 Memory", "GPU", 72),
    ("Software Bug", "Dependency", 54),
    ("Network Switch/Cable", "Network", 35),
    ("Host Maintenance", "Unplanned Maintenance", 32),
    ("GPU SRAM Memory", "GPU", 19),
    ("GPU System Processor", "GPU", 17),
    ("NIC", "Host", 7),
    ("NCCL Watchdog Timeouts", "Unknown", 7),
    ("Silent Data Corruption", "GPU", 6),
    ("GPU Thermal Interface + Sensor", "GPU", 6),
    ("SSD", "Host", 3),
    ("Power Supply", "Host", 3),
    ("Server Chassis", "Host", 2),
    ("IO Expansion Board", "Host", 2),
    ("Dependency", "Dependency", 2),
    ("CPU", "Host", 2),
    ("System Memory", "Host", 2),
)
"""Root causes of the 419 unexpected interruptions, Table 5 of the Llama 3 paper (2024),
counts as transcribed at https://glennklockwood.com/garden/component-reliability (the full
table) and checked against https://www.datacenterdynamics.com/en/news/meta-report-details-
hundreds-of-gpu-and-hbm3-related-interruptions-to-llama-3-training-run (faulty GPU 148,
HBM3 72, SRAM 19, GPU system processor 17, network switch/cable 35, CPU 2). The counts sum
to 419. The paper's printed percentage for "Faulty GPU" (30.1 %) is not 148/419 (35.3 %);
the other rows match count/419, so we keep the counts and compute shares from them."""

OPT175B_RESTARTS = {"days": 60, "gpus": 992, "manual_restarts": 35, "automatic_restarts": 70}
"""OPT-175B (Zhang et al. 2022, and its logbook): on 992 A100 GPUs, at least 35 manual and
70+ automatic restarts in about two months (60 days taken for "about two months"); the
counts are lower bounds."""


def interruption_statistics(interruptions: int, days: float, gpus: int) -> dict:
    """From a count of job interruptions over `days` days on `gpus` GPUs: interruptions per
    day, the job's MTBF (s), and the per-GPU MTBF (s) it implies if every GPU fails
    independently with exponential failures (job MTBF = M_gpu / N, so M_gpu = N · M_job)."""
    interruptions = check_count("interruptions", interruptions, 1)
    days = check_positive("days", days)
    gpus = check_count("gpus", gpus, 1)
    job_seconds = days * 86400.0
    mtbf_job = job_seconds / interruptions
    return {"per_day": interruptions / days, "mtbf_job": mtbf_job, "mtbf_gpu": mtbf_job * gpus}
