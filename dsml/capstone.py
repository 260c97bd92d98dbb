"""Generated from notebooks/week6_fault_tolerance_and_scaling.ipynb — do not edit; edit the notebook and run `make export`."""

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.compression import Compressor, Dense, ErrorFeedback, PowerSGD, TopK
from dsml.elastic import DOWN, ElasticRank, InjectedCrash, UP, check_membership, elastic_outcome
from dsml.fault import FailureSchedule, young_interval


# -- cell 241
import math

import numpy as np

from dsml.collectives import Group, allreduce
from dsml.comm.failures import PeerFailed
from dsml.comm.run import run
from dsml.sim_support import check_max_events, check_timeout
from dsml.train.models import accuracy
from dsml.utils import add_to_class

COMPRESSORS = ("none", "dense", "topk", "powersgd")
CATEGORIES = ("compute", "communication", "checkpoint", "recovery", "lost")
# A spare's time before it is admitted is its own category: it is not yet part of the job.
LEDGER_CATEGORIES = ("compute", "communication", "checkpoint", "recovery", "spare")


def checkpoint_steps(checkpoint_seconds: float, job_mtbf: float, step_seconds: float) -> int:
    """The Young interval τ = √(2δM) (s of work between checkpoints, for checkpoint cost δ and
    job MTBF M) in whole optimizer steps of `step_seconds` each: max(1, round(τ / step))."""
    if not step_seconds > 0:
        raise ValueError(f"step_seconds must be > 0, got {step_seconds!r}")
    return max(1, round(young_interval(checkpoint_seconds, job_mtbf) / step_seconds))


def make_compressor(name: str, setting: float, shapes) -> Compressor | None:
    """The compressor of a rank's gradient exchange: "none" (None: a float64 ring all-reduce,
    exact), "dense" (fp32 on the wire, ring all-reduce: what a compressor's ratio is measured
    against), "topk" (keep the fraction `setting` of the entries; all-gathered; with error
    feedback) or "powersgd" (rank `setting` factors; all-reduced as they are; with error
    feedback). `shapes`: the gradient's pieces in flat order (PowerSGD compresses each
    matrix)."""
    if name not in COMPRESSORS:
        raise ValueError(f"compressor must be one of {COMPRESSORS}, got {name!r}")
    if name == "none":
        return None
    if name == "dense":
        return Dense()
    if name == "topk":
        return ErrorFeedback(TopK(fraction=setting))
    if setting != int(setting):
        raise ValueError(f"compressor 'powersgd' needs an integer rank, got {setting!r}")
    return ErrorFeedback(PowerSGD(shapes, rank=int(setting)))


# -- cell 243
class CapstoneRank(ElasticRank):
    """One rank of the capstone: elastic data parallelism (rendezvous, membership, restore,
    joins and in-memory checkpoints are ElasticRank's) whose step is a membership check
    through the leader followed by a compressed ring all-reduce among the members. It fails
    at its scheduled time, computes as slowly as its straggler factor says, pays for each
    checkpoint, and keeps a ledger of where its simulated time went."""

    def __init__(self, comm, model, optimizer, X, y, X_test, y_test, steps, batch, lr, members,
                 joins, rule, restore, checkpoint_every, checkpoint_seconds, crash_time,
                 compute_factors, compressor, compressor_setting, seconds_per_sample,
                 detect_seconds, seed, loss):
        # The parent charges no compute itself (seconds_per_sample=0): this class charges it
        # with the straggler factor. No point crashes: ranks fail at scheduled times.
        super().__init__(comm, model, optimizer, X, y, steps, batch, lr, members, joins, rule,
                         restore, checkpoint_every, 0.0, detect_seconds, seed, loss)
        self.X_test, self.y_test = X_test, y_test
        self.sample_seconds, self.checkpoint_seconds = seconds_per_sample, checkpoint_seconds
        self.crash_time, self.factors = crash_time, compute_factors
        self.compressor_name, self.compressor_setting = compressor, compressor_setting
        self.shapes = [w.shape for n, w in self.model.params.items() if n not in self.model.frozen]
        self.compressor, self.compressor_epoch = None, None
        self.ledger = []        # (category, start s, end s, step, epoch) — one per phase
        self.curve = []         # the leader's (time s, steps committed, epoch, accuracy, loss)

    def log(self, category: str, start: float, end: float, step: int = -1) -> None:
        self.ledger.append((category, float(start), float(end), int(step), int(self.epoch)))

    def crash(self, now: float):
        """Fail-stop. The exception carries the ledger and curve, the only trace a dead rank
        leaves for the report."""
        error = InjectedCrash(f"rank {self.me} failed at {now:.6f} s (scheduled at "
                              f"{self.crash_time:.6f} s)")
        error.ledger, error.curve, error.end = self.ledger, self.curve, float(now)
        error.computed_samples = self.computed_samples
        raise error


# -- cell 245
@add_to_class(CapstoneRank)
def check_in(self, samples: int, loss_sum: float):
    """The membership check: each worker sends the leader (step, samples, loss sum) and waits
    for "go" (with every member's sample count and the summed loss) or "rendezvous". A dead
    member is found here (PeerFailed), before any gradient is exchanged. Returns
    (sizes, loss sum) or None (go to a rendezvous)."""
    comm, leader = self.comm, self.members[0]
    if self.me != leader:
        yield comm.send(leader, ("check", self.step, samples, loss_sum), tag=UP)
        try:
            reply = yield comm.recv(leader, tag=DOWN)
        except PeerFailed:
            yield from self.noticed(leader)
            return None
        if reply[0] == "rendezvous":
            self.dead |= set(reply[1])
            return None
        return list(reply[1]), reply[2]
    sizes, total_loss, failed = [samples], loss_sum, []
    for worker in self.members[1:]:
        try:
            message = yield comm.recv(worker, tag=UP)
        except PeerFailed:
            yield from self.noticed(worker)
            failed.append(worker)
            continue
        if message[0] != "check" or message[1] != self.step:
            raise RuntimeError(f"leader {self.me}: rank {worker} sent {str(message)[:40]} in "
                               f"step {self.step}")
        sizes.append(message[2])
        total_loss += message[3]
    workers = [w for w in self.members[1:] if w not in failed]
    if failed:
        for worker in workers:
            yield comm.send(worker, ("rendezvous", sorted(self.dead)), tag=DOWN)
        return None
    for worker in workers:
        yield comm.send(worker, ("go", sizes, total_loss), tag=DOWN)
    return sizes, total_loss


@add_to_class(CapstoneRank)
def exchange_gradient(self, gradient):
    """Sum the members' gradient sums with a ring all-reduce over a Group of the current
    members: plain float64, or compressed with error feedback. The compressor (its residual,
    PowerSGD's warm-started Q) is made afresh at every new membership, so every member —
    a joiner too — starts the epoch with the same compressor state."""
    group = Group(self.comm, self.members)
    try:
        total = yield from self.ring_exchange(group, gradient)
    except PeerFailed as error:
        raise RuntimeError(f"rank {self.me}: rank {error.rank} failed inside the all-reduce "
                           f"of step {self.step}; the capstone lets ranks fail only while "
                           f"computing, which must outlast a message (seconds_per_sample > "
                           f"0)") from error
    return total


# -- cell 246
@add_to_class(CapstoneRank)
def ring_exchange(self, group, gradient):
    if self.compressor_name == "none":
        total = yield from allreduce(group, gradient, algorithm="ring")
        return total
    if self.compressor_epoch != self.epoch:
        self.compressor = make_compressor(self.compressor_name, self.compressor_setting,
                                          self.shapes)
        self.compressor_epoch = self.epoch
    rng = np.random.default_rng([self.seed, self.epoch, self.step])
    total, _ = yield from self.compressor.exchange(group, gradient, rng)
    return total


# -- cell 248
@add_to_class(CapstoneRank)
def train_step(self):
    """One step: local gradient (charged seconds_per_sample × shard × straggler factor),
    membership check, ring all-reduce, apply, and every `every` steps a checkpoint that
    costs checkpoint_seconds. A rank whose scheduled failure time has passed when the step
    starts dies at the end of that compute (its last messages have long arrived, so no
    collective loses a member half-way). Each phase is logged with comm.now() around it.
    Returns None (step taken) or "failure" (go to a rendezvous)."""
    comm, step = self.comm, self.step
    start = yield comm.now()
    doomed = start >= self.crash_time
    samples, vector = yield from self.local_gradient()
    yield comm.compute(self.sample_seconds * samples * float(self.factors[step, self.me]))
    computed = yield comm.now()
    self.log("compute", start, computed, step)
    if doomed:
        self.crash(computed)
    checked = yield from self.check_in(samples, float(vector[-1]))
    agreed = yield comm.now()
    if checked is None:                # the step dies here: detecting it is recovery
        self.log("recovery", computed, agreed, step)
        return "failure"
    sizes, loss_sum = checked
    total = yield from self.exchange_gradient(vector[:-1])
    exchanged = yield comm.now()
    self.log("communication", computed, exchanged, step)
    self.apply(np.append(total, loss_sum), sizes)     # takes the in-memory checkpoint if due
    if self.step % self.every == 0:
        yield comm.compute(self.checkpoint_seconds)
        saved = yield comm.now()
        self.log("checkpoint", exchanged, saved, step)
    if self.me == self.members[0]:     # the leader scores the model (no simulated cost)
        logits = self.model.forward(self.X_test)
        self.curve.append(((yield comm.now()), self.step, self.epoch,
                           accuracy(logits, self.y_test), self.history[-1]["loss"]))
    return None


# -- cell 249
@add_to_class(CapstoneRank)
def run_rank(self):
    """ElasticRank's life (join, then steps and rendezvous until done), with every
    rendezvous logged: a spare's wait to be admitted as "spare", the final agreement as
    "communication", every other (after a failure or to admit a joiner) as "recovery"."""
    comm = self.comm
    outcome = "go on"
    if not self.member:
        start = yield comm.now()
        outcome = yield from self.rendezvous("join")
        self.log("spare", start, (yield comm.now()))
    while outcome == "go on":
        start = yield comm.now()
        if self.step >= self.steps:
            outcome = yield from self.rendezvous("finish")
            self.log("communication", start, (yield comm.now()))
            continue
        if self.joiners_due(self.step):
            outcome = yield from self.rendezvous("join")
            self.log("recovery", start, (yield comm.now()))
            continue
        if (yield from self.train_step()) == "failure":
            start = yield comm.now()
            outcome = yield from self.rendezvous("failure")
            self.log("recovery", start, (yield comm.now()))
    return {"status": "finished" if outcome == "done" else "stopped", "outcome": outcome,
            "rank": self.me, "params": self.model.params, "step": self.step,
            "cursor": self.cursor, "history": self.history, "rendezvous": self.rendezvous_log,
            "epoch": self.epoch, "members": self.members, "dead": sorted(self.dead),
            "computed_samples": self.computed_samples, "ledger": self.ledger,
            "curve": self.curve, "seconds_per_sample": self.sample_seconds,
            "end": (yield comm.now())}


# -- cell 251
def capstone_train(comm, model, optimizer, X, y, X_test, y_test, steps: int, batch: int,
                   lr: float, members=None, joins=None, failures: FailureSchedule | None = None,
                   compute_factors=None, compressor: str = "topk",
                   compressor_setting: float = 0.1, checkpoint_every: int = 4,
                   checkpoint_seconds: float = 0.0, seconds_per_sample: float = 0.0,
                   detect_seconds: float = 0.0, rule: str = "global",
                   restore: str = "checkpoint", seed: int = 0, loss: str = "cross_entropy"):
    """Rank program (run with failures="notify"): elastic data-parallel training (see
    elastic_train for steps, batch, lr, members, joins, rule, restore, checkpoint_every,
    detect_seconds, seed) whose gradient exchange is a ring all-reduce among the current
    members, compressed with error feedback (`compressor` in COMPRESSORS; `compressor_setting`
    the top-k fraction or the PowerSGD rank). Each rank fails at its first time in the
    `failures` schedule (checked at each step start), computes seconds_per_sample × shard ×
    compute_factors[step, rank] simulated seconds per step (array of shape (steps, world);
    default all 1), and pays checkpoint_seconds for each checkpoint. The leader scores the
    committed model on X_test, y_test after each step. Returns elastic's dict plus the rank's
    "ledger" and "curve" (or, for a rank that failed, they ride on its InjectedCrash)."""
    for name, value in (("checkpoint_seconds", checkpoint_seconds),
                        ("seconds_per_sample", seconds_per_sample),
                        ("detect_seconds", detect_seconds)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number ≥ 0 (seconds), got {value!r}")
    make_compressor(compressor, compressor_setting, [(1,)])     # validates the name early
    if compute_factors is None:
        compute_factors = np.ones((max(steps, 1), comm.size))
    compute_factors = np.asarray(compute_factors, dtype=np.float64)
    if compute_factors.ndim != 2 or compute_factors.shape[0] < max(steps, 1) \
            or compute_factors.shape[1] != comm.size:
        raise ValueError(f"compute_factors must have shape (steps, world) = ({steps}, "
                         f"{comm.size}), got {compute_factors.shape}")
    if not np.all(compute_factors > 0):
        raise ValueError("compute_factors must all be > 0 (a rank's slowdown, 1 = nominal)")
    if failures is not None and failures.world_size != comm.size:
        raise ValueError(f"failures schedule covers {failures.world_size} ranks, the run has "
                         f"{comm.size}")
    crash_time = failures.next_failure(comm.rank) if failures is not None else math.inf
    members, joins = check_membership(comm, members, joins, steps, batch, lr, rule, restore,
                                      checkpoint_every)
    rank = CapstoneRank(comm, model, optimizer, X, y, X_test, y_test, steps, batch, lr, members,
                        joins, rule, restore, checkpoint_every, checkpoint_seconds, crash_time,
                        compute_factors, compressor, compressor_setting, seconds_per_sample,
                        detect_seconds, seed, loss)
    if comm.rank not in members and comm.rank not in joins:
        return {"status": "idle", "rank": comm.rank, "ledger": [], "curve": [], "end": 0.0}
    result = yield from rank.run_rank()
    return result


def run_capstone(world: int, network, model, optimizer, X, y, X_test, y_test, steps: int,
                 batch: int, lr: float, max_events: int | None = None,
                 timeout: float | None = None, trace: bool = True, **settings):
    """capstone_train on `world` simulated ranks over `network` (failures="notify"); settings
    are its keywords. `max_events` and `timeout` are the simulator's limits (dsml.sim_support:
    None for the defaults; a longer run passes more), refused before the run if invalid."""
    max_events, timeout = check_max_events(max_events), check_timeout(timeout)
    return run(capstone_train, world, engine="sim", network=network, failures="notify",
               args=(model, optimizer, X, y, X_test, y_test, steps, batch, lr),
               kwargs=settings, trace=trace, max_events=max_events, timeout=timeout)


# -- cell 253
def rank_ledgers(result):
    """Every rank's ledger, end time (s), computed samples and accuracy curve points, from a
    capstone RunResult: a failed rank's ride on its InjectedCrash; idle ranks are left out.
    Returns (ledgers, ends, computed, curves, failures) with failures [(time s, rank)]."""
    ledgers, ends, computed, curves, failures = {}, {}, {}, [], []
    for rank, value in enumerate(result.values):
        if rank in result.failed:
            error = result.failed[rank]
            ledgers[rank], ends[rank] = error.ledger, error.end
            computed[rank] = error.computed_samples
            curves += error.curve
            failures.append((error.end, rank))
        elif value.get("status") != "idle":
            ledgers[rank], ends[rank] = value["ledger"], value["end"]
            computed[rank] = value["computed_samples"]
            curves += value["curve"]
    return ledgers, ends, computed, curves, sorted(failures)


def breakdown_of(ledger, committed, end: float, rank: int) -> dict:
    """One rank's seconds per category (CATEGORIES, plus "spare"): the compute and
    communication of a step attempt whose (step, epoch) is not committed count as "lost".
    RuntimeError if the categories do not add up to the rank's wall time `end`."""
    seconds = dict.fromkeys(CATEGORIES + ("spare",), 0.0)
    for category, start, stop, step, epoch in ledger:
        if category in ("compute", "communication") and step >= 0 \
                and (step, epoch) not in committed:
            category = "lost"
        seconds[category] += stop - start
    if not math.isclose(sum(seconds.values()), end, rel_tol=1e-9, abs_tol=1e-12):
        raise RuntimeError(f"rank {rank}: the ledger covers {sum(seconds.values())} s of its "
                           f"{end} s")
    return seconds


def committed_step_seconds(ledgers, committed) -> float:
    """Rank-seconds spent in steps that were committed and kept: the compute and
    communication (check-in and all-reduce, waits for a straggler included) of every step
    attempt whose (step, epoch) is in the committed history, summed over the ranks."""
    return sum(stop - start for ledger in ledgers.values()
               for category, start, stop, step, epoch in ledger
               if category in ("compute", "communication") and (step, epoch) in committed)


# -- cell 254
def capstone_report(result) -> dict:
    """What a capstone run (a RunResult of capstone_train) did, measured from the ranks'
    ledgers. Returns per-rank "breakdown" {category: s} (CATEGORIES), "ends" (s), "spare" (s
    waiting to be admitted, not part of the job), and the two goodputs:
    "effective_training_time" = rank-seconds in committed steps / rank-seconds in the job
    (the industry's goodput: slow steps count; lost work, checkpoints, recovery and the
    final agreement do not), and
    "mfu" = committed samples × seconds_per_sample / Σ rank-seconds in the job (model-FLOP
    utilisation: a rank at its nominal speed computes a sample in seconds_per_sample, so
    this is the model FLOPs the kept steps needed over what the ranks could have done).
    Also "samples_per_second" (committed samples / run time), "computed_samples"
    {rank: samples}, the committed accuracy "curve" [(time s, steps, accuracy, loss)],
    "members" [(time s, count)], "failures" and "joins" [(time s, rank)]. Raises elastic's
    TrainingLost when no rank finished, RuntimeError if a ledger does not add up."""
    outcome = elastic_outcome(result)
    history = outcome["history"]
    committed = {(record["step"], record["epoch"]) for record in history}
    ledgers, ends, computed, curves, failures = rank_ledgers(result)
    breakdown = {rank: breakdown_of(ledger, committed, ends[rank], rank)
                 for rank, ledger in ledgers.items()}
    spare = {rank: seconds.pop("spare") for rank, seconds in breakdown.items()}
    job_seconds = sum(ends[r] - spare[r] for r in ledgers)
    samples = sum(record["batch"] for record in history)
    per_sample = next(v["seconds_per_sample"] for r, v in enumerate(result.values)
                      if r not in result.failed and "seconds_per_sample" in v)
    curve = sorted({(time, steps, acc, value) for time, steps, epoch, acc, value in curves
                    if (steps - 1, epoch) in committed})
    # The initial members are the ranks whose ledger does not open with a spare's wait.
    initial = [r for r, ledger in ledgers.items() if not ledger or ledger[0][0] != "spare"]
    members, joins = [(0.0, len(initial))], []
    for record in outcome["rendezvous"]:
        members.append((record["end"], len(record["members"])))
        joins += [(record["end"], rank) for rank in record["joined"]]
    return {"breakdown": breakdown, "ends": ends, "spare": spare,
            "effective_training_time": (committed_step_seconds(ledgers, committed) / job_seconds
                                        if job_seconds > 0 else 0.0),
            "mfu": samples * per_sample / job_seconds if job_seconds > 0 else 0.0,
            "job_seconds": job_seconds, "samples": samples, "computed_samples": computed,
            "samples_per_second": samples / result.time,
            "curve": curve, "members": members, "failures": failures,
            "joins": joins, "history": history, "params": outcome["params"],
            "time": result.time}


def time_to_target(curve, target: float) -> float:
    """The first simulated time (s) at which the committed model's accuracy reaches `target`
    (curve as capstone_report gives it); +inf if it never does."""
    if not 0 < target <= 1:
        raise ValueError(f"target must be an accuracy in (0, 1], got {target!r}")
    return next((time for time, _, acc, _ in curve if acc >= target), math.inf)
